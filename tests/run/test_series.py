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


def test_a_point_has_the_rate_since_the_last_one_in_flight_and_limits() -> None:
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
        "in_flight": 1,
        "limits": {"a:1": 8, "b:2": 4},
    }
    clock.now, stats.numbers.done = 40.0, 30
    stats.request_ended(ticket, answered=True)
    assert series.sample()["records_per_min"] == 20.0  # 10 records in the last 30 s
    assert series.points[-1]["in_flight"] == 0


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
