"""The ``pipeline`` command: parse arguments, configure logging, call the library, map exit codes.

Exit codes: 0 all done · 1 finished with failures · 2 configuration error · 3 run aborted (server
unreachable, key refused, model not served, database in use) · 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import anyio
import orjson
import typer

from pipeline.errors import ConfigError, FatalRunError
from pipeline.job import JobSpec, load_job
from pipeline.loader import load_file
from pipeline.local import LocalServer, LocalServerOptions, run_job_locally, vllm_launch
from pipeline.logs import configure_logging
from pipeline.progress import LiveProgress, LogProgress, ProgressReporter, format_duration
from pipeline.runner import RunOptions, RunSummary, run_job
from pipeline.status import JobStatus, job_status
from pipeline.store import open_database

EXIT_CONFIG = 2
EXIT_ABORTED = 3
EXIT_INTERRUPTED = 130

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


def _event_loop_options() -> dict[str, Any]:
    """uvloop where it is installed: the event loop is the client's hot path at thousands of req/s."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def _setup_logging(log_format: LogFormat, log_level: str) -> None:
    json_lines = log_format is LogFormat.JSON or (log_format is LogFormat.AUTO and not sys.stderr.isatty())
    configure_logging(json_lines=json_lines, level=log_level)


def _fail(error: Exception, code: int) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(code)


def _load_job_or_exit(job: Path, database: Path | None = None) -> JobSpec:
    try:
        spec = load_job(job)
    except ConfigError as error:
        raise _fail(error, EXIT_CONFIG) from error
    return spec.with_overrides(database=database.resolve() if database else None)


def _parse_renames(pairs: list[str]) -> dict[str, str]:
    renames = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise _fail(ConfigError(f"--rename {pair!r}: expected FILE_COLUMN=NAME"), EXIT_CONFIG)
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
    replace: Annotated[bool, typer.Option(help="Replace the table instead of adding new ids.")] = False,
    file_format: Annotated[str | None, typer.Option("--format", help="Override the file type.")] = None,
    database: DatabaseOption = None,
) -> None:
    """Load records into the job's DuckDB source table; ids already there are skipped."""
    spec = _load_job_or_exit(job, database)
    renames = _parse_renames(rename or [])
    try:
        connection = open_database(spec.database, memory_limit=spec.duckdb_memory_limit)
        try:
            report = load_file(
                connection, spec, file, table=table, rename=renames, replace=replace, file_format=file_format
            )
        finally:
            connection.close()
    except ConfigError as error:
        raise _fail(error, EXIT_CONFIG) from error
    except FatalRunError as error:
        raise _fail(error, EXIT_ABORTED) from error
    typer.echo(
        f"loaded {report.inserted:,} of {report.rows_in_file:,} records from {file} into table "
        f"{report.table} of {spec.database}"
        + (f" ({report.skipped:,} ids were already there)" if report.skipped else "")
    )


@app.command()
def run(
    job: JobArgument,
    limit: Annotated[int | None, typer.Option(min=1, help="Extract at most this many records.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Override the job's concurrency.")] = None,
    retry_failed: Annotated[bool, typer.Option(help="Also retry records that failed permanently.")] = False,
    endpoint: Annotated[str | None, typer.Option(help="Override endpoint.base_url.")] = None,
    model: Annotated[str | None, typer.Option(help="Override the model name.")] = None,
    timeout: Annotated[float | None, typer.Option(min=1, help="Override request_timeout_s.")] = None,
    local: Annotated[bool, typer.Option(help="Start the bundled local vLLM server for this run.")] = False,
    database: DatabaseOption = None,
    progress: Annotated[
        Display, typer.Option(help="auto: a live bar on a terminal, log lines otherwise.")
    ] = Display.AUTO,
    log_format: LogFormatOption = LogFormat.AUTO,
    log_level: LogLevelOption = "info",
) -> None:
    """Extract every record not done yet; safe to interrupt and run again."""
    _setup_logging(log_format, log_level)
    spec = _load_job_or_exit(job, database).with_overrides(
        concurrency=concurrency, base_url=endpoint, model=model, request_timeout_s=timeout
    )
    reporter: ProgressReporter = (
        LiveProgress()
        if progress is Display.BAR or (progress is Display.AUTO and sys.stderr.isatty())
        else LogProgress()
    )
    options = RunOptions(limit=limit, retry_failed=retry_failed, handle_signals=True, progress=reporter)
    try:
        if local or spec.endpoint.is_local:
            summary = anyio.run(run_job_locally, spec, options, backend_options=_event_loop_options())
        else:
            summary = anyio.run(run_job, spec, options, backend_options=_event_loop_options())
    except ConfigError as error:
        raise _fail(error, EXIT_CONFIG) from error
    except FatalRunError as error:
        raise _fail(error, EXIT_ABORTED) from error
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _print_summary(summary)
    raise typer.Exit(summary.exit_code)


def _print_summary(summary: RunSummary) -> None:
    if summary.run_id is None:
        typer.echo(f"nothing to do: every record is done or failed permanently ({summary.database})")
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
    query = f"SELECT record_id, extracted FROM {summary.results_table} LIMIT 5"
    typer.echo(
        'look:     python -c "import duckdb; '
        f"duckdb.connect('{summary.database}', read_only=True).sql('{query}').show()\""
    )


@app.command()
def status(
    job: JobArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    database: DatabaseOption = None,
) -> None:
    """Done / failed / pending, and the rate and ETA of the last run."""
    spec = _load_job_or_exit(job, database)
    try:
        report = job_status(spec)
    except ConfigError as error:
        raise _fail(error, EXIT_CONFIG) from error
    if as_json:
        typer.echo(orjson.dumps(_status_dict(report), default=str).decode())
        return
    typer.echo(_status_text(report))


def _status_dict(report: JobStatus) -> dict[str, Any]:
    return {
        "database": report.database,
        "source_records": report.source_records,
        "done": report.done,
        "failed": report.failed,
        "pending": report.pending,
        "last_run": report.last_run,
        "rate_per_min": report.rate_per_min,
        "eta_s": report.eta_s,
        "live": report.live,
    }


def _status_text(report: JobStatus) -> str:
    if report.live is not None:
        live = report.live
        return (
            f"{report.database} is held by a running `pipeline run` "
            f"(pid {live.get('pid')}, run {live.get('run_id')}):\n"
            f"  done {live.get('done')}, failed {live.get('failed')}, in flight {live.get('in_flight')}, "
            f"remaining {live.get('remaining')}\n"
            f"  {live.get('records_per_min')} records/min, {live.get('output_tokens_per_s')} output tok/s, "
            f"ETA {format_duration(live.get('eta_s'))}"
        )
    failed_total = sum(report.failed.values())
    failed_detail = ", ".join(f"{name} {count}" for name, count in report.failed.items())
    lines = [
        f"database: {report.database}",
        f"records:  {report.source_records}",
        f"done:     {report.done}",
        f"failed:   {failed_total}" + (f" ({failed_detail})" if failed_detail else ""),
        f"pending:  {report.pending}",
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


@app.command()
def sim(
    port: Annotated[int, typer.Option(help="0 picks a free port.")] = 8000,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    model: Annotated[str, typer.Option(help="The model name it serves.")] = "sim-model",
    profile: Annotated[
        str | None,
        typer.Option(help="Calibrated engine: gpt-oss-120b, nemotron-super-49b, nemotron-nano-9b."),
    ] = None,
    speed: Annotated[
        float, typer.Option(min=0.001, help="Time compression of the engine (50: 50x faster).")
    ] = 1.0,
    max_num_seqs: Annotated[
        int | None, typer.Option(min=1, help="Override the profile's --max-num-seqs.")
    ] = None,
    kv_cache_tokens: Annotated[
        int | None, typer.Option(min=1, help="Override the profile's KV cache.")
    ] = None,
    latency: Annotated[float, typer.Option(help="Without a profile: seconds per request.")] = 0.0,
    seconds_per_token: Annotated[float, typer.Option(help="Without a profile: seconds per token.")] = 0.0,
    jitter: Annotated[float, typer.Option(min=0, max=1, help="± fraction of the fixed delay.")] = 0.0,
    seed: Annotated[int, typer.Option()] = 0,
    max_model_len: Annotated[int, typer.Option()] = 131072,
    api_key: Annotated[str | None, typer.Option(help="Require this bearer key.")] = None,
    reasoning_field: Annotated[
        str, typer.Option(help="reasoning (vLLM ≥ 0.10) or reasoning_content.")
    ] = "reasoning",
    fault_server_error: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    fault_reset: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    fault_hang: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    fault_invalid_json: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    fault_schema_invalid: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    fault_length: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    fault_context_length: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
) -> None:
    """Serve a vLLM-like OpenAI-compatible simulator (for tests, benchmarks and dry runs)."""
    import asyncio

    from pipeline.sim import Faults, SimConfig, run_sim
    from pipeline.sim.profiles import PROFILES

    faults = Faults(
        server_error=fault_server_error,
        reset=fault_reset,
        hang=fault_hang,
        invalid_json=fault_invalid_json,
        schema_invalid=fault_schema_invalid,
        length=fault_length,
        context_length=fault_context_length,
    )
    if profile is not None and profile not in PROFILES:
        raise _fail(ConfigError(f"--profile {profile!r}: one of {', '.join(PROFILES)}"), EXIT_CONFIG)
    config = SimConfig(
        model=model,
        profile=profile,
        speed=speed,
        max_num_seqs=max_num_seqs,
        kv_cache_tokens=kv_cache_tokens,
        latency_s=latency,
        seconds_per_token=seconds_per_token,
        jitter=jitter,
        seed=seed,
        max_model_len=max_model_len,
        api_key=api_key,
        reasoning_field=reasoning_field,
        faults=faults,
    )

    def ready(url: str) -> None:
        typer.echo(f"serving {model} at {url}")
        sys.stdout.flush()

    asyncio.run(run_sim(config, host, port, on_ready=ready))


@app.command("serve-local")
def serve_local(
    port: Annotated[int | None, typer.Option(help="Default: a free port.")] = None,
    kv_cache_gib: Annotated[float, typer.Option(min=0.5, help="vLLM's KV cache, in GiB.")] = 3.0,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Requests vLLM runs at once.")] = 32,
    log_format: LogFormatOption = LogFormat.AUTO,
) -> None:
    """Start the bundled local vLLM server, print its URL, and serve until Ctrl-C."""
    _setup_logging(log_format, "info")
    options = LocalServerOptions(port=port, kv_cache_gib=kv_cache_gib, max_num_seqs=max_num_seqs)
    try:
        anyio.run(_serve_until_signal, options)
    except FatalRunError as error:
        raise _fail(error, EXIT_ABORTED) from error
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None


async def _serve_until_signal(options: LocalServerOptions) -> None:
    launch = await vllm_launch(options)
    async with LocalServer(launch) as server:
        typer.echo(f"serving {server.model} at {server.base_url}")
        sys.stdout.flush()
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return


def main() -> None:
    app()
