"""The Typer app and what every command shares: exit codes, options, logging, error output."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.errors import AlreadyRunningError, ConfigError, FatalRunError, StalledRunError
from pipeline.job import JobSpec, load_job
from pipeline.logs import configure_logging

# Exit codes, for cron and systemd (README "Exit codes").
EXIT_FAILURES = 1  # completed, but some records failed (see `pipeline failures`)
EXIT_CONFIG = 2  # the job, an input or the model name is wrong: nothing was sent
EXIT_ABORTED = 3  # the run stopped early (server down, database error): run again to resume
EXIT_ALREADY_RUNNING = 4  # another `pipeline run` of this job holds it
EXIT_STALLED = 5  # the stall watchdog ended the run (operations.stall_abort_s)
EXIT_INTERRUPTED = 130  # SIGINT/SIGTERM: finished records were saved

app = typer.Typer(
    help="Concurrency-first batch LLM extraction: DuckDB in, validated JSON out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Display(StrEnum):
    AUTO = "auto"
    BAR = "bar"
    LOG = "log"


class LogFormat(StrEnum):
    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


JobArgument = Annotated[Path, typer.Argument(help="The job spec, e.g. jobs/linkedin.yaml.")]

DatabaseOption = Annotated[
    Path | None, typer.Option(help="Use this DuckDB file instead of the job's `database` (e.g. for a trial).")
]

LogFormatOption = Annotated[LogFormat, typer.Option(help="auto: JSON lines unless stderr is a terminal.")]

LogLevelOption = Annotated[str, typer.Option(help="debug, info, warning or error.")]


def event_loop_options() -> dict[str, Any]:
    """uvloop where it is installed: the event loop is the client's hot path at thousands of req/s."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def setup_logging(log_format: LogFormat, log_level: str) -> None:
    json_lines = log_format is LogFormat.JSON or (log_format is LogFormat.AUTO and not sys.stderr.isatty())
    configure_logging(json_lines=json_lines, level=log_level)


def fail(error: Exception, code: int) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(code)


def exit_code_for(error: FatalRunError) -> int:
    if isinstance(error, ConfigError):
        return EXIT_CONFIG
    if isinstance(error, AlreadyRunningError):
        return EXIT_ALREADY_RUNNING
    if isinstance(error, StalledRunError):
        return EXIT_STALLED
    return EXIT_ABORTED


def load_job_or_exit(job: Path, database: Path | None = None) -> JobSpec:
    try:
        spec = load_job(job)
    except ConfigError as error:
        raise fail(error, EXIT_CONFIG) from error
    return spec.with_overrides(database=database.resolve() if database else None)
