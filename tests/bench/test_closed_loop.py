"""The closed-loop harness's server collapses past its KV cache, as a real one does."""

from __future__ import annotations

from pipeline.bench.closed_loop import Scenario, run_jobs, run_load

# Issue 18's server: room for ~64 requests of the reference shape, --max-num-seqs 512.
KV64 = Scenario("gpt-oss-120b", 900, kv_cache_tokens=120_000, max_num_seqs=512)


def test_throughput_falls_past_the_kv_cache_instead_of_flattening() -> None:
    peak = max(run_load(KV64, level).throughput(300) for level in (48, 64))
    doubled = run_load(KV64, 128).throughput(300)
    assert doubled < 0.6 * peak


def test_without_thrash_the_engine_alone_flattens() -> None:
    flat = Scenario("gpt-oss-120b", 900, kv_cache_tokens=120_000, max_num_seqs=512, thrash=0.0)
    assert run_load(flat, 128).throughput(300) >= 0.95 * run_load(flat, 64).throughput(300)


def test_two_auto_jobs_on_one_server_finish_together_and_as_fast_as_one_of_both() -> None:
    server = Scenario(
        "gpt-oss-120b", 20_000, kv_cache_tokens=64 * 1900, max_num_seqs=512, fit_start=True, speed=10
    )
    (alone,) = run_jobs(server, [(1200, None)])
    first, second = run_jobs(server, [(600, None), (600, None)])
    assert alone.finished and first.finished and second.finished
    slower, faster = max(first.duration_s, second.duration_s), min(first.duration_s, second.duration_s)
    assert slower <= 1.25 * faster
    assert 1200 / slower >= 0.9 * alone.records_per_s
    # Neither climbed past the fit, nor stayed far above its share once it saw the other.
    assert max(first.peak_limit, second.peak_limit) <= 64
