"""pipeline: concurrency-first batch LLM extraction — DuckDB in, validated JSON out, resumable.

The public API is the names below (pinned by tests/test_public_api.py); docs/architecture.md shows
the packages behind them. Each command is one call: ``run_job`` (async; ``run_job_sync`` from code
that is not, a notebook's included), ``load_source``, ``job_status``, ``failure_report``,
``export_results``, ``evaluate`` (``evaluate_pair`` for two variants), ``compare_variants`` and
``runs_report``; the pages of ``--html``: ``review_page``, ``compare_page`` and ``runs_page`` (the
readers block: DuckDB). The CLI calls exactly these."""

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
from pipeline.quality.review_page import ReviewPage
from pipeline.reports.comparison import CompareReport, CompareSettings, compare_variants
from pipeline.reports.evaluation import EvalReport, EvalSettings, evaluate
from pipeline.reports.export import ExportFormat, ExportReport, export_results
from pipeline.reports.failures import FailureReport, failure_report
from pipeline.reports.pages import compare_page, review_page, runs_page
from pipeline.reports.paired_evaluation import PairedEvalReport, evaluate_pair
from pipeline.reports.reading import Sample
from pipeline.reports.runs_report import RunsReport, runs_report
from pipeline.reports.status import JobStatus, job_status
from pipeline.run.blocking import run_job_sync
from pipeline.run.runner import RunOptions, RunStatus, RunSummary, run_job, run_job_locally
from pipeline.source.loader import LoadReport, load_source

__all__ = [
    "BadOutputError",
    "CompareReport",
    "CompareSettings",
    "ConfigError",
    "DatabaseLockedError",
    "EmptyOutputError",
    "EvalReport",
    "EvalSettings",
    "ExportFormat",
    "ExportReport",
    "FailureClass",
    "FailureReport",
    "FatalRunError",
    "InvalidJSONError",
    "JobSpec",
    "JobStatus",
    "LoadReport",
    "PairedEvalReport",
    "PermanentRecordError",
    "PipelineError",
    "RecordError",
    "ReviewPage",
    "RunOptions",
    "RunStatus",
    "RunSummary",
    "RunsReport",
    "Sample",
    "SchemaInvalidError",
    "ServerUnreachableError",
    "TransientError",
    "TruncatedError",
    "compare_page",
    "compare_variants",
    "evaluate",
    "evaluate_pair",
    "export_results",
    "failure_report",
    "job_status",
    "load_job",
    "load_source",
    "review_page",
    "run_job",
    "run_job_locally",
    "run_job_sync",
    "runs_page",
    "runs_report",
]
