"""``pipeline bench --job JOB --seed-knee``: the sweep's best level kept in the job's database as a
knee, so that the job's next `concurrency: auto` run starts there instead of ramping from 8.

A sweep measures a coarse grid (1, 2, 4, ... 256), so what it leaves is not a bracketed knee but the best
level with the nearest swept levels that did worse: the run searches between them, as it does from what
an earlier run learned without bracketing its knee."""

from __future__ import annotations

import dataclasses

from pipeline.bench.load import BenchOptions
from pipeline.bench.report import LevelSummary
from pipeline.job.spec import JobSpec
from pipeline.servers.config import EndpointConfig
from pipeline.servers.knee_search import KneeMemory
from pipeline.store.opening import seed_knee


def sweep_knee(levels: list[LevelSummary]) -> KneeMemory | None:
    """The best level of a sweep and the nearest swept levels on either side (all did worse), or None
    when nothing delivered."""
    delivered = [level for level in levels if level.aggregate_tok_s > 0]
    if not delivered:
        return None
    best = max(delivered, key=lambda level: level.aggregate_tok_s).concurrency
    below = [level.concurrency for level in levels if level.concurrency < best]
    above = [level.concurrency for level in levels if level.concurrency > best]
    return KneeMemory(
        best, bracketed=False, worse_below=max(below, default=None), worse_above=min(above, default=None)
    )


def swept_endpoint(spec: JobSpec, options: BenchOptions) -> EndpointConfig:
    """The job's endpoint the sweep measured: the job's first, at the URL and model swept."""
    return dataclasses.replace(spec.endpoint_configs()[0], base_url=options.base_url, model=options.model)


def seed_sweep_knee(spec: JobSpec, options: BenchOptions, levels: list[LevelSummary]) -> str:
    """Keep the sweep's knee for the job's endpoint; what was done, in words."""
    knee = sweep_knee(levels)
    endpoint = swept_endpoint(spec, options)
    if knee is None:
        return f"no knee kept for {endpoint.name}: no level delivered any tokens"
    best = next(level for level in levels if level.concurrency == knee.level)
    message = f"pipeline bench: best at c={knee.level} ({best.aggregate_tok_s:,.0f} tok/s)"
    seed_knee(spec, endpoint, knee, message)
    return (
        f"kept c={knee.level} as the knee of {endpoint.base_url} ({endpoint.model}) in {spec.database}: "
        "the job's next `concurrency: auto` run starts there"
    )
