"""The simulator's /metrics speaks vLLM: the names the pipeline reads, their types, the cache settings as
vLLM's ``cache_config_info`` labels, prefix caching that can be off, and a KV cache sized in tokens."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.servers.scrape import (
    CACHE_CONFIG_INFO,
    CACHE_CONFIG_LABELS,
    RELIED_ON,
    parse_cache_config,
    parse_metrics,
)
from pipeline.sim import SimConfig, SimServer
from pipeline.sim.blocks import BLOCK_SIZE
from pipeline.sim.http import serve
from pipeline.sim.metrics import CacheConfig

pytestmark = pytest.mark.anyio

SHARED_SYSTEM = "Extract the posting's fields. " * 40  # a long prefix every request shares


def samples(text: str) -> dict[str, tuple[str, dict[str, str], float]]:
    """Each sample by name: its family's type, its labels, its value (as Prometheus parses it)."""
    return {
        sample.name: (family.type, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def cache_labels(text: str) -> dict[str, str]:
    return samples(text)[CACHE_CONFIG_INFO][1]


async def metrics_after(config: SimConfig, requests: int, **body: Any) -> tuple[str, SimServer]:
    """/metrics once ``requests`` requests with one shared system prompt have been answered together."""
    sim = SimServer(config)
    server = await serve(sim.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    chat = {
        "model": "m",
        "messages": [{"role": "system", "content": SHARED_SYSTEM}, {"role": "user", "content": "A posting."}],
        "max_tokens": 400,
        **body,
    }
    async with server, httpx2.AsyncClient(base_url=url, timeout=60) as client:
        async with anyio.create_task_group() as group:
            for _ in range(requests):
                group.start_soon(functools.partial(client.post, "/v1/chat/completions", json=chat))
        return (await client.get("/metrics")).text, sim


def test_cache_config_labels_are_written_as_vllm_writes_them() -> None:
    labels = CacheConfig(kv_tokens=128_000, prefix_caching=False).labels()
    assert labels["num_gpu_blocks"] == "8000" and labels["block_size"] == str(BLOCK_SIZE) == "16"
    assert labels["enable_prefix_caching"] == "False" and labels["kv_cache_size_tokens"] == "128000"
    unsized = CacheConfig(kv_tokens=None, prefix_caching=True).labels()
    assert unsized["num_gpu_blocks"] == "None" and unsized["enable_prefix_caching"] == "True"


async def test_every_name_the_pipeline_relies_on_is_there_with_vllms_type() -> None:
    text, _ = await metrics_after(SimConfig(model="m", profile="nemotron-nano-9b", speed=200), 2)
    found = samples(text)
    assert set(RELIED_ON) <= set(found)
    for name in RELIED_ON:
        kind = "counter" if name.endswith("_total") else "gauge"
        assert found[name][0] == kind, name
    assert set(CACHE_CONFIG_LABELS) <= set(cache_labels(text))
    assert found[CACHE_CONFIG_INFO][2] == 1.0
    assert parse_metrics(text)["vllm:prefix_cache_queries"] > 0  # the pipeline's own parser reads them


async def test_prefix_caching_on_hits_the_shared_system_prompt() -> None:
    text, _ = await metrics_after(SimConfig(model="m", profile="nemotron-nano-9b", speed=200), 4)
    values = parse_metrics(text)
    assert 0 < values["vllm:prefix_cache_hits"] < values["vllm:prefix_cache_queries"]
    assert cache_labels(text)["enable_prefix_caching"] == "True"


async def test_without_prefix_caching_nothing_is_looked_up_and_every_prompt_token_is_prefilled() -> None:
    config = SimConfig(model="m", profile="nemotron-nano-9b", speed=200, prefix_caching=False)
    text, sim = await metrics_after(config, 4)
    values = parse_metrics(text)
    # vLLM skips the lookup when prefix caching is off: neither counter moves.
    assert values["vllm:prefix_cache_hits"] == 0 and values["vllm:prefix_cache_queries"] == 0
    assert cache_labels(text)["enable_prefix_caching"] == "False"
    assert sim.engine is not None and sim.engine.metrics.prompt_tokens == sim.metrics.prompt_tokens > 0


async def test_kv_tokens_size_the_cache_in_blocks_and_preempt_by_the_tokens_held() -> None:
    """Four requests of ~1,540 tokens each (a 540-token prompt + 1,000 generated) in a cache of 2,400
    tokens: all four prompts are admitted (as vLLM admits by the prompt), and as their answers grow
    only one fits by its tokens, however many the engine may run: it preempts. The blocks: 2,400 / 16."""
    config = SimConfig(model="m", profile="nemotron-nano-9b", speed=400, kv_cache_tokens=2400)
    text, sim = await metrics_after(config, 4, max_tokens=1000, ignore_eos=True)
    labels = cache_labels(text)
    assert (labels["num_gpu_blocks"], labels["block_size"]) == ("150", "16")
    assert sim.engine is not None and sim.engine.metrics.peak_kv_usage <= 1.0 + 1e-6
    assert parse_metrics(text)["vllm:num_preemptions"] == sim.engine.metrics.preemptions > 0
    roomy, _ = await metrics_after(SimConfig(model="m", profile="nemotron-nano-9b", speed=400), 4,
                                   max_tokens=1000, ignore_eos=True)  # fmt: skip
    assert parse_metrics(roomy)["vllm:num_preemptions"] == 0


async def test_without_an_engine_the_cache_size_is_unset() -> None:
    text, _ = await metrics_after(SimConfig(model="m"), 1)
    assert cache_labels(text)["num_gpu_blocks"] == "None"
    assert parse_metrics(text)["vllm:num_preemptions"] == 0


def test_the_pipelines_reader_of_the_cache_settings_reads_the_simulators() -> None:
    """What `pipeline check` reads of a server, read off the simulator: its KV in tokens, caching."""
    config = SimConfig(model="m", profile="gpt-oss-120b", kv_cache_tokens=120_000, prefix_caching=False)
    read = parse_cache_config(SimServer(config).prometheus().decode())
    assert read is not None and (read.kv_tokens, read.prefix_caching) == (120_000, False)
