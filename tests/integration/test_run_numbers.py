"""One run's numbers, the same wherever they are read: the summary line (for a run an error ended, its
last log line), ``status``, ``status --json``, ``report``, ``report --json``, the series' last point, the
runs row and the Prometheus textfile (tests/support/run_numbers.py), and its attempts the requests the
simulator counted. A normal run (with --limit), a run with retries, a run the answer breaker aborted
and a run shorter than one scrape of the server's counters, each against a real `pipeline sim` process.

Before, the summary said 3,892.3 records/min and status 3,948 (two clocks); an aborted run's
``runs.attempts`` was 93 where the server saw 799 requests (summed from what committed);
``pipeline_records_pending`` was 0.0 after a --limit 300 run with 1,191 still pending; status said
6,440 prompt tokens per done record where report said 5,153; the series' last point 2,095.6
records/min where the rest said 1,958.0; and a run of 0.5 s whose reading of the server ran out of
time had no prefix-cache hit rate and no preemptions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.jobs import make_source, write_job
from tests.support.processes import pipeline_command, sim_server, subprocess_env
from tests.support.proxy import round_robin_proxy
from tests.support.run_numbers import assert_said_alike, sim_requests, stored

pytestmark = pytest.mark.integration

QUICK_RETRIES = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05, "reasks": 1}


def run(job: Path, textfile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pipeline_command("run", str(job), "--log-format", "json", "--metrics-textfile", str(textfile), *args),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_normal_run_with_a_limit_says_the_same_numbers_everywhere(tmp_path: Path) -> None:
    with sim_server("--model", "test-model", "--seed", "1", "--latency", "0.02") as url:
        job = write_job(tmp_path, endpoint={"base_url": url})
        make_source(tmp_path / "test.duckdb", 100)
        done = run(job, tmp_path / "run.prom", "--limit", "60")
        assert done.returncode == 0, done.stderr[-2000:]
        requests = sim_requests(url)
    status, numbers = stored(tmp_path / "test.duckdb")
    assert (status, numbers.done, numbers.backlog, numbers.attempts) == ("completed", 60, 40, requests)
    assert_said_alike(job, tmp_path / "test.duckdb", tmp_path / "run.prom", done)


def test_a_run_with_retries_says_the_same_numbers_everywhere(tmp_path: Path) -> None:
    faults = ("--fault-server-error", "0.15", "--fault-invalid-json", "0.1", "--fault-length", "0.05")
    with sim_server("--model", "test-model", "--seed", "3", "--latency", "0.02", *faults) as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, retry=QUICK_RETRIES)
        make_source(tmp_path / "test.duckdb", 150)
        done = run(job, tmp_path / "run.prom")
        assert done.returncode in (0, 1), done.stderr[-2000:]
        requests = sim_requests(url)
    _, numbers = stored(tmp_path / "test.duckdb")
    assert numbers.retries and numbers.attempts > numbers.finished == 150
    assert numbers.attempts == requests
    assert_said_alike(job, tmp_path / "test.duckdb", tmp_path / "run.prom", done)


def test_a_run_the_answer_breaker_aborted_says_the_same_numbers_everywhere(tmp_path: Path) -> None:
    """Every answer invalid: the breaker stops the run with requests in flight; they were sent, and
    count (the row kept only what had committed)."""
    with sim_server(
        "--model", "test-model", "--seed", "5", "--latency", "0.05", "--fault-invalid-json", "1"
    ) as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, retry=QUICK_RETRIES)
        make_source(tmp_path / "test.duckdb", 300)
        done = run(job, tmp_path / "run.prom")
        assert done.returncode == 3, done.stderr[-2000:]
        requests = sim_requests(url)
    status, numbers = stored(tmp_path / "test.duckdb")
    assert status == "aborted" and 0 < numbers.finished < 300
    assert numbers.attempts == requests > 2 * numbers.finished  # re-asked, and in flight at the stop
    assert_said_alike(job, tmp_path / "test.duckdb", tmp_path / "run.prom", done)


def test_a_run_shorter_than_a_scrape_whose_server_reading_ran_late_has_its_hit_rate(tmp_path: Path) -> None:
    """50 records in well under the 5 s between scrapes of the server's counters, behind a proxy that
    answers /tokenize in 1.5 s: the reading of the server before the first request ran out of its
    second, and the run counted its hit rate from nothing (null everywhere)."""
    with (
        sim_server("--profile", "gpt-oss-120b", "--speed", "2000", "--model", "test-model") as url,
        round_robin_proxy([url], late={"/tokenize": 1.5}) as proxy,
    ):
        job = write_job(tmp_path, endpoint={"base_url": proxy})
        make_source(tmp_path / "test.duckdb", 50)
        done = run(job, tmp_path / "run.prom")
        assert done.returncode == 0, done.stderr[-2000:]
    _, numbers = stored(tmp_path / "test.duckdb")
    assert numbers.elapsed_s < 5 and numbers.prefix_cache_hit_rate is not None and numbers.preemptions == 0
    assert_said_alike(job, tmp_path / "test.duckdb", tmp_path / "run.prom", done)
