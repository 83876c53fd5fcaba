"""The bench's /metrics observer, fed through the one HTTP factory's test route."""

from __future__ import annotations

import anyio
import httpx2
import pytest

from pipeline.bench.observer import ServerObservation, watch
from tests.support.fakes import respond
from tests.support.http import routed_to

pytestmark = pytest.mark.anyio

METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m"}} {hits}
"""


async def observe(replies: list[httpx2.Response]) -> ServerObservation:
    """Watch until every reply was read and one more asked for (the interval is 0: no real waiting)."""
    observation = ServerObservation()
    read_all = anyio.Event()

    def answer(_: httpx2.Request) -> httpx2.Response:
        if not replies:
            read_all.set()
            return respond("", 503)
        return replies.pop(0)

    with routed_to(answer):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch, "http://server/metrics", observation, 0.0)
            await read_all.wait()
            tasks.cancel_scope.cancel()
    return observation


async def test_peaks_of_gauges_and_deltas_of_counters_across_the_level() -> None:
    observation = await observe(
        [
            respond(METRICS.format(running=3, queries=100, hits=50)),
            httpx2.Response(502),  # a scrape that fails is skipped, not the end of the watch
            respond(METRICS.format(running=9, queries=300, hits=200)),
        ]
    )
    assert observation.available
    assert observation.peak("vllm:num_requests_running") == 9
    assert observation.prefix_hit_rate == 150 / 200


async def test_a_server_without_metrics_leaves_the_observation_unavailable() -> None:
    observation = await observe([respond("Not Found", 404)] * 3)
    assert not observation.available and observation.peak("vllm:num_requests_running") is None
