"""The closed-loop harness's server collapses past its KV cache, as a real one does."""

from __future__ import annotations

from pipeline.bench.closed_loop import Scenario, run_load

# Issue 18's server: room for ~64 requests of the reference shape, --max-num-seqs 512.
KV64 = Scenario("gpt-oss-120b", 900, kv_cache_tokens=120_000, max_num_seqs=512)


def test_throughput_falls_past_the_kv_cache_instead_of_flattening() -> None:
    peak = max(run_load(KV64, level).throughput(300) for level in (48, 64))
    doubled = run_load(KV64, 128).throughput(300)
    assert doubled < 0.6 * peak


def test_without_thrash_the_engine_alone_flattens() -> None:
    flat = Scenario("gpt-oss-120b", 900, kv_cache_tokens=120_000, max_num_seqs=512, thrash=0.0)
    assert run_load(flat, 128).throughput(300) >= 0.95 * run_load(flat, 64).throughput(300)
