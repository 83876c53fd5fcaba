"""One limit per server on a machine: the jobs' parts of it, granted as slots come free."""

from __future__ import annotations

import pytest

from pipeline.servers.limits import AdaptiveLimit
from pipeline.servers.slot_pool import Member, Report, SlotPool, fair_parts
from pipeline.servers.window import ServerLoad


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pool_at(level: int, clock: Clock | None = None) -> SlotPool:
    clock = clock or Clock()
    limit = AdaptiveLimit(maximum=512, timeout_s=900, initial=level, clock=clock)
    return SlotPool(limit, clock, scrape_every_s=1.0)


@pytest.mark.parametrize(
    ("total", "demands", "parts"),
    [
        (64, [512, 512], [32, 32]),
        (64, [10, 512], [10, 54]),  # one needs fewer: the other takes the rest
        (64, [512, 512, 512], [22, 21, 21]),  # the odd slot goes in turn, from the first here
        (64, [0, 512], [0, 64]),
        (10, [3, 3], [3, 3]),
    ],
)
def test_the_limit_is_split_max_min_fair(total: int, demands: list[int], parts: list[int]) -> None:
    assert fair_parts(total, demands) == parts


def test_a_job_that_comes_gets_its_part_only_as_the_other_releases_slots() -> None:
    pool = pool_at(64)
    first, second = Member("a", pool), Member("b", pool)
    first.update(in_flight=0, waiting=512)
    assert first.limit == 8  # from nothing, its room doubles a tick: jobs that come together start together
    for in_flight in (8, 24, 56):
        first.update(in_flight=in_flight, waiting=512)
    assert first.limit == 64
    first.update(in_flight=64, waiting=448)
    second.update(in_flight=0, waiting=512)
    first.update(in_flight=64, waiting=448)  # each hears at its own tick
    assert second.limit == 0 and first.limit == 32  # the first sends nothing until under its part
    first.update(in_flight=50, waiting=448)  # 14 replies came: 14 slots free, the second's in a tick or two
    second.update(in_flight=0, waiting=512)
    assert second.limit == 8
    second.update(in_flight=8, waiting=504)
    assert second.limit == 14
    second.update(in_flight=14, waiting=498)
    first.update(in_flight=32, waiting=448)
    second.update(in_flight=14, waiting=498)
    assert (first.limit, second.limit) == (32, 32)


def test_a_job_that_leaves_or_runs_short_leaves_its_slots_to_the_others() -> None:
    pool = pool_at(64)
    first, second = Member("a", pool), Member("b", pool)
    for _ in range(3):
        first.update(in_flight=32, waiting=100)
        second.update(in_flight=32, waiting=100)
    assert (first.limit, second.limit) == (32, 32)
    first.update(in_flight=10, waiting=0)  # its last requests drain
    second.update(in_flight=32, waiting=100)
    assert second.limit == 54
    first.leave()
    second.update(in_flight=54, waiting=100)
    assert second.limit == 64 and pool.jobs == 1


def test_every_jobs_replies_feed_the_one_search_and_one_scrape_an_interval_counts() -> None:
    clock = Clock()
    pool = pool_at(64, clock)
    first, second = Member("a", pool), Member("b", pool)
    load = ServerLoad(running=64, waiting=0, kv_usage=0.5, preemptions_total=0)
    for member in (first, second):
        member.on_finished(latency_s=10.0, output_tokens=400, prompt_tokens=1500, ok=True)
        member.on_server_load(load)
        member.update(in_flight=32, waiting=10)
    window = pool.controller._window
    assert len(window.scrapes) <= 1  # the second job's scrape of the same second is not another reading
    report = Report(32, 10, [(None, 0, 0, False)])
    assert pool.report("a", report).jobs == 2


def test_room_a_job_was_told_counts_as_taken_until_it_says_what_it_sent() -> None:
    """The first job heard 64 with 32 in flight; it may have sent 32 more since. A second job coming
    before the first says so gets none of them (taken from its stale count, 214 went out where the
    pool held 130 and the server queued)."""
    pool = pool_at(64)
    first, second = Member("a", pool), Member("b", pool)
    for in_flight in (0, 8, 24, 32):
        first.update(in_flight=in_flight, waiting=512)
    assert first.limit == 64
    for _ in range(2):  # the second reports again before the first does
        second.update(in_flight=0, waiting=512)
        assert second.limit == 0
