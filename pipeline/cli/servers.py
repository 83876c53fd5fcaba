"""Commands that serve or measure a real server: serve-local, bench (``sim`` is :mod:`pipeline.cli.sim`)."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.common import (
    LogFormat,
    LogFormatOption,
    app,
    fail,
    load_job_or_exit,
    run_or_exit,
    setup_logging,
)
from pipeline.cli.logs import configure_logging
from pipeline.errors import ConfigError
from pipeline.wording import counted

# The local server (HTTP clients) and the bench's modules (prometheus parser, matplotlib) load when their
# command runs (see pipeline.cli).
if TYPE_CHECKING:
    from pipeline.bench import BenchOptions, SweepResult
    from pipeline.local import LocalServerOptions


@app.command("serve-local")
def serve_local(
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Default: a free port.")] = None,
    kv_cache_gib: Annotated[float, typer.Option(min=0.5, help="vLLM's KV cache, in GiB.")] = 3.0,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Requests vLLM runs at once.")] = 32,
    log_format: LogFormatOption = LogFormat.AUTO,
) -> None:
    """Start the bundled local vLLM server, print its URL, and serve until Ctrl-C."""
    import anyio

    from pipeline.local import LocalServerOptions

    setup_logging(log_format, "info")
    options = LocalServerOptions(port=port, kv_cache_gib=kv_cache_gib, max_num_seqs=max_num_seqs)
    run_or_exit(lambda: anyio.run(_serve_until_signal, options))  # the extra missing: 2; a failed start: 3


async def _serve_until_signal(options: LocalServerOptions) -> None:
    import anyio

    from pipeline.local import LocalServer, vllm_launch

    launch = await vllm_launch(options)
    async with LocalServer(launch) as server:
        typer.echo(f"serving {server.model} at {server.base_url}")
        sys.stdout.flush()
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return


BenchEndpointOption = Annotated[str | None, typer.Option(help="Base URL, e.g. http://gpu-box:8000/v1.")]
BenchModelOption = Annotated[str | None, typer.Option(help="Model name on the server.")]
BenchLocalOption = Annotated[bool, typer.Option(help="Start the bundled local vLLM server and sweep it.")]
LevelsOption = Annotated[str, typer.Option(help="Comma-separated levels.")]
PromptTokensOption = Annotated[int, typer.Option(min=8)]
OutputTokensOption = Annotated[int, typer.Option(min=1)]
PrefixOption = Annotated[bool, typer.Option(help="Share the system prompt (prefix cache) or not.")]
StructuredOption = Annotated[bool, typer.Option(help="Ask for JSON with the LinkedIn schema.")]
RoundsOption = Annotated[int, typer.Option(min=1, help="Requests each worker sends per level.")]
WarmupOption = Annotated[bool, typer.Option(help="Send one unmeasured request first.")]
BenchTimeoutOption = Annotated[float, typer.Option(min=1, help="Client timeout per request, seconds.")]
ReasoningEffortOption = Annotated[str | None, typer.Option(help="Sent as reasoning_effort.")]
ApiKeyEnvOption = Annotated[str | None, typer.Option(help="Environment variable holding the API key.")]
BenchJobOption = Annotated[
    Path | None,
    typer.Option(help="Send this job's own requests (prompt, schema, settings, sampled records)."),
]
RecordsOption = Annotated[int, typer.Option(min=1, help="With --job: how many records to sample.")]
SeedKneeOption = Annotated[
    bool,
    typer.Option(
        help="With --job: keep the sweep's best level in the job's database, where its next "
        "`concurrency: auto` run starts instead of ramping from 8."
    ),
]
BenchOutOption = Annotated[Path, typer.Option(help="Folder for bench.csv, bench.json and bench.png.")]


_SEED_KNEE_NEEDS = "--seed-knee needs --job: the knee is kept in the job's database"
_SEED_KNEE_LOCAL = "--seed-knee and --local do not go together: the local server's address changes"


@app.command()
def bench(
    endpoint: BenchEndpointOption = None,
    model: BenchModelOption = None,
    local: BenchLocalOption = False,
    concurrency: LevelsOption = "1,2,4,8,16,32,64,128,256",
    prompt_tokens: PromptTokensOption = 1500,
    output_tokens: OutputTokensOption = 400,
    prefix: PrefixOption = True,
    structured: StructuredOption = False,
    rounds: RoundsOption = 3,
    warmup: WarmupOption = True,
    timeout: BenchTimeoutOption = 900.0,
    reasoning_effort: ReasoningEffortOption = "low",
    api_key_env: ApiKeyEnvOption = None,
    job: BenchJobOption = None,
    records: RecordsOption = 200,
    seed_knee: SeedKneeOption = False,
    out: BenchOutOption = Path("bench-out"),
) -> None:
    """Concurrency sweep: aggregate and per-sequence tok/s, TTFT, the server's queue, the knee."""
    from pipeline.bench import BenchOptions

    configure_logging(json_lines=not sys.stderr.isatty(), level="warning")
    endpoint = _checked_bench_target(endpoint, model, local, job, seed_knee)
    options = BenchOptions(
        base_url=endpoint or "",
        model=model or "",
        concurrency=_levels(concurrency),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        shared_prefix=prefix,
        structured=structured,
        rounds=rounds,
        warmup=warmup,
        timeout_s=timeout,
        reasoning_effort=reasoning_effort,
        api_key=os.environ.get(api_key_env) if api_key_env else None,
    )
    swept = options if job is None else _with_job(options, job, records, local)
    result = _sweep(swept, local)
    _print_bench(result, out)
    if seed_knee and job is not None:
        _seed_knee(job, swept, result)


def _checked_bench_target(
    endpoint: str | None, model: str | None, local: bool, job: Path | None, seed_knee: bool
) -> str | None:
    """What to sweep must be said, once and consistently (exit 2 otherwise); the URL, checked."""
    if not local and job is None and (endpoint is None or model is None):
        raise fail(ConfigError("bench needs --endpoint and --model, --job, or --local"))
    if seed_knee and (job is None or local):
        raise fail(ConfigError(_SEED_KNEE_NEEDS if job is None else _SEED_KNEE_LOCAL))
    if endpoint is None:
        return None
    from pipeline.servers.config import checked_url_option

    return run_or_exit(lambda: checked_url_option("--endpoint", endpoint))


def _levels(concurrency: str) -> tuple[int, ...]:
    """``--concurrency 1,2,4``: the levels of the sweep (exit 2 on anything else)."""
    try:
        levels = tuple(int(part) for part in concurrency.split(",") if part.strip())
    except ValueError as error:
        raise fail(ConfigError(f"--concurrency {concurrency!r}: expected numbers like 1,2,4")) from error
    if not levels or min(levels) < 1:
        raise fail(ConfigError(f"--concurrency {concurrency!r}: expected numbers >= 1"))
    return levels


def _sweep(options: BenchOptions, local: bool) -> SweepResult:
    import anyio

    # A wrong URL or model, the local extra missing: 2; the server down: 3.
    return run_or_exit(lambda: anyio.run(_bench, options, local))


def _with_job(options: BenchOptions, job: Path, records: int, local: bool) -> BenchOptions:
    """``options`` with the job's requests; a job on the local server needs --local or --endpoint
    (exit 2, as `check` says), not a connection to a URL named "local"."""
    from pipeline.bench.job import with_job

    spec = load_job_or_exit(job)
    if spec.runs_locally and not (local or options.base_url):
        message = "the job's endpoint is local: give --local to sweep the bundled server, or --endpoint URL"
        raise fail(ConfigError(f"{spec.source_file}: {message}"))
    return run_or_exit(lambda: with_job(options, spec, records))


async def _bench(options: BenchOptions, local: bool) -> SweepResult:
    from pipeline.bench import LevelSummary, run_sweep
    from pipeline.local import LocalServer, LocalServerOptions, vllm_launch

    def progress(level: LevelSummary) -> None:
        typer.echo(
            f"c={level.concurrency:,}: {level.aggregate_tok_s:,.1f} tok/s aggregate, "
            f"{counted(level.errors, 'error')}",
            err=True,
        )

    if not local:
        return await run_sweep(options, progress)
    async with LocalServer(await vllm_launch(LocalServerOptions())) as server:
        return await run_sweep(
            dataclasses.replace(options, base_url=server.base_url, model=server.model), progress
        )


def _seed_knee(job: Path, options: BenchOptions, result: SweepResult) -> None:
    from pipeline.bench.seed import seed_sweep_knee

    spec = load_job_or_exit(job)
    typer.echo(run_or_exit(lambda: seed_sweep_knee(spec, options, result.levels)))


def _print_bench(result: SweepResult, out: Path) -> None:
    from pipeline.bench import format_table, table_columns, table_rows, write_outputs
    from pipeline.bench.report import PLOT_HINT, plotting_available

    typer.echo(format_table(table_rows(result.levels, result.knee), table_columns(result.levels)))
    for line in result.lines():
        typer.echo(line)
    if result.knee is not None:
        regress = f"; regresses at c={result.knee.regresses_at}" if result.knee.regresses_at else ""
        typer.echo(f"knee: best aggregate at c={result.knee.best}{regress}")
    for note in result.diagnostics:
        typer.echo(f"- {note}")
    for path in write_outputs(result.levels, result.knee, result.diagnostics, out):
        typer.echo(f"wrote {path}")
    if not plotting_available():
        typer.echo(PLOT_HINT)
