"""The second server model: the seeds' curves, held in closed loop at fixed concurrency (the reference
requests: 1,500-token prompts, ~400 generated), and its own fall past the KV cache."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.bench.closed_loop import Scenario, run_load
from pipeline.bench.step_server import SERVERS, StepServer
from pipeline.bench.virtual_clock import VirtualClockLoop
from pipeline.sim.engine import Sequence


def throughput(profile: str, level: int) -> float:
    return run_load(Scenario(profile, 2400, server="steps"), level).throughput(800)


@pytest.mark.parametrize(
    ("profile", "level", "seed"),
    [
        ("gpt-oss-120b", 1, 33.5),
        ("gpt-oss-120b", 64, 373.0),
        ("gpt-oss-120b", 256, 863.0),
        ("gpt-oss-120b", 384, 771.0),
        ("nemotron-super-49b", 8, 45.0),
        ("nemotron-super-49b", 256, 695.0),
        ("nemotron-nano-9b", 8, 153.0),
    ],
)
def test_it_delivers_the_seeds_curve(profile: str, level: int, seed: float) -> None:
    """Within 15%: the closed loop's answers vary around 400 tokens and its prefills are its own."""
    assert throughput(profile, level) == pytest.approx(seed, rel=0.15)


def test_gpt_oss_peaks_near_256_and_falls_at_384() -> None:
    at = {level: throughput("gpt-oss-120b", level) for level in (192, 256, 384)}
    assert at[256] > at[192] and at[384] < 0.95 * at[256]


def test_the_9b_is_flat_past_8_because_its_scheduler_runs_8() -> None:
    assert throughput("nemotron-nano-9b", 16) == pytest.approx(throughput("nemotron-nano-9b", 8), rel=0.03)


def test_the_dense_49b_collapses_past_its_kv_cache() -> None:
    """~260 reference requests fit: 320 deliver about what the seed's 49B did there (515 tok/s)."""
    assert throughput("nemotron-super-49b", 320) < 0.8 * throughput("nemotron-super-49b", 256)


def test_past_the_cache_it_spills_and_slows_without_preempting_or_queueing() -> None:
    """A KV cache for 64 requests and --max-num-seqs 512: at 128 every request runs, the cache shows
    full, none is preempted, and throughput falls under half of what 64 deliver."""
    scenario = Scenario("gpt-oss-120b", 2400, kv_cache_tokens=64 * 1900, max_num_seqs=512, server="steps")
    fits, doubled = run_load(scenario, 64), run_load(scenario, 128)
    assert doubled.throughput(800) < 0.5 * fits.throughput(800)
    assert doubled.preemptions == 0 and doubled.peak_waiting <= 128 and doubled.peak_running == 128


def test_requests_sent_together_are_admitted_a_few_a_step_within_the_prefill_budget() -> None:
    """64 prompts of 2,000 tokens with a budget of 8,192 a step: four a step, the rest wait meanwhile."""
    seen: list[tuple[int, int]] = []

    async def send() -> None:
        server = StepServer(SERVERS["gpt-oss-120b"], clock=asyncio.get_running_loop().time)
        requests = [asyncio.create_task(server.generate(Sequence(2000, 50))) for _ in range(64)]
        for _ in range(3):
            await asyncio.sleep(0.5)  # a step with four prefills takes ~0.45 s
            seen.append((server.metrics.running, server.metrics.waiting))
        await asyncio.gather(*requests)
        seen.append((server.metrics.finished, server.metrics.waiting))

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        runner.run(send())
    assert seen[0][0] < seen[1][0] < seen[2][0] < 64  # more running at each look
    assert all(running + waiting == 64 for running, waiting in seen[:3])
    assert seen[-1] == (64, 0)
