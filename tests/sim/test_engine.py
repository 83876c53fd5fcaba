"""The engine reproduces each profile's published curve when driven at fixed concurrency."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipeline.sim.engine import KV_THRASH, Engine, Sequence
from pipeline.sim.profiles import PROFILES, REFERENCE_OUTPUT_TOKENS, REFERENCE_PROMPT_TOKENS, Profile

pytestmark = pytest.mark.anyio


async def drive(engine: Engine, concurrency: int, per_client: int, prompt: int = REFERENCE_PROMPT_TOKENS,
                output: int = REFERENCE_OUTPUT_TOKENS, shared_prefix: bool = False) -> float:  # fmt: skip
    """Closed loop: ``concurrency`` clients, each sending ``per_client`` requests back to back.
    Returns aggregate output tok/s in virtual time over the steady middle of the run."""
    finished: list[float] = []

    async def client(index: int) -> None:
        for request in range(per_client):
            key = "system" if shared_prefix else f"{index}-{request}"
            sequence = Sequence(prompt, output, prefix_key=key, prefix_tokens=prompt // 2)
            await engine.generate(sequence)
            finished.append(engine.now())

    started = engine.now()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    finished.sort()
    # Skip the first wave (ramp-up): the requests finishing after it, over the time they took.
    start, end = finished[concurrency - 1], finished[-1]
    assert end > start, (started, finished[:3])
    return (len(finished) - concurrency) * output / (end - start)


CASES = [
    ("gpt-oss-120b", [1, 8, 64, 256, 384]),
    ("nemotron-super-49b", [1, 32, 128, 256]),
    ("nemotron-nano-9b", [1, 2, 8]),
]


@pytest.mark.parametrize(("name", "concurrencies"), CASES)
async def test_profile_reproduces_its_curve_within_10_percent(name: str, concurrencies: list[int]) -> None:
    profile = PROFILES[name]
    for concurrency in concurrencies:
        # Fast enough to run in a test, slow enough that event-loop jitter stays below a percent.
        request_s = REFERENCE_OUTPUT_TOKENS * concurrency / profile.measured_at(concurrency)
        engine = Engine(profile, speed=request_s / 0.15)
        measured = await drive(engine, concurrency, per_client=5)
        expected = profile.measured_at(concurrency)
        assert abs(measured - expected) / expected < 0.10, (name, concurrency, measured, expected)


async def test_nano_queues_past_max_num_seqs() -> None:
    profile = PROFILES["nemotron-nano-9b"]
    engine = Engine(profile, speed=400)
    throughput = await drive(engine, 64, per_client=2)
    assert abs(throughput - 153) / 153 < 0.10  # flat: extra requests wait
    assert engine.metrics.peak_running == 8
    assert engine.metrics.peak_waiting >= 50


async def test_kv_cache_limit_preempts_and_collapses() -> None:
    base = PROFILES["gpt-oss-120b"]
    small_kv = Profile("small", base.measured, max_num_seqs=512, kv_cache_tokens=64 * 2000,
                       prefill_tokens_per_s=base.prefill_tokens_per_s)  # fmt: skip
    roomy = await drive(Engine(small_kv, speed=300), 64, per_client=3)
    assert abs(roomy - base.measured_at(64)) / base.measured_at(64) < 0.10  # 64 x 1,900 tokens fit
    tight = Engine(small_kv, speed=300)
    crowded = await drive(tight, 128, per_client=3)
    assert tight.metrics.preemptions > 0
    assert crowded < 0.8 * base.measured_at(128)  # far below what 128 streams give with room to spare
    assert tight.metrics.peak_running < 128
    assert tight.metrics.peak_kv_usage <= 1.0 + 1e-6


async def test_past_the_kv_cache_throughput_falls_with_thrash_and_flattens_without() -> None:
    base = PROFILES["gpt-oss-120b"]
    small_kv = Profile("small", base.measured, max_num_seqs=512, kv_cache_tokens=64 * 2000,
                       prefill_tokens_per_s=base.prefill_tokens_per_s)  # fmt: skip
    peak = await drive(Engine(small_kv, speed=300, thrash=KV_THRASH), 64, per_client=3)
    flattened = await drive(Engine(small_kv, speed=300), 128, per_client=3)
    collapsed = await drive(Engine(small_kv, speed=300, thrash=KV_THRASH), 128, per_client=3)
    assert collapsed < 0.8 * peak  # twice the requests that fit: less than at the fit, not just no more
    assert collapsed < 0.8 * flattened


async def test_prefix_cache_saves_prefill() -> None:
    profile = PROFILES["nemotron-super-49b"]
    cold = Engine(profile, speed=200)
    warm = Engine(profile, speed=200)
    without = await drive(cold, 32, per_client=3, prompt=6000, output=100)
    shared = await drive(warm, 32, per_client=3, prompt=6000, output=100, shared_prefix=True)
    assert warm.metrics.prefix_hits > 0 and cold.metrics.prefix_hits == 0
    assert shared > without


async def test_first_token_waits_for_a_slot() -> None:
    profile = PROFILES["nemotron-nano-9b"]
    engine = Engine(profile, speed=100)
    sequences = [Sequence(100, 50) for _ in range(16)]
    await asyncio.gather(*(engine.generate(s) for s in sequences))
    first = sorted(s.first_token_at or 0 for s in sequences)
    assert first[8] - first[7] > 0.5  # the 9th waited for one of the first 8 to finish


async def test_abort_frees_the_slot() -> None:
    engine = Engine(PROFILES["nemotron-nano-9b"], speed=50)
    long_ones = [asyncio.ensure_future(engine.generate(Sequence(100, 10_000))) for _ in range(8)]
    await asyncio.sleep(0.05)
    assert engine.metrics.running == 8
    for task in long_ones:
        task.cancel()
    started = time.monotonic()
    await engine.generate(Sequence(100, 20))
    assert time.monotonic() - started < 2
    assert engine.metrics.aborted == 8
