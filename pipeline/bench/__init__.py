"""``pipeline bench``: a concurrency sweep against any OpenAI-compatible server (vLLM, the simulator,
the local server), printing what the user's articles print: aggregate and per-sequence tok/s,
scaling, TTFT, errors, the server's queue and caches, the knee, and what it means.

With ``--job JOB --seed-knee`` the sweep's best level is kept in the job's database, where its next
``concurrency: auto`` run starts (:mod:`~pipeline.bench.seed`).

Also the closed loop that measures ``concurrency: auto`` against the simulator's engine
(:mod:`~pipeline.bench.closed_loop`), the large sources sweeps and scale runs read
(:mod:`~pipeline.bench.datasets`), shared by tests and ``benchmarks/``, and the SkillSpan gold set
converted to records and a gold file (:mod:`~pipeline.bench.skillspan`, ``python -m
pipeline.bench.skillspan``).

May import: :mod:`pipeline.servers`, :mod:`pipeline.sim`, :mod:`pipeline.errors`, and for ``--job``
:mod:`pipeline.store`, :mod:`pipeline.extraction`, :mod:`pipeline.source`, :mod:`pipeline.job`; never
the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from pipeline.bench.load import BenchOptions, RequestResult, run_level
from pipeline.bench.observer import ServerObservation, watch
from pipeline.bench.report import (
    LevelSummary,
    SweepKnee,
    diagnose,
    find_knee,
    format_table,
    summarize,
    sweep_lines,
    table_columns,
    table_rows,
    with_scaling,
    write_outputs,
)
from pipeline.bench.server_cpu import CpuWatch, LocalSimulator, local_simulator
from pipeline.servers.client import ClientSettings, LLMClient
from pipeline.servers.scrape import metrics_url, parse_metrics

__all__ = [
    "BenchOptions",
    "LevelSummary",
    "RequestResult",
    "SweepKnee",
    "SweepResult",
    "format_table",
    "parse_metrics",
    "run_sweep",
    "sweep_lines",
    "table_columns",
    "table_rows",
    "write_outputs",
]


@dataclass(frozen=True, slots=True)
class SweepResult:
    levels: list[LevelSummary]
    knee: SweepKnee | None
    diagnostics: list[str]
    simulator_pid: int | None = None  # the simulator swept, a process on this machine (its CPU watched)

    def lines(self) -> list[str]:
        """What the table's times are, how long the sweep took, and what was checked."""
        return sweep_lines(self.levels, self.simulator_pid)


async def run_sweep(
    options: BenchOptions, on_level: Callable[[LevelSummary], None] | None = None
) -> SweepResult:
    """Run every concurrency level in order; ``on_level`` sees each summary as it is done.

    Raises :class:`~pipeline.errors.FatalRunError` at once if the server is down or lacks the model.
    A simulator on this machine (``pipeline sim`` on 127.0.0.1) has its CPU, and the machine's, read at
    each level beside the client's: a busy one measures the machine, not the model."""
    settings = ClientSettings(base_url=options.base_url, model=options.model, api_key=options.api_key)
    async with LLMClient(settings) as client:
        await client.check_server()
    simulator = await anyio.to_thread.run_sync(local_simulator, options.base_url)  # reads all of /proc
    if options.warmup:  # the first request pays for compilation and connection set-up: not a level's
        await run_level(dataclasses.replace(options, rounds=1), 1)
    levels = []
    for concurrency in options.concurrency:
        level = await _level(options, concurrency, simulator)
        levels.append(level)
        if on_level is not None:
            on_level(level)
    levels = with_scaling(levels)
    knee = find_knee(levels)
    notes = diagnose(levels, options.timeout_s, options.output_tokens)
    return SweepResult(levels, knee, notes, simulator.pid if simulator else None)


async def _level(options: BenchOptions, concurrency: int, simulator: LocalSimulator | None) -> LevelSummary:
    observation = ServerObservation()
    cpu = CpuWatch(simulator) if simulator else None
    async with anyio.create_task_group() as group:
        group.start_soon(watch, metrics_url(options.base_url), observation)
        results, wall_s, cpu_s = await run_level(options, concurrency)
        server_cpu = cpu.shares(wall_s) if cpu else (None, None)
        await anyio.sleep(0.6)  # one more scrape, so the counters cover the whole level
        group.cancel_scope.cancel()
    return summarize(concurrency, results, wall_s, observation, client_cpu_s=cpu_s, server_cpu=server_cpu)
