"""pipeline: concurrency-first batch LLM extraction — DuckDB in, validated JSON out, resumable.

The public API is the names below (pinned by tests/test_public_api.py); docs/architecture.md shows
the packages behind them. Each command is one call: ``run_job`` (async; ``run_job_sync`` from code
that is not, a notebook's included), ``load_source``, ``job_status``, ``failure_report``,
``export_results``, ``evaluate`` (``evaluate_pair`` for two variants), ``compare_variants`` and
``runs_report``; the pages of ``--html``: ``review_page``, ``compare_page`` and ``runs_page`` (the
readers block: DuckDB). The CLI calls exactly these."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what mypy and editors see; at run time each name is imported when first used
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
    from pipeline.reports.comparison import CompareReport, CompareSettings, compare_variants
    from pipeline.reports.evaluation import EvalReport, EvalSettings, evaluate
    from pipeline.reports.export import ExportFormat, ExportReport, export_results
    from pipeline.reports.failures import FailureReport, failure_report
    from pipeline.reports.pages import compare_page, review_page, runs_page
    from pipeline.reports.paired_evaluation import PairedEvalReport, evaluate_pair
    from pipeline.reports.reading import Sample
    from pipeline.reports.review_page import ReviewPage
    from pipeline.reports.runs_report import RunsReport, runs_report
    from pipeline.reports.status import JobStatus, job_status
    from pipeline.run.blocking import run_job_sync
    from pipeline.run.runner import RunOptions, RunStatus, RunSummary, run_job, run_job_locally
    from pipeline.source.loader import LoadReport
    from pipeline.store.opening import load_source

# Where each public name lives. Importing ``pipeline`` (or any module under it, which imports this
# package first) loads none of them: ``pipeline.source.db`` must not pay for the OpenAI client, rich or
# rapidfuzz. PEP 562: a name is imported on first access, then kept in the module's namespace.
_PUBLIC: dict[str, str] = {
    "BadOutputError": "pipeline.errors",
    "ConfigError": "pipeline.errors",
    "DatabaseLockedError": "pipeline.errors",
    "EmptyOutputError": "pipeline.errors",
    "FailureClass": "pipeline.errors",
    "FatalRunError": "pipeline.errors",
    "InvalidJSONError": "pipeline.errors",
    "PermanentRecordError": "pipeline.errors",
    "PipelineError": "pipeline.errors",
    "RecordError": "pipeline.errors",
    "SchemaInvalidError": "pipeline.errors",
    "ServerUnreachableError": "pipeline.errors",
    "TransientError": "pipeline.errors",
    "TruncatedError": "pipeline.errors",
    "JobSpec": "pipeline.job.spec",
    "load_job": "pipeline.job.spec",
    "ReviewPage": "pipeline.reports.review_page",
    "CompareReport": "pipeline.reports.comparison",
    "CompareSettings": "pipeline.reports.comparison",
    "compare_variants": "pipeline.reports.comparison",
    "EvalReport": "pipeline.reports.evaluation",
    "EvalSettings": "pipeline.reports.evaluation",
    "evaluate": "pipeline.reports.evaluation",
    "ExportFormat": "pipeline.reports.export",
    "ExportReport": "pipeline.reports.export",
    "export_results": "pipeline.reports.export",
    "FailureReport": "pipeline.reports.failures",
    "failure_report": "pipeline.reports.failures",
    "compare_page": "pipeline.reports.pages",
    "review_page": "pipeline.reports.pages",
    "runs_page": "pipeline.reports.pages",
    "PairedEvalReport": "pipeline.reports.paired_evaluation",
    "evaluate_pair": "pipeline.reports.paired_evaluation",
    "Sample": "pipeline.reports.reading",
    "RunsReport": "pipeline.reports.runs_report",
    "runs_report": "pipeline.reports.runs_report",
    "JobStatus": "pipeline.reports.status",
    "job_status": "pipeline.reports.status",
    "run_job_sync": "pipeline.run.blocking",
    "RunOptions": "pipeline.run.runner",
    "RunStatus": "pipeline.run.runner",
    "RunSummary": "pipeline.run.runner",
    "run_job": "pipeline.run.runner",
    "run_job_locally": "pipeline.run.runner",
    "LoadReport": "pipeline.source.loader",
    "load_source": "pipeline.store.opening",
}

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


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
