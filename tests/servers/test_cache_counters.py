"""A server's prefix-cache and preemption counters over a run: deltas since the first scrape, across
restarts, over the run and over the last minutes (a fake clock), and the low-hit-rate warning against what
the job can reach."""

from __future__ import annotations

import pytest

from pipeline.servers.cache_counters import (
    HITS,
    MIN_QUERIES,
    QUERIES,
    WARN_AFTER_QUERIES,
    CounterDelta,
    ServerCounters,
    hit_rate,
    low_hit_rate_warning,
    reachable_hit_rate,
)
from pipeline.servers.scrape import PREEMPTIONS


def scrape(hits: float, queries: float, preemptions: float = 0.0) -> dict[str, float]:
    return {HITS: hits, QUERIES: queries, PREEMPTIONS: preemptions}


def test_a_counter_counts_from_its_first_reading_not_from_the_servers_start() -> None:
    counter = CounterDelta()
    for value in (1000.0, 1200.0, 1500.0):
        counter.observe(value)
    assert counter.total == 500.0


def test_a_restarted_server_counting_from_zero_adds_what_it_counted_since_never_a_negative() -> None:
    counter = CounterDelta()
    for value in (1000.0, 1200.0, 50.0, 80.0):  # restarted between 1200 and 50
        counter.observe(value)
    assert counter.total == 200.0 + 50.0 + 30.0


def test_the_hit_rate_is_hits_over_queries_since_the_run_began() -> None:
    counters = ServerCounters()
    counters.observe(scrape(90_000, 100_000, 7), now=0.0)  # before the run: not counted
    counters.observe(scrape(99_000, 110_000, 9), now=1.0)
    counters.observe(scrape(108_000, 120_000, 12), now=2.0)
    assert counters.hit_rate == pytest.approx(0.9)
    assert counters.preemptions == 5
    assert counters.as_dict() == {
        "prefix_cache_hits": 18_000,
        "prefix_cache_queries": 20_000,
        "prefix_cache_hit_rate": 0.9,
        "prefix_cache_recent_hit_rate": 0.9,
        "preemptions": 5,
    }


def test_the_recent_hit_rate_follows_the_last_minutes_on_a_fake_clock() -> None:
    counters = ServerCounters(recent_s=60.0)
    hits = queries = 0.0
    for second in range(0, 600, 10):  # ten minutes at 90%, then two at 20%
        counters.observe(scrape(hits, queries), now=float(second))
        hits, queries = hits + 9000, queries + 10_000
    for second in range(600, 720, 10):
        counters.observe(scrape(hits, queries), now=float(second))
        hits, queries = hits + 2000, queries + 10_000
    assert counters.recent_hit_rate == pytest.approx(0.2)
    assert counters.hit_rate is not None and 0.7 < counters.hit_rate < 0.8


def test_too_few_prompt_tokens_say_nothing_yet() -> None:
    counters = ServerCounters()
    counters.observe(scrape(0, 0), now=0.0)
    counters.observe(scrape(10, MIN_QUERIES / 2), now=1.0)
    assert counters.hit_rate is None
    assert hit_rate(None, 5000) is None


def test_a_server_without_the_counters_has_none() -> None:
    counters = ServerCounters()
    counters.observe({"vllm:num_requests_running": 3.0}, now=0.0)
    counters.observe({"vllm:num_requests_running": 4.0}, now=1.0)
    assert counters.as_dict() == dict.fromkeys(
        (
            "prefix_cache_hits",
            "prefix_cache_queries",
            "prefix_cache_hit_rate",
            "prefix_cache_recent_hit_rate",
            "preemptions",
        )
    )


def test_a_hit_rate_well_below_what_the_job_can_reach_says_what_may_cause_it_naming_the_server() -> None:
    assert low_hit_rate_warning(0.46, 0.88, "http://gpu1:8000/v1") == (
        "prefix-cache hit rate 46% where this job's shared prefix is 88% of its prompt: the record text "
        "may come before the shared part of the prompt, or http://gpu1:8000/v1 evicts the prefix between "
        "requests (other prompts, or more requests in flight than its KV cache holds)"
    )


def test_a_job_of_long_records_sharing_little_is_not_told_of_a_rate_near_what_it_can_reach() -> None:
    assert low_hit_rate_warning(0.27, 0.30, "x") is None
    assert low_hit_rate_warning(0.10, 0.30, "x") is not None  # a third of it: something is wrong
    assert low_hit_rate_warning(0.46, None, "x") is None  # what it can reach is unknown: no judgement
    assert low_hit_rate_warning(None, 0.88, "x") is None


def test_what_a_job_can_reach_is_its_shared_prefix_over_its_prompt() -> None:
    assert reachable_hit_rate(2861, 3251.0) == pytest.approx(0.88, abs=0.001)
    assert reachable_hit_rate(900, 3000.0) == 0.3
    assert reachable_hit_rate(5000, 3000.0) == 1.0  # a prompt is never more than all cached
    assert reachable_hit_rate(None, 3000.0) is None and reachable_hit_rate(900, None) is None


def test_with_prefix_caching_off_the_rate_is_unknown_not_zero() -> None:
    """vLLM with prefix caching off looks nothing up and counts no query: no rate, no warning."""
    counters = ServerCounters()
    counters.observe(scrape(500, 600), now=0.0)
    counters.observe(scrape(500, 600), now=5.0)
    assert counters.prefix_cache_queries == 0 and counters.hit_rate is None
    assert counters.as_dict()["prefix_cache_hit_rate"] is None
    assert low_hit_rate_warning(counters.hit_rate, 0.88, "http://gpu1:8000/v1", queries=0) is None


def test_the_first_requests_only_fill_the_cache_and_are_not_judged() -> None:
    assert low_hit_rate_warning(0.2, 0.88, "x", queries=WARN_AFTER_QUERIES / 2) is None
    assert low_hit_rate_warning(0.2, 0.88, "x", queries=WARN_AFTER_QUERIES) is not None


def test_one_scrape_tells_no_delta() -> None:
    counters = ServerCounters()
    counters.observe(scrape(500, 600, 3), now=0.0)
    assert (counters.prefix_cache_queries, counters.preemptions) == (None, None)
