"""One run's numbers, the same wherever they are read: the summary line (for a run an error ended, its
last log line), ``status``, ``status --json``, ``report --json``, the runs row and the Prometheus
textfile, and its attempts the requests the simulator counted. A normal run (with --limit), a run with
retries and a run the answer breaker aborted, each against a real `pipeline sim` process.

Before, the summary said 3,892.3 records/min and status 3,948 (two clocks); an aborted run's
``runs.attempts`` was 93 where the server saw 799 requests (summed from what committed); and
``pipeline_records_pending`` was 0.0 after a --limit 300 run with 1,191 still pending."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import orjson
import pytest

from pipeline.store.numbers import RunNumbers
from tests.support.jobs import make_source, write_job
from tests.support.logged_run import json_log_lines
from tests.support.processes import pipeline_command, run_pipeline, sim_server, subprocess_env
from tests.support.run_numbers import prometheus, sim_requests, stored

pytestmark = pytest.mark.integration

SUMMARY = re.compile(
    r"run (\d+) (\w+): ([\d,]+) done, ([\d,]+) failed of ([\d,]+) in [\d:]+ "
    r"\(([\d,.]+) records/min, [\d,]+ output tok/s\)"
)
LAST_RUN = re.compile(
    r"last run: #(\d+) (\w+), started [^,]+, ([\d,]+) done, ([\d,]+) failed, ([\d,]+) requests? sent"
    r"(?:, ([\d,.]+) records/min)?"
)
QUICK_RETRIES = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05, "reasks": 1}


def count(text: str) -> int:
    return int(text.replace(",", ""))


def run(job: Path, textfile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pipeline_command("run", str(job), "--log-format", "json", "--metrics-textfile", str(textfile), *args),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_said_alike(
    job: Path, database: Path, textfile: Path, done: subprocess.CompletedProcess[str]
) -> None:
    status, numbers = stored(database)
    rate = f"{numbers.records_per_min:,.1f}"
    assert_summary_or_last_line(done, status, numbers)
    assert_status(job, status, numbers, rate)
    report = orjson.loads(run_pipeline("report", str(job), "--json").stdout)["runs"][-1]
    assert (report["status"], report["records_per_min"]) == (status, numbers.records_per_min)
    assert RunNumbers.of(report["numbers"]) == numbers
    assert_prometheus(prometheus(textfile), numbers)


def assert_summary_or_last_line(done: subprocess.CompletedProcess[str], status: str, n: RunNumbers) -> None:
    if done.returncode in (0, 1):
        said = SUMMARY.search(done.stdout)
        assert said is not None, done.stdout
        assert said.group(2) == status
        assert [count(said.group(i)) for i in (3, 4, 5)] == [n.done, n.failed, n.pending_at_start]
        assert said.group(6) == f"{n.records_per_min:,.1f}"
        return
    ended = next(line for line in json_log_lines(done.stderr) if line.get("event") == "run ended")
    assert ended["status"] == status
    assert (ended["done"], ended["failed"], ended["attempts"]) == (n.done, n.failed, n.attempts)
    assert ended["records_per_min"] == round(n.records_per_min, 1)


def assert_status(job: Path, status: str, n: RunNumbers, rate: str) -> None:
    text = run_pipeline("status", str(job)).stdout
    said = LAST_RUN.search(text)
    assert said is not None, text
    assert said.group(2) == status
    assert [count(said.group(i)) for i in (3, 4, 5)] == [n.done, n.failed, n.attempts]
    assert said.group(6) == rate
    if n.prefix_cache_hit_rate is not None:
        assert f"prefix-cache hit rate {n.prefix_cache_hit_rate:.0%}" in text
    as_json = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
    assert RunNumbers.of(as_json["last_run"]) == n
    assert as_json["rate_per_min"] == n.records_per_min
    assert as_json["prefix_cache_hit_rate"] == n.prefix_cache_hit_rate
    assert as_json["pending"] == n.backlog  # a plain run after it takes what it left


def assert_prometheus(metrics: dict[str, float], n: RunNumbers) -> None:
    assert metrics["pipeline_records_done_total"] == n.done
    assert metrics["pipeline_records_failed_total"] == n.failed
    for failure_class, failed in n.failures.items():
        assert metrics[f'pipeline_records_failed_total{{class="{failure_class}"}}'] == failed
    assert metrics["pipeline_requests_total"] == n.attempts
    assert metrics["pipeline_retries_total"] == sum(n.retries.values())
    assert metrics["pipeline_request_timeouts_total"] == n.timeouts
    assert metrics["pipeline_prompt_tokens_total"] == n.prompt_tokens
    assert metrics["pipeline_output_tokens_total"] == n.completion_tokens
    assert metrics["pipeline_reasoning_tokens_total"] == n.reasoning_tokens
    assert metrics["pipeline_records_at_start"] == n.pending_at_start
    assert metrics["pipeline_records_remaining"] == n.remaining
    assert metrics["pipeline_records_pending"] == n.backlog
    assert metrics.get("pipeline_prefix_cache_hit_rate") == n.prefix_cache_hit_rate
    assert metrics["pipeline_run_active"] == 0


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
