"""pipeline: concurrency-first batch LLM extraction — DuckDB in, validated JSON out, resumable.

The public API is the names below (pinned by tests/test_public_api.py); docs/architecture.md shows
the packages behind them."""

from pipeline.errors import (
    BadOutputError,
    ConfigError,
    DatabaseLockedError,
    EmptyOutputError,
    FailureClass,
    FatalRunError,
    InvalidJSONError,
    PermanentRecordError,
    PipelineError,
    RecordError,
    SchemaInvalidError,
    ServerUnreachableError,
    TransientError,
    TruncatedError,
)
from pipeline.job.spec import JobSpec, load_job
from pipeline.reports.status import JobStatus, job_status
from pipeline.run.runner import RunOptions, RunStatus, RunSummary, run_job, run_job_locally
from pipeline.source.loader import LoadReport, load_file

__all__ = [
    "BadOutputError",
    "ConfigError",
    "DatabaseLockedError",
    "EmptyOutputError",
    "FailureClass",
    "FatalRunError",
    "InvalidJSONError",
    "JobSpec",
    "JobStatus",
    "LoadReport",
    "PermanentRecordError",
    "PipelineError",
    "RecordError",
    "RunOptions",
    "RunStatus",
    "RunSummary",
    "SchemaInvalidError",
    "ServerUnreachableError",
    "TransientError",
    "TruncatedError",
    "job_status",
    "load_file",
    "load_job",
    "run_job",
    "run_job_locally",
]
