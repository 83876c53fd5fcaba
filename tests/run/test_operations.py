"""`pipeline run` unattended: one run per job, the stall watchdog's exit code, retrying chosen failure
classes, and metrics for monitoring — through the CLI, against a real simulator process."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import duckdb
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.jobs import make_source, table_rows, write_job
from tests.support.logged_run import wait_for_snapshot
from tests.support.processes import REPO, pipeline_command, run_pipeline, sim_server, subprocess_env

pytestmark = pytest.mark.process  # `pipeline run` processes against a simulator process


def start_run(job: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        pipeline_command("run", str(job), "--log-format", "json", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=REPO,
    )


def test_a_second_run_of_the_same_job_exits_4_naming_the_running_pid(tmp_path: Path) -> None:
    with sim_server("--model", "test-model", "--latency", "0.3") as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, concurrency=2)
        make_source(tmp_path / "test.duckdb", 300)
        first = start_run(job)
        try:
            wait_for_snapshot(tmp_path / "test.duckdb", first)
            second = run_pipeline("run", str(job))
            load = run_pipeline("load", str(tmp_path / "nothing.csv"), "--job", str(job))
        finally:
            first.send_signal(signal.SIGTERM)
            first.communicate(timeout=60)
    assert second.returncode == 4
    assert second.stderr.strip() == (
        f"error: {tmp_path / 'test.duckdb'}: this job is already running (pid {first.pid}); wait for it to "
        "end, or stop it with `kill -TERM` and run again to resume"
    )
    assert load.returncode != 0 and f"already running (pid {first.pid})" in load.stderr
    assert "Traceback" not in second.stderr + load.stderr
    assert first.returncode == 130  # the first run was not disturbed, and stopped cleanly on SIGTERM


def test_the_stall_watchdog_warns_then_ends_the_run_with_exit_5(tmp_path: Path) -> None:
    with sim_server("--model", "test-model", "--fault-hang", "1.0") as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, concurrency=3, request_timeout_s=600)
        make_source(tmp_path / "test.duckdb", 10)
        started = time.monotonic()
        result = run_pipeline(
            "run", str(job), "--log-format", "json", "--stall-warning", "1", "--stall-abort", "3"
        )
    assert result.returncode == 5, result.stderr[-2000:]
    assert time.monotonic() - started < 30  # not the 600 s request timeout
    events = [orjson.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    warning = next(e for e in events if e["event"] == "stalled: requests in flight but none answered")
    assert warning["in_flight"] == 3 and warning["oldest_request_age_s"] >= 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: stalled: 3 requests in flight and no answer")
    )
    assert table_rows(tmp_path / "test.duckdb", "SELECT status FROM runs") == [("stalled",)]


def test_retry_failed_by_class_retries_only_that_class(tmp_path: Path) -> None:
    with sim_server("--model", "test-model") as url:
        job = write_job(tmp_path, endpoint={"base_url": url})
        make_source(tmp_path / "test.duckdb", 6)
        assert run_pipeline("run", str(job), "--limit", "1").returncode == 0
        with duckdb.connect(str(tmp_path / "test.duckdb")) as connection:
            connection.execute(
                "INSERT INTO failures (record_id, failure_class, message) VALUES (1, 'truncated', 'x'), "
                "(2, 'truncated', 'x'), (3, 'schema_invalid', 'x'), (4, 'permanent', 'x')"
            )
        retried = run_pipeline("run", str(job), "--retry-failed", "--class", "truncated")
        bad = run_pipeline("run", str(job), "--retry-failed", "--class", "truncate")
    assert retried.returncode == 0, retried.stderr[-2000:]
    done = {row[0] for row in table_rows(tmp_path / "test.duckdb", "SELECT record_id FROM results")}
    assert done == {0, 1, 2, 5}  # the two truncated ones and the never-tried 5
    failed = table_rows(tmp_path / "test.duckdb", "SELECT record_id, failure_class FROM failures ORDER BY 1")
    assert failed == [(3, "schema_invalid"), (4, "permanent")]
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "error: --class 'truncate': unknown failure class; use one of "
        "invalid_json, schema_invalid, truncated, too_long, empty, permanent"
    )


def test_metrics_textfile_holds_the_final_numbers(tmp_path: Path) -> None:
    textfile = tmp_path / "pipeline.prom"
    with sim_server("--model", "test-model", "--fault-context-length", "0.2", "--seed", "3") as url:
        job = write_job(tmp_path, endpoint={"base_url": url})
        make_source(tmp_path / "test.duckdb", 40)
        result = run_pipeline("run", str(job), "--metrics-textfile", str(textfile))
    assert result.returncode == 1  # some records failed (context length)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(textfile.read_text())
        for sample in family.samples
    }
    done = table_rows(tmp_path / "test.duckdb", "SELECT count(*) FROM results")[0][0]
    assert samples[("pipeline_records_done_total", (("job", "test"),))] == done
    failed = samples[("pipeline_records_failed_total", (("class", "permanent"), ("job", "test")))]
    assert failed == 40 - done > 0
    assert samples[("pipeline_run_active", (("job", "test"),))] == 0
    assert samples[("pipeline_request_latency_seconds_count", (("job", "test"),))] == 40


def test_a_metrics_port_in_use_is_a_configuration_error(tmp_path: Path) -> None:
    with socket.socket() as taken, sim_server("--model", "test-model") as url:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job = write_job(tmp_path, endpoint={"base_url": url})
        make_source(tmp_path / "test.duckdb", 5)
        result = run_pipeline("run", str(job), "--metrics-port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: --metrics-port {port}: address already in use"
    assert table_rows(tmp_path / "test.duckdb", "SELECT count(*) FROM results") == [(0,)]


def test_metrics_host_beyond_loopback_warns_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    with sim_server("--model", "test-model") as url:
        job = write_job(tmp_path, endpoint={"base_url": url})
        make_source(tmp_path / "test.duckdb", 5)
        bad = run_pipeline("run", str(job), "--metrics-port", "0", "--metrics-host", "my host")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1
        assert bad.stderr.startswith("error: --metrics-host: 'my host' must be an IP address or a host name")
        wide = run_pipeline("run", str(job), "--metrics-port", "0", "--metrics-host", "0.0.0.0")
    assert wide.returncode == 0, wide.stderr
    events = [orjson.loads(line) for line in wide.stderr.splitlines()]
    warned = [event for event in events if "without authentication" in event["event"]]
    assert len(warned) == 1 and warned[0]["level"] == "warning"
    assert warned[0]["url"].startswith("http://0.0.0.0:")
