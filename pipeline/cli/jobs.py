"""Commands on a job: load, run, status."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import anyio
import orjson
import typer

from pipeline.cli.common import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    DatabaseOption,
    Display,
    JobArgument,
    LogFormat,
    LogFormatOption,
    LogLevelOption,
    VariantOption,
    app,
    event_loop_options,
    exit_code_for,
    fail,
    load_job_or_exit,
    setup_logging,
)
from pipeline.errors import PERMANENT_FAILURE_CLASSES, ConfigError, FailureClass, FatalRunError
from pipeline.job.spec import JobSpec
from pipeline.job.variants import prompt_file_changes
from pipeline.reports.failures import class_names, parse_failure_classes
from pipeline.reports.status import JobStatus, job_status
from pipeline.run.progress import LiveProgress, LogProgress, ProgressReporter, format_duration
from pipeline.run.runner import RunOptions, RunSummary, run_job, run_job_locally
from pipeline.source.db import open_database
from pipeline.source.loader import LoadReport, load_file
from pipeline.source.versions import StaleCause, parse_causes

# Transient failures are retried by every run, so --class takes only the others.
FAILURE_CLASSES = class_names(PERMANENT_FAILURE_CLASSES)


def _parse_renames(pairs: list[str]) -> dict[str, str]:
    renames = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise fail(ConfigError(f"--rename {pair!r}: expected FILE_COLUMN=NAME"), EXIT_CONFIG)
        renames[old] = new
    return renames


@app.command()
def load(
    file: Annotated[Path, typer.Argument(help="CSV, TSV, JSONL/NDJSON, JSON or Parquet file.")],
    job: Annotated[Path, typer.Option("--job", help="The job whose database and source table to fill.")],
    table: Annotated[str | None, typer.Option(help="Target table (default: the job's source.table).")] = None,
    rename: Annotated[
        list[str] | None, typer.Option(help="Rename a column: FILE_COLUMN=NAME (repeatable).")
    ] = None,
    replace: Annotated[
        bool, typer.Option(help="Make the table equal to the file (ids not in it are removed).")
    ] = False,
    file_format: Annotated[str | None, typer.Option("--format", help="Override the file type.")] = None,
    database: DatabaseOption = None,
) -> None:
    """Load records into the job's DuckDB source table: new ids are added, changed rows updated."""
    spec = load_job_or_exit(job, database)
    renames = _parse_renames(rename or [])
    try:
        connection = open_database(spec.database, memory_limit=spec.duckdb_memory_limit)
        try:
            report = load_file(
                connection, spec, file, table=table, rename=renames, replace=replace, file_format=file_format
            )
        finally:
            connection.close()
    except FatalRunError as error:
        raise fail(error, exit_code_for(error)) from error
    typer.echo(_load_text(report, file, spec.database, replace))


def _load_text(report: LoadReport, file: Path, database: Path, replace: bool) -> str:
    text = (
        f"loaded {report.rows_in_file:,} records from {file} into table {report.table} of {database}: "
        f"{report.inserted:,} new, {report.updated:,} updated, {report.unchanged:,} unchanged"
    )
    if replace and report.removed:
        text += (
            f", {report.removed:,} removed (their results stay; `pipeline status` counts them as orphaned)"
        )
    return text


RetryClassOption = Annotated[
    list[str] | None,
    typer.Option(
        "--class",
        help=f"With --retry-failed or --only-failed: only this failure class (repeatable): "
        f"{', '.join(FAILURE_CLASSES)}.",
    ),
]


@app.command()
def run(
    job: JobArgument,
    limit: Annotated[int | None, typer.Option(min=1, help="Extract at most this many records.")] = None,
    concurrency: Annotated[
        str | None,
        typer.Option(help="Override the concurrency of every endpoint: a number, or auto (adaptive)."),
    ] = None,
    retry_failed: Annotated[bool, typer.Option(help="Also retry records that failed permanently.")] = False,
    only_failed: Annotated[
        bool, typer.Option(help="Retry failed records (all, or --class) and take no new ones.")
    ] = False,
    retry_class: RetryClassOption = None,
    redo_stale: Annotated[
        str | None,
        typer.Option(
            metavar="[CAUSES]",
            help="Also redo results made by an older version of the job: every cause, or only "
            "those listed (prompt,schema,model,settings,unknown). Changed content is always redone.",
        ),
    ] = None,
    sample: Annotated[
        int | None, typer.Option(min=1, help="Only records of a fixed random sample of N source records.")
    ] = None,
    seed: Annotated[int, typer.Option(help="The seed of --sample: the same seed, the same records.")] = 0,
    variant: VariantOption = None,
    endpoint: Annotated[str | None, typer.Option(help="Override endpoint.base_url.")] = None,
    model: Annotated[str | None, typer.Option(help="Override the model name.")] = None,
    prompt_file: Annotated[
        Path | None,
        typer.Option(
            help="Override prompt keys from a YAML file (system, user, examples...), or the "
            "system prompt from any other file's text."
        ),
    ] = None,
    timeout: Annotated[float | None, typer.Option(min=1, help="Override request_timeout_s.")] = None,
    grace: Annotated[
        float | None, typer.Option(min=0, help="Seconds requests in flight get after SIGINT/SIGTERM.")
    ] = None,
    stall_warning: Annotated[
        float | None, typer.Option(min=1, help="Warn after this many seconds without an answer.")
    ] = None,
    stall_abort: Annotated[
        float | None, typer.Option(min=1, help="End the run (exit 5) after this many seconds without one.")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Serve Prometheus metrics on this port.")
    ] = None,
    metrics_textfile: Annotated[
        Path | None, typer.Option(help="Keep a Prometheus textfile here (node_exporter).")
    ] = None,
    local: Annotated[bool, typer.Option(help="Start the bundled local vLLM server for this run.")] = False,
    database: DatabaseOption = None,
    progress: Annotated[
        Display, typer.Option(help="auto: a live bar on a terminal, log lines otherwise.")
    ] = Display.AUTO,
    log_format: LogFormatOption = LogFormat.AUTO,
    log_level: LogLevelOption = "info",
) -> None:
    """Extract every record not done yet; safe to interrupt and run again."""
    setup_logging(log_format, log_level)
    spec = _run_spec(
        job,
        database,
        variant,
        concurrency=concurrency,
        base_url=endpoint,
        model=model,
        prompt=prompt_file,
        request_timeout_s=timeout,
        shutdown_grace_s=grace,
        stall_warning_s=stall_warning,
        stall_abort_s=stall_abort,
    )
    reporter: ProgressReporter = (
        LiveProgress()
        if progress is Display.BAR or (progress is Display.AUTO and sys.stderr.isatty())
        else LogProgress()
    )
    options = RunOptions(
        limit=limit,
        retry_failed=retry_failed or bool(retry_class),
        retry_classes=_failure_classes(retry_class or [], only_failed),
        only_failed=only_failed,
        redo_stale=_redo_causes(redo_stale, only_failed),
        sample=sample,
        seed=seed,
        handle_signals=True,
        progress=reporter,
        metrics_port=metrics_port,
        metrics_textfile=metrics_textfile,
    )
    runner = run_job_locally if local or spec.endpoint.is_local else run_job
    try:
        summary = anyio.run(runner, spec, options, backend_options=event_loop_options())
    except FatalRunError as error:
        raise fail(error, exit_code_for(error)) from error
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _print_summary(summary, job)
    raise typer.Exit(summary.exit_code)


def _run_spec(job: Path, database: Path | None, variant: str | None, **overrides: Any) -> JobSpec:
    """The job as the variant and the command-line options make it (exit 2 on a bad one)."""
    spec = load_job_or_exit(job, database, variant)
    try:
        if overrides.get("prompt") is not None:
            overrides["prompt"] = prompt_file_changes(overrides["prompt"])
        return spec.with_overrides(**overrides)
    except ConfigError as error:
        raise fail(error, EXIT_CONFIG) from error


def _redo_causes(value: str | None, only_failed: bool) -> frozenset[StaleCause]:
    if value is None:
        return frozenset()
    if only_failed:
        error = ConfigError("--only-failed retries failures and nothing else: drop --redo-stale or it")
        raise fail(error, EXIT_CONFIG)
    try:
        return parse_causes([] if value == "all" else [value], "--redo-stale")
    except ConfigError as error:
        raise fail(error, EXIT_CONFIG) from error


def _failure_classes(names: list[str], only_failed: bool) -> frozenset[FailureClass]:
    # A plain run retries transient failures anyway; --only-failed may ask for them alone.
    allowed = frozenset(FailureClass) if only_failed else PERMANENT_FAILURE_CLASSES
    try:
        return frozenset(parse_failure_classes(names, allowed=allowed))
    except ConfigError as error:
        raise fail(error, EXIT_CONFIG) from error


def _print_summary(summary: RunSummary, job: Path) -> None:
    if summary.run_id is None:
        typer.echo(f"nothing to do: every record is done or failed permanently ({summary.database})")
        _print_stale_kept(summary, job)
        return
    minutes = summary.records_per_s * 60
    tokens = summary.output_tokens / summary.elapsed_s if summary.elapsed_s else 0.0
    typer.echo(
        f"run {summary.run_id} {summary.status}: {summary.done:,} done, {summary.failed:,} failed "
        f"of {summary.pending_at_start:,} in {format_duration(summary.elapsed_s)} "
        f"({minutes:,.1f} records/min, {tokens:,.0f} output tok/s)"
    )
    typer.echo(f"results:  table {summary.results_table} in {summary.database}")
    if summary.failed:
        typer.echo(f"failures: table {summary.failures_table} (`pipeline run --retry-failed` retries them)")
    _print_stale_kept(summary, job)
    query = f"SELECT record_id, extracted FROM {summary.results_table} LIMIT 5"
    typer.echo(
        'look:     python -c "import duckdb; '
        f"duckdb.connect('{summary.database}', read_only=True).sql('{query}').show()\""
    )


def _print_stale_kept(summary: RunSummary, job: Path) -> None:
    if not summary.stale_kept:
        return
    total = summary.stale_kept.get("total", 0)
    causes = ", ".join(
        f"{cause} {count:,}" for cause, count in summary.stale_kept.items() if cause != "total"
    )
    typer.echo(
        f"stale:    {total:,} results were made by an older version of the job ({causes}); "
        f"kept as they are: `pipeline run {job} --redo-stale` redoes them"
    )


@app.command()
def status(
    job: JobArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    database: DatabaseOption = None,
    variant: VariantOption = None,
) -> None:
    """Done / failed / pending, and the rate and ETA of the last run."""
    spec = load_job_or_exit(job, database, variant)
    try:
        report = job_status(spec)
    except ConfigError as error:
        raise fail(error, EXIT_CONFIG) from error
    if as_json:
        typer.echo(orjson.dumps(_status_dict(report), default=str).decode())
        return
    typer.echo(_status_text(report))


def _status_dict(report: JobStatus) -> dict[str, Any]:
    return {
        "database": report.database,
        "variant": report.variant,
        "source_records": report.source_records,
        "done": report.done,
        "failed": report.failed,
        "pending": report.pending,
        "content_changed": report.content_changed,
        "stale": report.stale,
        "orphaned": report.orphaned,
        "tokens_per_done": report.tokens_per_done,
        "grounding": report.grounding,
        "last_run": report.last_run,
        "rate_per_min": report.rate_per_min,
        "eta_s": report.eta_s,
        "live": report.live,
    }


def _endpoint_lines(endpoints: object) -> str:
    """One line per endpoint of a live run (with several, or an adaptive one)."""
    if not isinstance(endpoints, dict) or not endpoints:
        return ""
    lines = []
    for name, numbers in endpoints.items():
        state = "up" if numbers.get("up") else "held (gone or stalled)"
        lines.append(
            f"\n  {name}: {state}, limit {numbers.get('limit')}, in flight {numbers.get('in_flight')}, "
            f"{numbers.get('answers')} answers, {numbers.get('outages')} outages"
        )
    return "".join(lines)


def _stale_lines(report: JobStatus) -> list[str]:
    lines = []
    if report.stale.get("total"):
        causes = ", ".join(
            f"{cause} {count}" for cause, count in report.stale.items() if count and cause != "total"
        )
        lines.append(f"stale:    {report.stale['total']} ({causes}; `pipeline run --redo-stale` redoes them)")
    if report.orphaned:
        lines.append(f"orphaned: {report.orphaned} results whose record is no longer in the source")
    for path, share in report.grounding.items():
        lines.append(
            f"grounded: {path}: {share['found']:,.0f} of {share['values']:,.0f} values found in the text "
            f"({share['share']:.0%})"
        )
    tokens = report.tokens_per_done
    if tokens:
        lines.append(
            f"tokens:   {tokens['prompt']:,.0f} prompt + {tokens['completion']:,.0f} output "
            f"({tokens['reasoning']:,.0f} reasoning) per done record, every attempt counted"
        )
    return lines


def _status_text(report: JobStatus) -> str:
    if report.live is not None:
        live = report.live
        return (
            f"{report.database} is held by a running `pipeline run` "
            f"(pid {live.get('pid')}, run {live.get('run_id')}):\n"
            f"  done {live.get('done')}, failed {live.get('failed')}, in flight {live.get('in_flight')}, "
            f"remaining {live.get('remaining')}\n"
            f"  {live.get('records_per_min')} records/min, {live.get('output_tokens_per_s')} output tok/s, "
            f"ETA {format_duration(live.get('eta_s'))}" + _endpoint_lines(live.get("endpoints"))
        )
    failed_total = sum(report.failed.values())
    failed_detail = ", ".join(f"{name} {count}" for name, count in report.failed.items())
    changed = f" ({report.content_changed} with changed content)" if report.content_changed else ""
    lines = [
        f"database: {report.database}" + (f" (variant {report.variant})" if report.variant != "main" else ""),
        f"records:  {report.source_records}",
        f"done:     {report.done}",
        f"failed:   {failed_total}" + (f" ({failed_detail})" if failed_detail else ""),
        f"pending:  {report.pending}{changed}",
        *_stale_lines(report),
    ]
    run = report.last_run
    if run:
        rate = report.rate_per_min
        lines.append(
            f"last run: #{run['run_id']} {run['status']}, started {run['started_at']:%Y-%m-%d %H:%M:%S %Z}, "
            f"{run['done']} done, {run['failed']} failed"
            + (f", {rate:,.1f} records/min, ETA for pending {format_duration(report.eta_s)}" if rate else "")
        )
    return "\n".join(lines)
