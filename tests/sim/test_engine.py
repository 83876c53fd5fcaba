"""The engine reproduces each profile's published curve when driven at fixed concurrency, and holds its
KV cache in blocks with vLLM's prefix cache. On the virtual clock (the closed loop's event loop: a wait for
the engine's next event returns at once, that much later by its clock), so a loaded machine changes
nothing but how long a test takes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from pipeline.bench.virtual_clock import VirtualClockLoop
from pipeline.sim.blocks import BLOCK_SIZE
from pipeline.sim.engine import KV_THRASH, Engine, Sequence
from pipeline.sim.profiles import PROFILES, REFERENCE_OUTPUT_TOKENS, REFERENCE_PROMPT_TOKENS, Profile
from pipeline.sim.tokens import CHARS_PER_TOKEN, block_hashes

T = TypeVar("T")
Scenario = Callable[[Engine], Coroutine[Any, Any, T]]


def run(scenario: Scenario[T], profile: Profile | str = "gpt-oss-120b", **settings: Any) -> tuple[Engine, T]:
    """``scenario`` against an engine of ``profile`` (and ``settings``) on the virtual clock."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        profile = PROFILES[profile] if isinstance(profile, str) else profile
        engine = Engine(profile, clock=runner.get_loop().time, **settings)
        return engine, runner.run(scenario(engine))


def on_virtual_clock(scenario: Scenario[None], **settings: Any) -> Engine:
    return run(scenario, **settings)[0]


def half_shared(prompt: int, record: str) -> tuple[int, ...]:
    """The blocks of a prompt whose first half every request shares and whose second is ``record``'s."""
    shared, own = "s" * (prompt // 2 * CHARS_PER_TOKEN), record * (prompt * CHARS_PER_TOKEN)
    return block_hashes((shared + own)[: prompt * CHARS_PER_TOKEN], BLOCK_SIZE)


def closed_loop(
    concurrency: int,
    per_client: int,
    prompt: int = REFERENCE_PROMPT_TOKENS,
    output: int = REFERENCE_OUTPUT_TOKENS,
    shared_prefix: bool = False,
) -> Scenario[float]:
    """``concurrency`` clients, each sending ``per_client`` requests back to back. The scenario returns
    the aggregate output tok/s over the steady middle of the run."""

    async def scenario(engine: Engine) -> float:
        finished: list[float] = []

        async def client(index: int) -> None:
            for request in range(per_client):
                blocks = half_shared(prompt, f"{index}-{request}") if shared_prefix else ()
                await engine.generate(Sequence(prompt, output, blocks=blocks))
                finished.append(engine.now())

        await asyncio.gather(*(client(i) for i in range(concurrency)))
        finished.sort()
        # Skip the first wave (ramp-up): the requests finishing after it, over the time they took.
        start, end = finished[concurrency - 1], finished[-1]
        assert end > start, finished[:3]
        return (len(finished) - concurrency) * output / (end - start)

    return scenario


CASES = [
    ("gpt-oss-120b", [1, 8, 64, 256, 384]),
    ("nemotron-super-49b", [1, 32, 128, 256]),
    ("nemotron-nano-9b", [1, 2, 8]),
]


@pytest.mark.parametrize(("name", "concurrencies"), CASES)
def test_profile_reproduces_its_curve_within_10_percent(name: str, concurrencies: list[int]) -> None:
    for concurrency in concurrencies:
        _, measured = run(closed_loop(concurrency, per_client=5), name)
        expected = PROFILES[name].measured_at(concurrency)
        assert abs(measured - expected) / expected < 0.10, (name, concurrency, measured, expected)


def test_nano_queues_past_max_num_seqs() -> None:
    engine, throughput = run(closed_loop(64, per_client=2), "nemotron-nano-9b")
    assert abs(throughput - 153) / 153 < 0.10  # flat: extra requests wait
    assert engine.metrics.peak_running == 8
    assert engine.metrics.peak_waiting >= 50


BASE = PROFILES["gpt-oss-120b"]
SMALL_KV = Profile("small", BASE.measured, max_num_seqs=512, kv_cache_tokens=64 * 2000,
                   prefill_tokens_per_s=BASE.prefill_tokens_per_s)  # fmt: skip


def test_kv_cache_limit_preempts_and_collapses() -> None:
    _, roomy = run(closed_loop(64, per_client=3), SMALL_KV)
    assert abs(roomy - BASE.measured_at(64)) / BASE.measured_at(64) < 0.10  # 64 x 1,900 tokens fit
    tight, crowded = run(closed_loop(128, per_client=3), SMALL_KV)
    assert tight.metrics.preemptions > 0
    assert crowded < 0.8 * BASE.measured_at(128)  # far below what 128 streams give with room to spare
    assert tight.metrics.peak_running < 128
    assert tight.metrics.peak_kv_usage <= 1.0 + 1e-6


def test_past_the_kv_cache_throughput_falls_with_thrash_and_flattens_without() -> None:
    _, peak = run(closed_loop(64, per_client=3), SMALL_KV, thrash=KV_THRASH)
    _, flattened = run(closed_loop(128, per_client=3), SMALL_KV)
    _, collapsed = run(closed_loop(128, per_client=3), SMALL_KV, thrash=KV_THRASH)
    assert collapsed < 0.8 * peak  # twice the requests that fit: less than at the fit, not just no more
    assert collapsed < 0.8 * flattened


def test_prefix_cache_saves_prefill() -> None:
    cold, without = run(closed_loop(32, 3, prompt=6000, output=100), "nemotron-super-49b")
    warm, shared = run(closed_loop(32, 3, prompt=6000, output=100, shared_prefix=True), "nemotron-super-49b")
    assert warm.metrics.prefix_hits > 0 and cold.metrics.prefix_hits == 0
    assert shared > without


def test_first_token_waits_for_a_slot() -> None:
    sequences = [Sequence(100, 50) for _ in range(16)]

    async def scenario(engine: Engine) -> None:
        await asyncio.gather(*(engine.generate(s) for s in sequences))

    run(scenario, "nemotron-nano-9b")
    first = sorted(s.first_token_at or 0 for s in sequences)
    assert first[8] - first[7] > 0.5  # the 9th waited for one of the first 8 to finish


def test_abort_frees_the_slot() -> None:
    long_ones = [Sequence(100, 10_000) for _ in range(8)]

    async def scenario(engine: Engine) -> float:
        tasks = [asyncio.ensure_future(engine.generate(s)) for s in long_ones]
        await long_ones[-1].first_token.wait()
        assert engine.metrics.running == 8
        for task in tasks:
            task.cancel()
        started = engine.now()
        await engine.generate(Sequence(100, 20))
        return engine.now() - started

    engine, took = run(scenario, "nemotron-nano-9b")
    assert took < 2  # 20 tokens alone, not after 8 x 10,000
    assert engine.metrics.aborted == 8


# The prefix cache and the KV cache in blocks.

PREFIX_BLOCKS, OWN_TOKENS, ANSWER = 62, 200, 300  # a job: a shared prefix of 62 full blocks (992 tokens)
PROMPT = PREFIX_BLOCKS * BLOCK_SIZE + OWN_TOKENS  # 1,192 tokens: 74 full blocks and 8 tokens
DONE_BLOCKS = -(-(PROMPT + ANSWER) // BLOCK_SIZE)  # 94 blocks held by a request when done


def job_request(index: int, prompt: int = PROMPT, answer: int = ANSWER) -> Sequence:
    """One of a job's requests: the shared prefix, then a record of its own from its first character."""
    prefix = "p" * (PREFIX_BLOCKS * BLOCK_SIZE * CHARS_PER_TOKEN)
    record = chr(0x100 + index) * ((prompt - PREFIX_BLOCKS * BLOCK_SIZE) * CHARS_PER_TOKEN)
    return Sequence(prompt, answer, blocks=block_hashes(prefix + record, BLOCK_SIZE))


def together(requests: list[Sequence]) -> Callable[[Engine], Coroutine[Any, Any, None]]:
    async def scenario(engine: Engine) -> None:
        await asyncio.gather(*(engine.generate(request) for request in requests))

    return scenario


def one_after_another(*requests: Sequence) -> Callable[[Engine], Coroutine[Any, Any, None]]:
    async def scenario(engine: Engine) -> None:
        for request in requests:
            await engine.generate(request)

    return scenario


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_requests_fit_while_the_shared_blocks_and_their_own_fit_and_preempt_just_past(
    prefix_caching: bool,
) -> None:
    """N requests sharing a prefix of S blocks, each holding O more when done, fit while S + N * O <= the
    cache's blocks: at that N none is preempted, one more and the engine preempts. Without prefix
    caching nothing is shared: N * (S + O) <= the blocks."""
    total = PREFIX_BLOCKS + 20 * (DONE_BLOCKS - PREFIX_BLOCKS)  # 702 blocks: 20 such requests fit
    fit = 20 if prefix_caching else total // DONE_BLOCKS  # 7 without sharing
    for n in (fit, fit + 1):
        requests = [job_request(i) for i in range(n)]
        engine = on_virtual_clock(
            together(requests), kv_cache_tokens=total * BLOCK_SIZE, prefix_caching=prefix_caching
        )
        assert engine.metrics.finished == n and engine.cache.total == total
        assert (engine.metrics.preemptions > 0) == (n > fit), (n, engine.metrics)
        # A request preempted and admitted again is looked up again, but vLLM counts only new ones.
        assert engine.metrics.prefix_queries == (n * PROMPT if prefix_caching else 0)
        assert engine.metrics.prompt_tokens == n * PROMPT
    assert engine.metrics.peak_kv_usage <= 1.0


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_the_kv_cache_holds_a_shared_prefix_once_and_keeps_it_cached_after(prefix_caching: bool) -> None:
    """Ten requests admitted together hold the prefix's 62 blocks once and 13 of their own each (their
    prompts' other 12 full blocks and the partial one), in a cache of 1,000 blocks; without prefix
    caching, 75 each. When they are done, their prompts' full blocks stay cached, nobody's."""
    usage: list[float] = []

    async def scenario(engine: Engine) -> None:
        requests = [job_request(i) for i in range(10)]
        running = [asyncio.ensure_future(engine.generate(request)) for request in requests]
        await requests[-1].first_token.wait()  # all ten prefilled, one token generated each
        usage.append(engine.metrics.kv_usage)
        await asyncio.gather(*running)

    engine = on_virtual_clock(scenario, kv_cache_tokens=1000 * BLOCK_SIZE, prefix_caching=prefix_caching)
    prompt_blocks = -(-PROMPT // BLOCK_SIZE)
    held = PREFIX_BLOCKS + 10 * (prompt_blocks - PREFIX_BLOCKS) if prefix_caching else 10 * prompt_blocks
    assert usage == [held / 1000]
    cached = PREFIX_BLOCKS + 10 * (PROMPT // BLOCK_SIZE - PREFIX_BLOCKS) if prefix_caching else 0
    assert (engine.cache.held, engine.cache.evictable, engine.metrics.kv_usage) == (0, cached, 0.0)


def test_hits_count_the_cached_full_blocks_of_a_prompt_as_vllm_counts_them() -> None:
    """The first request finds nothing; the second, another record of the job, its shared prefix; the
    third, the first's re-ask (its prompt and more), every full block of the first's prompt."""
    first, second = job_request(1), job_request(2)
    reask = job_request(1, prompt=PROMPT + 100)
    engine = on_virtual_clock(one_after_another(first, second, reask))
    full_blocks = PROMPT // BLOCK_SIZE
    assert engine.metrics.prefix_queries == 3 * PROMPT + 100
    assert engine.metrics.prefix_hits == (PREFIX_BLOCKS + full_blocks) * BLOCK_SIZE
    off = on_virtual_clock(one_after_another(job_request(1), job_request(2)), prefix_caching=False)
    assert (off.metrics.prefix_queries, off.metrics.prefix_hits) == (0, 0)


def test_a_prompt_all_in_the_cache_still_computes_its_last_block() -> None:
    """vLLM computes a prompt's last token to get the next one: a prompt of whole blocks seen before
    hits all its blocks but the last."""
    prompt = 40 * BLOCK_SIZE
    engine = on_virtual_clock(one_after_another(job_request(1, prompt=prompt), job_request(1, prompt=prompt)))
    assert engine.metrics.prefix_hits == 39 * BLOCK_SIZE


def test_cached_blocks_nobody_holds_are_free_and_evicted_tail_first_when_their_room_is_needed() -> None:
    """A 100-block cache: a first request's 40 prompt blocks stay cached after it; a second of 80 blocks
    is admitted into their room and evicts 21 of them, the prompt's tail first; the first's prompt asked
    again finds the 19 blocks left at its head."""
    width = BLOCK_SIZE * CHARS_PER_TOKEN
    first_text, second_text = "a" * (40 * width), "b" * (80 * width)
    first = Sequence(40 * BLOCK_SIZE + 8, 10, blocks=block_hashes(first_text, BLOCK_SIZE))
    second = Sequence(80 * BLOCK_SIZE + 8, 10, blocks=block_hashes(second_text, BLOCK_SIZE))
    again = Sequence(40 * BLOCK_SIZE + 8, 10, blocks=block_hashes(first_text, BLOCK_SIZE))
    hits: list[int] = []

    async def scenario(engine: Engine) -> None:
        await engine.generate(first)
        assert (engine.cache.held, engine.cache.evictable, engine.metrics.kv_usage) == (0, 40, 0.0)
        await engine.generate(second)
        assert engine.cache.evictions == 21 and engine.metrics.preemptions == 0
        before = engine.metrics.prefix_hits
        await engine.generate(again)
        hits.append(engine.metrics.prefix_hits - before)

    on_virtual_clock(scenario, kv_cache_tokens=100 * BLOCK_SIZE)
    assert hits == [19 * BLOCK_SIZE]
