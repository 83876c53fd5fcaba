"""pipeline.servers.capacity and scrape's cache settings: what a server holds and says of itself, the
fit arithmetic a later ``concurrency: auto`` start calls, and the latency model of ``pipeline check``."""

from __future__ import annotations

import httpx2
import pytest

from pipeline.servers.capacity import (
    SCALING_EXPONENT,
    ServerReading,
    aggregate_tokens_per_s,
    effective_concurrency,
    read_server,
    reply_latency_s,
    requests_that_fit,
)
from pipeline.servers.client import ClientSettings, LLMClient
from pipeline.servers.scrape import CacheConfig, parse_cache_config
from tests.support.fakes import Answer, ScriptedServer, error, good_completion, respond, serving

pytestmark = pytest.mark.anyio


def metrics_text(blocks: str = "1000", prefix: str = "True", engines: int = 1) -> str:
    """vLLM's cache settings gauge, one sample per engine."""
    samples = "".join(
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="{prefix}",'
        f'engine="{engine}",num_gpu_blocks="{blocks}"}} 1.0\n'
        for engine in range(engines)
    )
    return "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n" + (
        "# TYPE vllm:cache_config_info gauge\n" + samples
    )


def test_the_cache_settings_come_from_the_info_gauges_labels() -> None:
    cache = parse_cache_config(metrics_text())
    assert cache == CacheConfig(num_gpu_blocks=1000, block_size=16, prefix_caching=True)
    assert cache.kv_tokens == 16_000


def test_several_engines_add_their_blocks_and_prefix_caching_off_is_said() -> None:
    cache = parse_cache_config(metrics_text(prefix="False", engines=2))
    assert cache is not None and cache.kv_tokens == 32_000 and cache.prefix_caching is False


def test_a_server_without_the_gauge_or_with_unprofiled_blocks_gives_no_kv_tokens() -> None:
    assert parse_cache_config("vllm:num_requests_running 3\n") is None
    cache = parse_cache_config(metrics_text(blocks="None"))
    assert cache is not None and cache.kv_tokens is None and cache.block_size == 16


def test_requests_that_fit_are_the_kv_tokens_over_what_one_request_holds() -> None:
    assert requests_that_fit(100_000, prompt_tokens=1500, answer_tokens=500) == 50
    assert requests_that_fit(1000, prompt_tokens=1500, answer_tokens=500) == 0


def test_with_prefix_caching_the_shared_prefix_is_held_once() -> None:
    shared = requests_that_fit(
        100_000, prompt_tokens=1500, answer_tokens=500, shared_prefix_tokens=1000, prefix_caching=True
    )
    assert shared == (100_000 - 1000) // 1000
    unshared = requests_that_fit(100_000, prompt_tokens=1500, answer_tokens=500, shared_prefix_tokens=1000)
    assert unshared == 50  # prefix caching off: every request holds its own copy


def test_a_requests_own_tokens_take_whole_blocks() -> None:
    assert requests_that_fit(16_000, prompt_tokens=10, answer_tokens=7, block_size=16) == 500
    assert requests_that_fit(16_000, prompt_tokens=10, answer_tokens=7) == 941


def test_a_reply_alone_takes_as_long_as_measured_and_slows_as_the_curve_saturates() -> None:
    assert reply_latency_s(25.0, 1) == pytest.approx(25.0)
    at_256 = reply_latency_s(25.0, 256)
    assert 200 < at_256 < 300  # the seed runs: ~4-5 min at c=256 for a reply of ~25 s alone
    assert at_256 == pytest.approx(25.0 * 256 / (863 / 33.5))


def test_past_the_requests_that_fit_the_rest_wait_their_turn() -> None:
    fitting = reply_latency_s(10.0, 85, fit=85)
    assert reply_latency_s(10.0, 256, fit=85) == pytest.approx(fitting * 256 / 85)
    assert effective_concurrency(256, 85) == 85 and effective_concurrency(64, 85) == 64
    assert effective_concurrency(256, None) == 256


def test_aggregate_speed_follows_the_seed_curve() -> None:
    assert aggregate_tokens_per_s(33.5, 256) == pytest.approx(863.0)
    assert aggregate_tokens_per_s(33.5, 1) == pytest.approx(33.5)
    assert 0.5 < SCALING_EXPONENT < 0.7


def vllm_like(request: httpx2.Request) -> Answer:
    if request.url.path == "/metrics":
        return respond(metrics_text(prefix="False"))
    return ScriptedServer([respond(good_completion())], max_model_len=8192, count_tokens=lambda m: 42)(
        request
    )


async def read_at(url: str) -> ServerReading:
    async with LLMClient(ClientSettings(base_url=url, model="test-model")) as client:
        return await read_server(client, [{"role": "system", "content": "x"}], timeout_s=5)


async def test_read_server_reads_the_context_the_kv_cache_and_the_prefix_count() -> None:
    async with serving(vllm_like) as server:
        reading = await read_at(server.url)
    assert reading.context == 8192 and reading.kv_tokens == 16_000 and reading.prefix_caching is False
    assert reading.prefix_tokens == 42 and reading.metrics and reading.time_scale == 1.0


async def test_a_proxy_without_metrics_or_tokenize_leaves_them_unknown() -> None:
    def proxy(request: httpx2.Request) -> Answer:
        if request.url.path == "/metrics":
            return error(404, "Not Found")
        return ScriptedServer([respond(good_completion())])(request)

    async with serving(proxy) as server:
        reading = await read_at(server.url)
    assert reading.kv_tokens is None and reading.prefix_caching is None and not reading.metrics
    assert reading.prefix_tokens is None and reading.context is None


async def test_a_metrics_route_answering_something_else_is_no_metrics() -> None:
    def chat_everywhere(request: httpx2.Request) -> Answer:
        return respond(good_completion())

    async with serving(chat_everywhere) as server:
        reading = await read_at(server.url)
    assert not reading.metrics and reading.kv_tokens is None
