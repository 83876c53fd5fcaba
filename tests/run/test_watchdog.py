from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from pipeline.errors import StalledRunError
from pipeline.run.stats import RunStats
from pipeline.run.watchdog import StallWatchdog

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watched(
    abort_after_s: float | None = None, sleep: Callable[[float], Awaitable[None]] = anyio.sleep
) -> tuple[RunStats, Clock, StallWatchdog, list[StalledRunError]]:
    clock = Clock()
    stats = RunStats(pending_at_start=100, concurrency=8, clock=clock)
    aborts: list[StalledRunError] = []
    dog = StallWatchdog(
        stats, warn_after_s=600, abort_after_s=abort_after_s, on_abort=aborts.append, sleep=sleep
    )
    return stats, clock, dog, aborts


def stall_warnings(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if str(entry["event"]).startswith("stalled: requests in flight")]


def test_quiet_with_nothing_in_flight_is_not_a_stall() -> None:
    _, clock, dog, aborts = watched(abort_after_s=900)
    clock.now += 5000
    with capture_logs() as logs:
        assert not dog.check()
    assert not stall_warnings(logs) and not aborts


def test_warns_with_in_flight_count_and_oldest_age_then_repeats_each_period() -> None:
    stats, clock, dog, aborts = watched()
    first = stats.request_sent()
    clock.now += 100
    for _ in range(3):
        stats.request_sent()
    clock.now += 499
    with capture_logs() as logs:
        dog.check()  # 599 s without an answer: not yet
        clock.now += 1
        dog.check()
        clock.now += 300
        dog.check()  # still the same stall: no second warning yet
        clock.now += 300
        dog.check()
    warnings = stall_warnings(logs)
    assert len(warnings) == 2 and dog.warnings == 2
    assert warnings[0]["in_flight"] == 4 and warnings[0]["no_answer_for_s"] == 600
    assert warnings[0]["oldest_request_age_s"] == 600 and warnings[1]["oldest_request_age_s"] == 1200
    assert not aborts
    stats.request_ended(first, answered=True)  # an answer ends the stall
    with capture_logs() as logs:
        dog.check()
    assert not stall_warnings(logs)


def test_aborts_after_stall_abort_s_with_a_clear_message() -> None:
    stats, clock, dog, aborts = watched(abort_after_s=900)
    stats.request_sent()
    clock.now += 899
    assert not dog.check()
    clock.now += 1
    with capture_logs() as logs:
        assert dog.check()
    assert len(aborts) == 1
    assert str(aborts[0]) == (
        "stalled: 1 request in flight and no answer for 900 s (operations.stall_abort_s = 900); "
        "run again to resume"
    )
    assert any(entry["log_level"] == "error" for entry in logs)


def test_timeouts_are_not_answers() -> None:
    stats, clock, dog, aborts = watched(abort_after_s=900)
    ticket = stats.request_sent()
    clock.now += 800
    stats.request_ended(ticket, answered=False)  # the client gave up; the server said nothing
    stats.request_sent()
    clock.now += 100
    assert dog.check() and aborts


async def test_run_checks_on_its_interval_until_it_aborts() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds

    stats, clock, dog, aborts = watched(abort_after_s=900, sleep=sleep)
    stats.request_sent()
    await dog.run()
    assert aborts and waits == [30.0] * 30  # 900 s in checks of min(30, 600 / 4)
