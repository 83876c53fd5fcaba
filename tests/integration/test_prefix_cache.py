"""The servers' prefix-cache hit rate and preemptions of a run, over HTTP against the simulator process
(vLLM's metric names), into a real DuckDB file: in ``status --json``, the runs table and ``report``,
and a low hit rate warned about once, naming the server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import make_source, table_rows, write_job
from tests.support.processes import REPO, pipeline_command, sim_metrics, sim_server, subprocess_env

pytestmark = pytest.mark.integration

RECORDS = 300
# A shared system prompt far longer than a record: most prompt tokens come from the cache.
SYSTEM = "Extract the posting: its title, its company and where it is. " * 30
WARNING = "prefix-cache hit rate"


def pipeline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pipeline_command(*args), capture_output=True, text=True, timeout=300, env=subprocess_env(), cwd=REPO
    )


def run_against_sim(
    tmp_path: Path, *sim: str
) -> tuple[Path, str, subprocess.CompletedProcess[str], dict[str, float]]:
    """A run of a fixed concurrency long enough for the scrapes (~10 s: every 5 s, once more at the end)."""
    make_source(tmp_path / "test.duckdb", RECORDS)
    with sim_server("--model", "test-model", "--profile", "nemotron-nano-9b", "--speed", "20", *sim) as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, concurrency=8, prompt={"system": SYSTEM})
        run = pipeline("run", str(job))
        server = sim_metrics(url)
    assert run.returncode == 0, run.stderr[-2000:]
    return job, url, run, server


def status_json(job: Path) -> dict[str, Any]:
    status = pipeline("status", str(job), "--json")
    assert status.returncode == 0, status.stderr
    return dict(json.loads(status.stdout))


def test_a_shared_system_prompt_shows_its_hit_rate_in_status_the_runs_table_and_report(
    tmp_path: Path,
) -> None:
    job, _, run, server = run_against_sim(tmp_path)
    status = status_json(job)
    # The server's own ratio counts the run's first seconds too (before the run's first scrape).
    served = server["vllm:prefix_cache_hits_total"] / server["vllm:prefix_cache_queries_total"]
    assert status["prefix_cache_hit_rate"] == pytest.approx(served, abs=0.03)
    assert status["prefix_cache_hit_rate"] > 0.8
    assert (status["preemptions"], status["prefix_cache_warnings"]) == (0, [])
    assert f'"event":"{WARNING}' not in run.stderr
    (series,) = table_rows(tmp_path / "test.duckdb", "SELECT series FROM runs")[0]
    last = json.loads(series)[-1]
    assert last["prefix_cache_hits"] / last["prefix_cache_queries"] == pytest.approx(
        status["prefix_cache_hit_rate"], abs=1e-4
    )
    report = pipeline("report", str(job), "--json")
    assert json.loads(report.stdout)["runs"][-1]["prefix_cache_hit_rate"] == status["prefix_cache_hit_rate"]
    assert (
        f"server:   prefix-cache hit rate {status['prefix_cache_hit_rate']:.0%}"
        in pipeline("status", str(job)).stdout
    )


def test_prefix_caching_off_is_warned_about_once_naming_the_server(tmp_path: Path) -> None:
    # A KV cache just over 3 of these prompts (~610 tokens each): their growing answers preempt some.
    job, url, run, server = run_against_sim(
        tmp_path, "--no-prefix-caching", "--kv-cache-tokens", "1950", "--kv-thrash", "0"
    )
    status = status_json(job)
    expected = (
        "prefix-cache hit rate 0%: the record text may come before the shared part of the prompt, "
        f"or prefix caching is off on {url}"
    )
    assert (status["prefix_cache_hit_rate"], status["prefix_cache_warnings"]) == (0.0, [expected])
    assert run.stderr.count(f'"event":"{WARNING}') == 1, run.stderr[-3000:]
    assert 0 < status["preemptions"] <= server["vllm:num_preemptions_total"]
    assert f"warning:  {expected}" in pipeline("status", str(job)).stdout
