"""The run's prefix-cache hit rate and preemptions from its endpoints' /metrics: summed over the servers
that have them, said in the progress line, the snapshot, the series and Prometheus, a hit rate low for
what the job can reach warned about once; a server without /metrics (a proxy) shows nothing and raises
nothing; counted from a reading before the first request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.progress import Task, TaskID
from structlog.testing import capture_logs

from pipeline.job.spec import load_job
from pipeline.run.progress import _StatsColumn
from pipeline.run.prometheus import RunCollector
from pipeline.run.series import RunSeries
from pipeline.run.server_cache import CacheWarnings, cache_warnings, progress_words, run_cache_numbers
from pipeline.run.stats import RunStats
from pipeline.servers.cache_counters import MIN_QUERIES, WARN_AFTER_QUERIES, low_hit_rate_warning
from pipeline.servers.capacity import ServerReading
from pipeline.servers.replies import Reply
from pipeline.servers.scrape import parse_metrics
from tests.support.endpoints import endpoint_for
from tests.support.jobs import write_job

pytestmark = pytest.mark.anyio

#: What every endpoint's numbers hold besides the server's counters (servers/endpoint.py).
BASE = {"up": True, "limit": 8, "in_flight": 0, "requests": 0, "answers": 0, "output_tokens": 0}
BASE |= {"timeouts": 0, "outages": 0}
PROXY = {
    **BASE,
    "base_url": "http://proxy:9000/v1",
    "prefix_cache_hits": None,
    "prefix_cache_queries": None,
    "prefix_cache_hit_rate": None,
    "prefix_cache_recent_hit_rate": None,
    "preemptions": None,
    "prefix_cache_reachable": None,
}
#: What the job's prompts allow: its shared prefix is 88% of them.
REACHABLE = 0.88


def counted(
    hits: float, queries: float, preemptions: int, recent: float | None = None, reachable: float = REACHABLE
) -> dict[str, Any]:
    return {
        **BASE,
        "base_url": "http://gpu1:8000/v1",
        "prefix_cache_hits": hits,
        "prefix_cache_queries": queries,
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries >= MIN_QUERIES else None,
        "prefix_cache_recent_hit_rate": recent,
        "preemptions": preemptions,
        "prefix_cache_reachable": reachable,
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stats_over(endpoints: dict[str, dict[str, Any]], clock: Clock | None = None) -> RunStats:
    stats = RunStats(pending_at_start=100, concurrency=8, clock=clock or Clock())
    stats.endpoint_numbers = lambda: endpoints
    return stats


def test_the_run_sums_the_servers_that_count_and_ignores_a_proxy() -> None:
    endpoints = {
        "gpu1:8000": counted(27_000, 30_000, 2, 0.95, reachable=0.96),
        "gpu2:8000": counted(9000, 10_000, 1, 0.85, reachable=0.92),
    }
    assert run_cache_numbers({**endpoints, "proxy:9000": PROXY}) == {
        "prefix_cache_hit_rate": 0.9,
        "prefix_cache_recent_hit_rate": 0.925,  # weighted by each server's queries
        "prefix_cache_reachable": 0.95,  # so is what the job can reach
        "preemptions": 3,
    }
    assert run_cache_numbers({"proxy:9000": PROXY}) == {}


def test_a_low_hit_rate_for_what_the_job_can_reach_warns_once_per_server_after_enough_tokens() -> None:
    early = {"gpu1:8000": counted(3000, WARN_AFTER_QUERIES / 2, 0)}
    assert cache_warnings(early) == []  # the first requests only fill the cache
    low = {"gpu1:8000": counted(0.46 * WARN_AFTER_QUERIES, WARN_AFTER_QUERIES, 0), "proxy:9000": PROXY}
    warnings = CacheWarnings()
    with capture_logs() as logs:
        first, second = warnings.check(low), warnings.check(low)
    expected = low_hit_rate_warning(0.46, REACHABLE, "http://gpu1:8000/v1")
    assert expected is not None and expected.startswith("prefix-cache hit rate 46% where this job's shared")
    assert (first, second, warnings.said) == ([expected], [], [expected])
    assert [(log["event"], log["log_level"]) for log in logs] == [(expected, "warning")]


def test_the_progress_line_says_the_hit_rate_and_preemptions() -> None:
    stats = stats_over({"gpu1:8000": counted(9700, 10_000, 3, 0.96)})
    line = _StatsColumn(stats).render(Task(TaskID(0), "extract", 100, 0, _get_time=lambda: 0.0)).plain
    assert line.endswith(" · prefix cache 97% · preemptions 3")
    assert progress_words({"prefix_cache_hit_rate": 0.9, "prefix_cache_recent_hit_rate": 0.3}) == (
        " · prefix cache 90% (30% lately)"
    )
    proxy_line = _StatsColumn(stats_over({"proxy:9000": PROXY})).render(
        Task(TaskID(0), "extract", 100, 0, _get_time=lambda: 0.0)
    )
    assert "prefix" not in proxy_line.plain and "preemptions" not in proxy_line.plain


def test_long_records_sharing_little_are_not_warned_about_a_rate_near_what_they_can_reach() -> None:
    long_records = {"gpu1:8000": counted(0.27 * WARN_AFTER_QUERIES, WARN_AFTER_QUERIES, 0, reachable=0.30)}
    assert cache_warnings(long_records) == []


def test_the_snapshot_status_reads_has_the_hit_rate_preemptions_and_the_warning() -> None:
    low = {"gpu1:8000": counted(0.31 * WARN_AFTER_QUERIES, WARN_AFTER_QUERIES, 4)}
    stats = stats_over(low)
    assert "prefix_cache_warnings" not in stats.snapshot()
    stats.cache_warnings.check(low)
    snapshot = stats.snapshot()
    assert (snapshot["prefix_cache_hit_rate"], snapshot["preemptions"]) == (0.31, 4)
    assert snapshot["prefix_cache_warnings"][0].startswith("prefix-cache hit rate 31%")
    assert stats_over({"proxy:9000": PROXY}).snapshot()["prefix_cache_hit_rate"] is None  # unknown


def test_a_series_point_keeps_the_runs_counts_its_hit_rate_and_the_one_since_the_point_before() -> None:
    numbers = {"gpu1:8000": counted(9000, 10_000, 1)}
    clock = Clock()
    stats = stats_over(numbers, clock)
    series = RunSeries(stats, interval_s=5)
    clock.now = 5.0
    first = series.sample()
    numbers["gpu1:8000"] = counted(9000 + 2000, 10_000 + 10_000, 2)  # 20% since
    clock.now = 10.0
    second = series.sample()
    assert {key: first[key] for key in ("prefix_cache_hits", "prefix_cache_queries", "preemptions")} == {
        "prefix_cache_hits": 9000,
        "prefix_cache_queries": 10_000,
        "preemptions": 1,
    }
    assert (first["prefix_cache_hit_rate"], second["prefix_cache_hit_rate"]) == (0.9, 0.55)  # the run's
    since = [point["prefix_cache_hit_rate_since_previous"] for point in (first, second)]
    assert since == [0.9, 0.2]
    assert second["prefix_cache_queries"] == 20_000
    assert "prefix_cache_hits" not in RunSeries(stats_over({"proxy:9000": PROXY})).sample()


def test_sampling_the_series_says_a_low_hit_rate() -> None:
    stats = stats_over({"gpu1:8000": counted(0.2 * WARN_AFTER_QUERIES, WARN_AFTER_QUERIES, 0)})
    with capture_logs() as logs:
        series = RunSeries(stats)
        series.sample()
        series.sample()
    assert [log["event"][:26] for log in logs] == ["prefix-cache hit rate 20% "]


def test_prometheus_has_each_servers_counters_and_the_runs_hit_rate() -> None:
    stats = stats_over({"gpu1:8000": counted(9000, 10_000, 3), "proxy:9000": PROXY})
    registry = CollectorRegistry()
    registry.register(RunCollector(stats, "nightly"))
    text = generate_latest(registry).decode()
    labels = '{endpoint="gpu1:8000",job="nightly"}'
    for line in (
        f"pipeline_endpoint_prefix_cache_hits_total{labels} 9000.0",
        f"pipeline_endpoint_prefix_cache_queries_total{labels} 10000.0",
        f"pipeline_endpoint_prefix_cache_hit_rate{labels} 0.9",
        f"pipeline_endpoint_preemptions_total{labels} 3.0",
        'pipeline_prefix_cache_hit_rate{job="nightly"} 0.9',
    ):
        assert line in text
    assert "proxy:9000" not in "".join(line for line in text.splitlines() if "prefix_cache" in line)


METRICS = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m"}} {hits}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{model_name="m"}} {preemptions}
"""


async def read_twice(tmp_path: Path, reply: httpx2.Response | list[httpx2.Response], **job: Any) -> Any:
    replies = reply if isinstance(reply, list) else [reply, reply]
    endpoint = endpoint_for(load_job(write_job(tmp_path, **job)))
    transport = httpx2.MockTransport(lambda request: replies.pop(0))
    async with httpx2.AsyncClient(transport=transport) as http:
        for _ in range(2):
            await endpoint.read_server_load(http)
            await anyio.lowlevel.checkpoint()
    return endpoint


async def test_a_fixed_concurrency_endpoint_counts_its_servers_prefix_cache(tmp_path: Path) -> None:
    replies = [
        httpx2.Response(200, text=METRICS.format(queries=5000, hits=4000, preemptions=1)),
        httpx2.Response(200, text=METRICS.format(queries=25_000, hits=20_000, preemptions=4)),
    ]
    endpoint = await read_twice(tmp_path, replies, concurrency=4)
    assert endpoint.controller is None and endpoint.metrics_available
    numbers = endpoint.stats.as_dict(endpoint)
    assert (numbers["prefix_cache_hit_rate"], numbers["preemptions"]) == (0.8, 3)


@pytest.mark.parametrize(
    "reply", [httpx2.Response(404, text="Not Found"), httpx2.Response(200, text="<html>a proxy</html>")]
)
async def test_a_server_without_metrics_shows_nothing_and_is_not_asked_again(
    tmp_path: Path, reply: httpx2.Response
) -> None:
    endpoint = await read_twice(tmp_path, reply, concurrency=4)
    assert not endpoint.metrics_available
    assert endpoint.stats.as_dict(endpoint)["prefix_cache_hit_rate"] is None
    assert run_cache_numbers({endpoint.name: endpoint.stats.as_dict(endpoint)}) == {}


def test_with_prefix_caching_off_the_hit_rate_is_unknown_and_nothing_is_warned() -> None:
    off = counted(0, 0, 0) | {"answers": 40}  # vLLM looks nothing up: no query at all
    assert run_cache_numbers({"gpu1:8000": off})["prefix_cache_hit_rate"] is None
    assert cache_warnings({"gpu1:8000": off}) == []


async def test_the_counts_start_at_the_reading_before_the_first_request(tmp_path: Path) -> None:
    """A trial that sends everything before the first scrape: the reading before its first request is
    where its counts start, so the one scrape after (at its end) gives its real hit rate, and what the
    job can reach is the prefix counted then over its replies' prompts."""
    endpoint = endpoint_for(load_job(write_job(tmp_path, concurrency=256)))
    before = parse_metrics(METRICS.format(queries=5000, hits=4000, preemptions=1))
    endpoint.read_before_start(ServerReading("u", 8192, None, True, prefix_tokens=2200, values=before))
    for _ in range(8):
        endpoint.answered(Reply("{}", None, "stop", 2500, 300, None, 1.0), latency_s=1.0)
    after = httpx2.Response(200, text=METRICS.format(queries=25_000, hits=21_600, preemptions=1))
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(lambda request: after)) as http:
        await endpoint.read_server_load(http)
    numbers = endpoint.stats.as_dict(endpoint)
    assert (numbers["prefix_cache_queries"], numbers["prefix_cache_hits"]) == (20_000, 17_600)
    assert (numbers["prefix_cache_hit_rate"], numbers["prefix_cache_reachable"]) == (0.88, 0.88)
    assert cache_warnings({endpoint.name: numbers}) == []
