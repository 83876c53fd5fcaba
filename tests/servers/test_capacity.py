"""pipeline.servers.capacity and scrape's cache settings: what a server holds and says of itself, the
fit arithmetic a later ``concurrency: auto`` start calls, and the latency model of ``pipeline check``."""

from __future__ import annotations

import httpx2
import pytest

from pipeline.servers.capacity import (
    SCALING_EXPONENT,
    RequestFit,
    ServerReading,
    aggregate_tokens_per_s,
    effective_concurrency,
    read_server,
    reply_latency_s,
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


def fit(
    kv_tokens: int,
    prompt: float,
    answer: float,
    shared: float = 0,
    caching: bool = False,
    block_size: int = 16,
) -> RequestFit:
    return RequestFit(kv_tokens, prompt, answer, shared, prefix_caching=caching, block_size=block_size)


def test_without_prefix_caching_each_request_holds_its_prompt_and_answer_in_whole_blocks() -> None:
    # 131,072 tokens = 8,192 blocks; 1,500 + 500 tokens = 125 blocks each, the prefix not shared
    assert fit(131_072, 1500, 500, shared=1000).requests == 8192 // 125 == 65
    assert fit(131_072, 1500, 500, shared=1000).shared_blocks == 0
    # 10 + 7 tokens take 2 blocks: 16,000 tokens hold 500 such requests, not 941
    assert fit(16_000, 10, 7).requests == 500 and fit(16_000, 10, 7).own_tokens == 32


def test_with_prefix_caching_the_full_blocks_of_the_shared_prefix_are_held_once() -> None:
    # 1,000 shared tokens are 62 full blocks (992 tokens); the 8 left over share a block with the record
    shared = fit(131_072, 1500, 500, shared=1000, caching=True)
    assert (shared.shared_blocks, shared.own_blocks) == (62, 125 - 62)
    assert shared.requests == (8192 - 62) // 63 == 129
    # A prefix of whole blocks: all of it held once
    whole = fit(131_072, 1500, 500, shared=1008, caching=True)
    assert (whole.shared_blocks, whole.own_blocks, whole.requests) == (63, 62, (8192 - 63) // 62)


def test_at_a_4096_token_context_the_margins_are_whole_requests() -> None:
    """A 4,096-token KV cache (256 blocks): the last block decides whether one more request fits."""
    assert fit(4096, 2000, 48).requests == 2  # 128 blocks each: exactly two
    assert fit(4096, 2000, 49).requests == 1  # one token more: 129 blocks, two no longer fit
    assert fit(4096, 4000, 200).requests == 0  # not one
    cached = fit(4096, 2000, 49, shared=1600, caching=True)  # 100 blocks held once, 29 each
    assert cached.requests == (256 - 100) // 29 == 5


def test_requests_as_long_as_a_4096_or_a_131072_token_context() -> None:
    """A request filling its context holds all of it at its peak: 4,096 tokens are 256 blocks, 131,072
    are 8,192; a long shared prefix held once leaves room for more of them."""
    assert fit(300_000, 3000, 1096).requests == 18_750 // 256 == 73
    assert fit(300_000, 3000, 1096, shared=2900, caching=True).requests == (18_750 - 181) // 75 == 247
    assert fit(300_000, 120_000, 11_072).requests == 18_750 // 8192 == 2
    long_prefix = fit(300_000, 120_000, 11_072, shared=100_000, caching=True)
    assert (long_prefix.shared_blocks, long_prefix.own_blocks) == (6250, 8192 - 6250)
    assert long_prefix.requests == (18_750 - 6250) // 1942 == 6


def test_the_blocks_are_the_servers_own_size() -> None:
    """vLLM's CPU build uses blocks of 128: a prefix of 3,094 tokens is 24 full blocks (3,072 tokens)."""
    cpu = fit(23_296, 3269, 706, shared=3094, caching=True, block_size=128)
    assert (cpu.shared_blocks, cpu.own_blocks) == (24, 32 - 24)
    assert cpu.requests == (182 - 24) // 8 == 19
    assert cpu.held == (
        "~1,024 tokens each of its own, for ~3,269 prompt and ~706 answer tokens, "
        "3,072 prefix tokens held once"
    )


def test_a_prefix_longer_than_the_prompt_counted_shares_no_more_than_the_prompt() -> None:
    assert fit(160_000, 800, 200, shared=1000, caching=True).shared_blocks == 50


def test_the_fit_of_a_reading_takes_the_servers_blocks_and_measured_replies_count_it_again() -> None:
    reading = ServerReading(
        "http://x/v1", 4096, CacheConfig(1000, 128, True), metrics=True, prefix_tokens=1000
    )
    before = RequestFit.of_reading(reading, answer_tokens=4096)
    assert before is not None and before.block_size == 128 and before.prompt_tokens == 1000
    assert before.shared_blocks == 7 and before.requests == (1000 - 7) // (40 - 7)
    after = before.measured(1800.0, 300.0)
    assert after.requests == (1000 - 7) // (17 - 7)
    assert RequestFit.of_reading(reading, answer_tokens=None) is None


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
