"""The run's time series on a fake clock: a point per interval, thinned out and slowed down when full."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from pipeline.run.series import SAVE_EVERY_POINTS, RunSeries
from pipeline.run.stats import RunStats


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stats_on(clock: Clock) -> RunStats:
    stats = RunStats(pending_at_start=1000, concurrency=8, clock=clock)
    stats.endpoint_numbers = lambda: {"a:1": {"limit": 8, "in_use": 3}, "b:2": {"limit": 4, "in_use": 1}}
    return stats


def test_a_point_has_the_runs_rate_the_rate_since_the_last_one_in_flight_and_limits() -> None:
    clock = Clock()
    stats = stats_on(clock)
    series = RunSeries(stats, interval_s=5)
    clock.now, stats.numbers.done, stats.numbers.failed = 10.0, 20, 5
    ticket = stats.request_sent()
    first = series.sample()
    assert first == {
        "t": 10.0,
        "done": 20,
        "failed": 5,
        "records_per_min": 150.0,
        "records_per_min_since_previous": 150.0,
        "in_flight": 1,
        "limits": {"a:1": 8, "b:2": 4},
    }
    clock.now, stats.numbers.done = 40.0, 30
    stats.request_ended(ticket, answered=True)
    second = series.sample()
    assert second["records_per_min_since_previous"] == 20.0  # 10 records in the last 30 s
    assert second["records_per_min"] == 35 * 60 / 40  # the run's: 35 records in its 40 s
    assert series.points[-1]["in_flight"] == 0


def test_the_last_point_after_the_run_ended_says_the_runs_own_rate() -> None:
    """A run of 1.5 s sampled first at 0.1 s: its last point said 50 records over the 1.4 s since
    then (2,142.9 records/min) where the summary, status and report say 2,000 over the run's 1.5 s."""
    clock = Clock()
    stats = stats_on(clock)
    series = RunSeries(stats, interval_s=5)
    clock.now = 0.1
    series.sample()
    clock.now, stats.numbers.done = 1.5, 50
    ended = stats.end()
    last = series.sample()
    assert last["records_per_min"] == ended.records_per_min == 2000.0
    assert last["records_per_min_since_previous"] == round(50 * 60 / 1.4, 2)


def test_the_last_point_after_the_run_ended_says_the_runs_own_hit_rate() -> None:
    """90% of the first 10,000 prompt tokens from the cache, 20% of the next 10,000: the last point said
    20% (since the point before) where the runs row, status and report say the run's 55%."""
    clock = Clock()
    stats = RunStats(pending_at_start=1000, concurrency=8, clock=clock)
    counts = {"hits": 9000, "queries": 10_000}

    def endpoint_numbers() -> dict[str, dict[str, Any]]:
        hits, queries = counts["hits"], counts["queries"]
        cache = {"prefix_cache_hits": hits, "prefix_cache_queries": queries, "preemptions": 0}
        return {"a:1": {"limit": 8, "prefix_cache_hit_rate": hits / queries, **cache}}

    stats.endpoint_numbers = endpoint_numbers
    series = RunSeries(stats, interval_s=5)
    clock.now = 5.0
    first = series.sample()
    assert (first["prefix_cache_hit_rate"], first["prefix_cache_hit_rate_since_previous"]) == (0.9, 0.9)
    clock.now, counts["hits"], counts["queries"] = 9.0, 11_000, 20_000
    ended = stats.end()
    last = series.sample()
    assert last["prefix_cache_hit_rate"] == ended.prefix_cache_hit_rate == 0.55
    assert last["prefix_cache_hit_rate_since_previous"] == 0.2


def test_a_full_series_keeps_every_other_point_and_samples_half_as_often() -> None:
    clock = Clock()
    series = RunSeries(stats_on(clock), interval_s=5, most=10)
    for step in range(1, 12):
        clock.now = step * 5.0
        series.sample()
    assert series.interval_s == 10
    assert [point["t"] for point in series.points] == [5.0, 15.0, 25.0, 35.0, 45.0, 55.0]
    for step in range(12, 40):
        clock.now = step * 5.0
        series.sample()
    assert len(series.points) <= 10 and series.points[-1]["t"] == 195.0
    assert series.points[0]["t"] == 5.0  # the whole run's shape is kept, from its start


@pytest.mark.anyio
async def test_run_samples_each_interval_and_saves_now_and_then() -> None:
    clock = Clock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds
        if len(slept) == 2 * SAVE_EVERY_POINTS:
            raise anyio.get_cancelled_exc_class()

    saved: list[list[dict[str, Any]]] = []

    async def save(points: list[dict[str, Any]]) -> None:
        saved.append(points)

    series = RunSeries(stats_on(clock), interval_s=5, sleep=sleep)
    with pytest.raises(anyio.get_cancelled_exc_class()):
        await series.run(save)
    assert slept == [5.0] * 2 * SAVE_EVERY_POINTS
    assert [len(points) for points in saved] == [SAVE_EVERY_POINTS, 2 * SAVE_EVERY_POINTS]
