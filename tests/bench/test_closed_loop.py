"""The closed-loop harness's server collapses past its KV cache, as a real one does, and a policy that
fails fails the run."""

from __future__ import annotations

import pytest

from pipeline.bench.closed_loop import Scenario, run_load
from pipeline.bench.shared_server import Job, run_jobs
from pipeline.servers.limits import AdaptiveLimit

# Issue 18's server: room for ~64 requests of the reference shape, --max-num-seqs 512.
KV64 = Scenario("gpt-oss-120b", 900, kv_cache_tokens=120_000, max_num_seqs=512)


def test_throughput_falls_past_the_kv_cache_instead_of_flattening() -> None:
    peak = max(run_load(KV64, level).throughput(300) for level in (48, 64))
    doubled = run_load(KV64, 128).throughput(300)
    assert doubled < 0.6 * peak


def test_without_thrash_the_engine_alone_flattens() -> None:
    flat = Scenario("gpt-oss-120b", 900, kv_cache_tokens=120_000, max_num_seqs=512, thrash=0.0)
    assert run_load(flat, 128).throughput(300) >= 0.95 * run_load(flat, 64).throughput(300)


def test_a_controller_that_fails_fails_the_run_not_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that raised would otherwise leave the run going at its last limit, and the benchmark would
    print numbers for a policy that never ran."""

    def broken(self: AdaptiveLimit, *, in_flight: int | None = None, waiting: int = 0) -> None:
        raise NameError("shared")

    monkeypatch.setattr(AdaptiveLimit, "update", broken)
    with pytest.raises(NameError, match="shared"):
        run_load(Scenario("gpt-oss-120b", 300, fit_start=True))
    with pytest.raises(NameError, match="shared"):
        run_jobs(Scenario("gpt-oss-120b", 300, fit_start=True), [Job(50), Job(50)])
