"""The servers' prefix-cache hit rate and preemptions of a run, over HTTP against the simulator process
(vLLM's metric names), into a real DuckDB file: in ``status --json``, the runs table and ``report``,
counted from before the first request (a trial that ends before the first scrape has its real rate), a
hit rate low for what the job can reach warned about once, naming the server, and with prefix caching
off no rate at all."""

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
    tmp_path: Path, *sim: str, speed: str = "20", run: tuple[str, ...] = (), **job: Any
) -> tuple[Path, str, subprocess.CompletedProcess[str], dict[str, float]]:
    """A run of a fixed concurrency long enough for the scrapes (~10 s: every 5 s, once more at the end),
    against a simulator of its own (its counters are this run's alone)."""
    make_source(tmp_path / "test.duckdb", RECORDS)
    with sim_server("--model", "test-model", "--profile", "nemotron-nano-9b", "--speed", speed, *sim) as url:
        job = {"concurrency": 8, "prompt": {"system": SYSTEM}} | job
        path = write_job(tmp_path, endpoint={"base_url": url}, **job)
        done = pipeline("run", str(path), *run)
        server = sim_metrics(url)
    assert done.returncode == 0, done.stderr[-2000:]
    return path, url, done, server


def status_json(job: Path) -> dict[str, Any]:
    status = pipeline("status", str(job), "--json")
    assert status.returncode == 0, status.stderr
    return dict(json.loads(status.stdout))


def test_a_shared_system_prompt_shows_its_hit_rate_in_status_the_runs_table_and_report(
    tmp_path: Path,
) -> None:
    job, _, run, server = run_against_sim(tmp_path)
    status = status_json(job)
    # Counted from before the run's first request: the server's own ratio, its first seconds included.
    served = server["vllm:prefix_cache_hits_total"] / server["vllm:prefix_cache_queries_total"]
    assert status["prefix_cache_hit_rate"] == pytest.approx(served, abs=1e-4)
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


def test_a_trial_smaller_than_its_concurrency_has_the_servers_real_hit_rate(tmp_path: Path) -> None:
    """40 records at c=64 are all sent at once and answered before the run's first scrape: the reading
    before the first request is where the counts start, so the run has the rate the server served."""
    job, _, run, server = run_against_sim(tmp_path, speed="200", run=("--limit", "40"), concurrency=64)
    status = status_json(job)
    served = server["vllm:prefix_cache_hits_total"] / server["vllm:prefix_cache_queries_total"]
    assert status["done"] == 40 and served > 0.8
    assert status["prefix_cache_hit_rate"] == pytest.approx(served, abs=1e-4)
    assert status["prefix_cache_warnings"] == [] and WARNING not in run.stderr


def test_a_rate_low_for_what_the_job_can_reach_is_warned_about_once_naming_the_server(
    tmp_path: Path,
) -> None:
    """The instructions after the record: the job's fixed part is most of its prompt, but requests share
    only the system prompt (and the schema in it) with each other, so the cache serves far less."""
    user = "{title}\n{description}\n\n" + SYSTEM
    job, url, run, _ = run_against_sim(tmp_path, prompt={"system": "Extract.", "user": user})
    status = status_json(job)
    (warning,) = status["prefix_cache_warnings"]
    assert status["prefix_cache_hit_rate"] < 0.5 and warning.startswith(
        f"prefix-cache hit rate {status['prefix_cache_hit_rate']:.0%} where this job's shared prefix is"
    )
    assert f"{url} evicts the prefix" in warning and run.stderr.count(f'"event":"{WARNING}') == 1
    assert f"warning:  {warning}" in pipeline("status", str(job)).stdout


def test_with_prefix_caching_off_the_rate_is_unknown_not_zero_and_nothing_is_warned(tmp_path: Path) -> None:
    # A KV cache just over 3 of these prompts (~610 tokens each): their growing answers preempt some.
    job, _, run, server = run_against_sim(
        tmp_path, "--no-prefix-caching", "--kv-cache-tokens", "1950", "--kv-thrash", "0"
    )
    status = status_json(job)
    assert (status["prefix_cache_hit_rate"], status["prefix_cache_warnings"]) == (None, [])
    assert WARNING not in run.stderr and WARNING not in pipeline("status", str(job)).stdout
    assert 0 < status["preemptions"] <= server["vllm:num_preemptions_total"]
