"""The family's server model (pipeline/bench/family_server.py): each axis does what its parameters say,
held at fixed concurrency in the closed loop on the virtual clock (the job's requests: 1,973-token
prompts, 1,000 of them shared, answers of ~327 tokens)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from pipeline.bench.closed_loop import FAMILY, LoadResult, Scenario, Workload, run_load
from pipeline.bench.family_server import FamilyServer, FamilySpec
from pipeline.bench.virtual_clock import VirtualClockLoop
from pipeline.sim.engine import Sequence

JOB = Workload(prompt_tokens=1973, output_tokens=327)
FIT = 16  # of the job's requests the cache holds
#: A cache by tokens for FIT of the job's requests, nothing shared; the scheduler looks at 8x as many.
SERVER = FamilySpec(kv_size=FIT * 2300, prefix_caching=False, max_num_seqs=8 * FIT)


def run(spec: FamilySpec, level: int, duration_s: float = 1200.0, workload: Workload = JOB) -> LoadResult:
    return run_load(Scenario("family", duration_s, workload=workload, server=FAMILY, family=spec), level)


def tokens_per_s(spec: FamilySpec, level: int) -> float:
    """Output tok/s at ``level``, the first third of the run left out (its start)."""
    return run(spec, level).throughput(400.0)


def test_a_queue_without_decline_plateaus_past_the_cache_and_shows_its_queue() -> None:
    server = replace(SERVER, past="queue")
    at_fit, doubled = tokens_per_s(server, FIT), run(server, 2 * FIT)
    assert doubled.throughput(400.0) == pytest.approx(at_fit, rel=0.03)
    assert doubled.peak_running == FIT and doubled.mean_waiting == pytest.approx(FIT, abs=1)
    assert doubled.preemptions == 0


def test_a_decline_keeps_about_fall_to_at_twice_the_cache_and_preempts() -> None:
    at_fit, doubled = tokens_per_s(SERVER, FIT), run(SERVER, 2 * FIT)
    assert 0.4 * at_fit < doubled.throughput(400.0) < 0.6 * at_fit
    assert doubled.peak_running <= FIT + 1 and doubled.mean_waiting > 0.8 * FIT  # vLLM's: the rest wait
    assert doubled.preemptions > doubled.throughput() * 1200 / 327  # more than one a reply


def test_a_cliff_falls_at_once_past_the_cache_where_a_decline_slopes() -> None:
    """A quarter past the cache: a cliff keeps 0.3 of its speed, a decline to 0.3 at twice keeps 0.68. (At
    the fit itself the answers' spread takes a cliff over the edge half the time.)"""
    past = FIT + FIT // 4
    cliff, decline = replace(SERVER, past="cliff", fall_to=0.3), replace(SERVER, fall_to=0.3)
    below = tokens_per_s(cliff, 3 * FIT // 4)
    assert tokens_per_s(cliff, past) < 0.45 * below
    assert tokens_per_s(decline, past) > 0.75 * below


def test_a_server_that_spills_runs_everything_shows_its_cache_full_and_preempts_nothing() -> None:
    spilled = run(replace(SERVER, overflow="spill"), 2 * FIT)
    assert spilled.peak_running == 2 * FIT and spilled.peak_waiting == 0 and spilled.preemptions == 0
    assert spilled.throughput(400.0) < 0.8 * tokens_per_s(SERVER, FIT)  # twice the batch at half the speed


def test_metrics_without_a_queue_count_every_request_as_running() -> None:
    shown = run(replace(SERVER, metrics_queue=False), 2 * FIT)
    assert shown.peak_waiting == 0 and shown.mean_running == pytest.approx(2 * FIT, abs=1)


def test_max_num_seqs_below_the_cache_runs_that_many_and_queues_the_rest() -> None:
    server = replace(SERVER, max_num_seqs=FIT // 2)
    held = run(server, FIT)
    assert held.peak_running == FIT // 2 and held.mean_waiting == pytest.approx(FIT // 2, abs=1)
    assert held.throughput(400.0) == pytest.approx(tokens_per_s(server, FIT // 2), rel=0.03)


def test_by_tokens_longer_prompts_fit_fewer_and_by_requests_as_many() -> None:
    longer = replace(JOB, prompt_tokens=2 * 1973)
    by_tokens = run(replace(SERVER, past="queue"), 2 * FIT, workload=longer)
    by_requests = run(replace(SERVER, past="queue", kv_by="requests", kv_size=FIT), 2 * FIT, workload=longer)
    assert by_tokens.peak_running < 0.7 * FIT and by_requests.peak_running == FIT


def test_a_cache_by_requests_says_its_size_as_its_slots_times_what_it_says_a_slot_holds() -> None:
    said = FamilyServer(replace(SERVER, kv_by="requests", kv_size=FIT, slot_tokens=4096)).kv_cache_tokens
    assert said == FIT * 4096 and FamilyServer(SERVER).kv_cache_tokens == FIT * 2300


def test_prefix_caching_holds_the_shared_prefix_once_so_more_fit_and_counts_its_hits() -> None:
    caching = replace(SERVER, past="queue", prefix_caching=True)
    assert run(caching, 2 * FIT).peak_running > 1.5 * FIT
    assert run(replace(caching, prefix_caching=False), 2 * FIT).peak_running == FIT


def serve(spec: FamilySpec, *requests: tuple[float, int, int]) -> list[float]:
    """The requests (sent at, prompt tokens, answer tokens; a 1,000-token prefix shared) on the virtual
    clock: when each was answered, in their order, then the server's prefix-cache queries and hits."""

    async def send(server: FamilyServer, at: float, prompt: int, answer: int) -> float:
        await asyncio.sleep(at)
        await server.generate(Sequence(prompt, answer))
        return asyncio.get_running_loop().time()

    async def main() -> list[float]:
        server = FamilyServer(spec, prefix_tokens=1000, clock=asyncio.get_running_loop().time)
        answered = await asyncio.gather(*(send(server, *request) for request in requests))
        return [*answered, server.metrics.prefix_queries, server.metrics.prefix_hits]

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main())


def test_one_stream_decodes_at_its_speed_after_its_prefill() -> None:
    spec = replace(SERVER, single_tok_s=20.0, prefill_tok_s=1000.0)
    done, queries, hits = serve(spec, (0.0, 2000, 100))
    assert done == pytest.approx(2.0 + 100 / 20.0)
    assert (queries, hits) == (0, 0)  # without prefix caching nothing is looked up


def test_chunked_prefill_lets_decoding_go_on_while_a_prompt_is_prefilled() -> None:
    """The first request decodes from 2 s; a 4,000-token prompt comes at 3 s. Without chunked prefill
    decoding stops for its 4 s; chunked, it goes on at half its speed while the prefill takes 8 s. The
    first ends at 16 s either way (its 200 tokens at 20 tok/s, 4 s of them given to the prefill)."""
    spec = replace(SERVER, single_tok_s=20.0, half_batch=10**6, prefill_tok_s=1000.0)
    stopped = serve(replace(spec, chunked_prefill=False), (0.0, 2000, 200), (3.0, 4000, 10))
    chunked = serve(spec, (0.0, 2000, 200), (3.0, 4000, 10))
    assert stopped[:2] == pytest.approx([16.0, 7.5]) and chunked[:2] == pytest.approx([16.0, 11.5])


def test_prefix_caching_prefills_the_shared_prefix_once_and_counts_the_hits() -> None:
    spec = replace(SERVER, prefix_caching=True, single_tok_s=20.0, prefill_tok_s=1000.0)
    first, second, queries, hits = serve(spec, (0.0, 2000, 100), (10.0, 2000, 100))
    assert first == pytest.approx(2.0 + 5.0) and second == pytest.approx(10.0 + 1.0 + 5.0)
    assert (queries, hits) == (4000, 1000)


def test_noise_spreads_the_latencies_of_alike_requests_around_the_same_mean() -> None:
    quiet, noisy = run(SERVER, FIT), run(replace(SERVER, noise=0.3), FIT)
    assert noisy.throughput(400.0) == pytest.approx(quiet.throughput(400.0), rel=0.05)
    gaps = [
        later - earlier for (earlier, _), (later, _) in zip(noisy.replies, noisy.replies[1:], strict=False)
    ]
    assert max(gaps) > 3 * (sum(gaps) / len(gaps))


def test_past_its_peak_batch_throughput_falls() -> None:
    server = replace(SERVER, half_batch=512.0, peak_batch=FIT // 2)
    assert tokens_per_s(server, FIT) < 0.9 * tokens_per_s(server, FIT // 2)


@pytest.mark.parametrize("past", ["queue", "decline", "cliff"])
@pytest.mark.parametrize("overflow", ["preempt", "spill"])
def test_its_parameters_say_the_throughput_a_fixed_level_measures(past: str, overflow: str) -> None:
    """Within 5% (the answers' spread aside): a sweep looks for the best level where they say."""
    server = replace(SERVER, past=past, overflow=overflow, prefix_caching=True, kv_size=1000 + FIT * 1300)
    # (at the fit itself the answers' spread takes a cliff over its edge half the time)
    for level in (FIT // 2, 2 * FIT) if past == "cliff" else (FIT // 2, FIT, 2 * FIT):
        said = server.steady_tokens_per_s(level, 1973, 327, 1000)
        assert tokens_per_s(server, level) == pytest.approx(said, rel=0.05), level


def test_a_bad_parameter_is_refused_in_one_line_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^family server past 'wall': one of cliff, decline, queue$"):
        FamilySpec(past="wall")
    with pytest.raises(ValueError, match="kv_size must be positive, not 0"):
        FamilySpec(kv_size=0)


def test_the_family_model_needs_its_parameters() -> None:
    with pytest.raises(ValueError, match="server model 'family': one of sim, steps, family"):
        run_load(Scenario("family", 100.0, server=FAMILY), 4)
