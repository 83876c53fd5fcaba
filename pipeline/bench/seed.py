"""``pipeline bench --job JOB --seed-knee``: the sweep's best level kept in the job's database as a
knee, so that the job's next `concurrency: auto` run starts there instead of ramping from 8.

A sweep measures a coarse grid (1, 2, 4, ... 256), so what it leaves is not a bracketed knee but a level
with the nearest swept levels that did worse: the run searches between them, as it does from what an
earlier run learned without bracketing its knee.

The level kept is the lowest within :data:`SEED_TOLERANCE` of the best level that did not queue. A
level where the server ran fewer requests than were sent and made the rest wait (its --max-num-seqs)
only adds waiting, and its throughput is the lower level's plus noise (c=16 was kept at +1.4% over c=8
on a server that runs 8); and among levels within a sweep's noise of each other, the lowest holds the
least KV cache and leaves `auto` the room to climb."""

from __future__ import annotations

import dataclasses

from pipeline.bench.load import BenchOptions
from pipeline.bench.report import LevelSummary, queued
from pipeline.job.spec import JobSpec
from pipeline.servers.config import EndpointConfig
from pipeline.servers.knee_search import KneeMemory
from pipeline.store.opening import seed_knee

#: Levels whose aggregate throughput is within this share of the best one's count as equal to it.
SEED_TOLERANCE = 0.05


def seeded_level(levels: list[LevelSummary]) -> LevelSummary | None:
    """The lowest level within :data:`SEED_TOLERANCE` of the best that did not queue (of all levels,
    when every one queued); None when nothing delivered."""
    delivered = [level for level in levels if level.aggregate_tok_s > 0]
    candidates = [level for level in delivered if not queued(level)] or delivered
    if not candidates:
        return None
    best = max(level.aggregate_tok_s for level in candidates)
    near = [level for level in candidates if level.aggregate_tok_s >= best * (1 - SEED_TOLERANCE)]
    return min(near, key=lambda level: level.concurrency)


def sweep_knee(levels: list[LevelSummary]) -> KneeMemory | None:
    """The seeded level (:func:`seeded_level`) between the nearest swept levels that did worse: below
    it, the nearest; above it, the nearest that queued or delivered less. None when nothing delivered."""
    chosen = seeded_level(levels)
    if chosen is None:
        return None
    level = chosen.concurrency
    below = [other.concurrency for other in levels if other.concurrency < level]
    above = [
        other.concurrency
        for other in levels
        if other.concurrency > level and (queued(other) or other.aggregate_tok_s < chosen.aggregate_tok_s)
    ]
    return KneeMemory(
        level, bracketed=False, worse_below=max(below, default=None), worse_above=min(above, default=None)
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
    kept = next(level for level in levels if level.concurrency == knee.level)
    message = f"pipeline bench: c={knee.level} ({kept.aggregate_tok_s:,.0f} tok/s), {_why(levels, kept)}"
    seed_knee(spec, endpoint, knee, message)
    return (
        f"kept c={knee.level} as the knee of {endpoint.base_url} ({endpoint.model}) in {spec.database}: "
        f"the job's next `concurrency: auto` run starts there ({_why(levels, kept)})"
    )


def _why(levels: list[LevelSummary], kept: LevelSummary) -> str:
    """Why this level: the rule, and the levels above it that did as well or better."""
    rule = f"the lowest level within {SEED_TOLERANCE:.0%} of the best that did not queue"
    higher = [
        f"c={level.concurrency} {level.aggregate_tok_s / kept.aggregate_tok_s - 1:+.1%}"
        + (", queued" if queued(level) else "")
        for level in levels
        if level.concurrency > kept.concurrency and level.aggregate_tok_s >= kept.aggregate_tok_s
    ]
    return rule + (f"; {', '.join(higher)}" if higher else "")
