"""Commands that serve or measure: sim, serve-local, bench."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from pipeline.cli.common import (
    EXIT_ABORTED,
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    LogFormat,
    LogFormatOption,
    app,
    exit_code_for,
    fail,
    load_job_or_exit,
    setup_logging,
)
from pipeline.cli.logs import configure_logging
from pipeline.errors import ConfigError, FatalRunError
from pipeline.local import LocalServer, LocalServerOptions, vllm_launch

if TYPE_CHECKING:  # the bench's modules (prometheus parser, matplotlib) load only for `bench`:
    from pipeline.bench import BenchOptions, SweepResult  # `run` starts faster without them


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
    reject_response_format: Annotated[
        bool,
        typer.Option(help="Answer a request with response_format with HTTP 400, as a server without it."),
    ] = False,
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
        raise fail(ConfigError(f"--profile {profile!r}: one of {', '.join(PROFILES)}"), EXIT_CONFIG)
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
        reject_response_format=reject_response_format,
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
    setup_logging(log_format, "info")
    options = LocalServerOptions(port=port, kv_cache_gib=kv_cache_gib, max_num_seqs=max_num_seqs)
    try:
        anyio.run(_serve_until_signal, options)
    except FatalRunError as error:
        raise fail(error, EXIT_ABORTED) from error
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


@app.command()
def bench(
    endpoint: Annotated[str | None, typer.Option(help="Base URL, e.g. http://gpu-box:8000/v1.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name on the server.")] = None,
    local: Annotated[bool, typer.Option(help="Start the bundled local vLLM server and sweep it.")] = False,
    concurrency: Annotated[str, typer.Option(help="Comma-separated levels.")] = "1,2,4,8,16,32,64,128,256",
    prompt_tokens: Annotated[int, typer.Option(min=8)] = 1500,
    output_tokens: Annotated[int, typer.Option(min=1)] = 400,
    prefix: Annotated[bool, typer.Option(help="Share the system prompt (prefix cache) or not.")] = True,
    structured: Annotated[bool, typer.Option(help="Ask for JSON with the LinkedIn schema.")] = False,
    rounds: Annotated[int, typer.Option(min=1, help="Requests each worker sends per level.")] = 3,
    warmup: Annotated[bool, typer.Option(help="Send one unmeasured request first.")] = True,
    timeout: Annotated[float, typer.Option(min=1, help="Client timeout per request, seconds.")] = 900.0,
    reasoning_effort: Annotated[str | None, typer.Option(help="Sent as reasoning_effort.")] = "low",
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable holding the API key.")] = None,
    job: Annotated[
        Path | None,
        typer.Option(help="Send this job's own requests (prompt, schema, settings, sampled records)."),
    ] = None,
    records: Annotated[int, typer.Option(min=1, help="With --job: how many records to sample.")] = 200,
    out: Annotated[Path, typer.Option(help="Folder for bench.csv, bench.json and bench.png.")] = Path(
        "bench-out"
    ),
) -> None:
    """Concurrency sweep: aggregate and per-sequence tok/s, TTFT, the server's queue, the knee."""
    from pipeline.bench import BenchOptions

    configure_logging(json_lines=not sys.stderr.isatty(), level="warning")
    try:
        levels = tuple(int(part) for part in concurrency.split(",") if part.strip())
    except ValueError as error:
        raise fail(
            ConfigError(f"--concurrency {concurrency!r}: expected numbers like 1,2,4"), EXIT_CONFIG
        ) from error
    if not levels or min(levels) < 1:
        raise fail(ConfigError(f"--concurrency {concurrency!r}: expected numbers >= 1"), EXIT_CONFIG)
    if not local and job is None and (endpoint is None or model is None):
        raise fail(ConfigError("bench needs --endpoint and --model, --job, or --local"), EXIT_CONFIG)
    options = BenchOptions(
        base_url=endpoint or "",
        model=model or "",
        concurrency=levels,
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
    if job is not None:
        options = _with_job(options, job, records)
    try:
        result = anyio.run(_bench, options, local)
    except FatalRunError as error:
        raise fail(error, EXIT_ABORTED) from error
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _print_bench(result, out)


def _with_job(options: BenchOptions, job: Path, records: int) -> BenchOptions:
    from pipeline.bench.job import with_job

    spec = load_job_or_exit(job)
    try:
        return with_job(options, spec, records)
    except FatalRunError as error:
        raise fail(error, exit_code_for(error)) from error


async def _bench(options: BenchOptions, local: bool) -> SweepResult:
    from pipeline.bench import LevelSummary, run_sweep

    def progress(level: LevelSummary) -> None:
        typer.echo(
            f"c={level.concurrency}: {level.aggregate_tok_s:,.1f} tok/s aggregate, {level.errors} errors",
            err=True,
        )

    if not local:
        return await run_sweep(options, progress)
    async with LocalServer(await vllm_launch(LocalServerOptions())) as server:
        return await run_sweep(
            dataclasses.replace(options, base_url=server.base_url, model=server.model), progress
        )


def _print_bench(result: SweepResult, out: Path) -> None:
    from pipeline.bench import format_table, table_rows, write_outputs
    from pipeline.bench.report import PLOT_HINT, plotting_available

    typer.echo(format_table(table_rows(result.levels, result.knee)))
    if result.knee is not None:
        regress = f"; regresses at c={result.knee.regresses_at}" if result.knee.regresses_at else ""
        typer.echo(f"knee: best aggregate at c={result.knee.best}{regress}")
    for note in result.diagnostics:
        typer.echo(f"- {note}")
    for path in write_outputs(result.levels, result.knee, result.diagnostics, out):
        typer.echo(f"wrote {path}")
    if not plotting_available():
        typer.echo(PLOT_HINT)
