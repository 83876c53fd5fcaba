"""Several servers in one run, against real simulator processes on 127.0.0.1: both used and the faster
does more; one killed mid-run and restarted loses nothing, spends no attempt and rejoins; a server
that refuses response_format; `concurrency: auto` against a calibrated profile; a router in front is
just one endpoint."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.logged_run import json_log_lines as events
from tests.support.processes import pipeline_command, sim_process, subprocess_env, wait_until
from tests.support.proxy import round_robin_proxy

pytestmark = pytest.mark.integration


def run(job: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pipeline_command("run", str(job), "--log-format", "json", *args),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=timeout,
    )


def chat_requests(metrics: dict[str, float]) -> float:
    return metrics["pipeline_sim:chat_requests_total"]


def test_two_servers_are_both_used_and_the_faster_does_more(tmp_path: Path) -> None:
    build_postings(tmp_path / "postings.duckdb", 400)
    with (
        sim_process("--model", "test-model", "--latency", "0.05") as fast,
        sim_process("--model", "test-model", "--latency", "0.25") as slow,
    ):
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": None},
            endpoints=[{"base_url": fast.url, "concurrency": 8}, {"base_url": slow.url, "concurrency": 8}],
        )
        done = run(job)
        assert done.returncode == 0, done.stderr[-2000:]
        by_fast, by_slow = chat_requests(fast.metrics()), chat_requests(slow.metrics())
    assert by_fast + by_slow == 400
    assert by_slow > 20 and by_fast > 2 * by_slow  # both used; the one that answers sooner gets more
    done_rows = table_rows(tmp_path / "postings.duckdb", "SELECT count(*), max(attempts) FROM results")
    assert done_rows == [(400, 1)]
    runs = table_rows(tmp_path / "postings.duckdb", "SELECT base_url, concurrency FROM runs")
    assert runs == [(f"{fast.url}, {slow.url}", 16)]
    started = next(event for event in events(done.stderr) if event.get("event") == "run started")
    assert started["endpoints"] == [f"127.0.0.1:{fast.port}", f"127.0.0.1:{slow.port}"]


def test_a_server_killed_mid_run_and_restarted_costs_nothing_and_rejoins(tmp_path: Path) -> None:
    # 1,600 records at 0.2 s: ~20 s of work, so much is left when the killed server comes back (with
    # 800 at 0.1 s the other server sometimes finished everything before the probe let it rejoin).
    build_postings(tmp_path / "postings.duckdb", 1600)
    with (
        sim_process("--model", "test-model", "--latency", "0.2") as steady,
        sim_process("--model", "test-model", "--latency", "0.2") as flaky,
    ):
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": None},
            endpoints=[{"base_url": steady.url, "concurrency": 8}, {"base_url": flaky.url, "concurrency": 8}],
            retry={"transient_retries": 0},  # an outage that cost an attempt would fail a record
        )
        process = subprocess.Popen(
            pipeline_command("run", str(job), "--log-format", "json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
        )
        # the run is under way on both servers (a real process on a real socket, however loaded the
        # machine), and some way into its work
        wait_until(lambda: chat_requests(flaky.metrics()) >= 40)
        before_kill = chat_requests(flaky.metrics())
        flaky.kill()
        time.sleep(2.0)
        flaky.start()
        _, stderr = process.communicate(timeout=240)
        after_restart = chat_requests(flaky.metrics())  # its counters started again at zero
    assert process.returncode == 0, stderr[-3000:]
    assert before_kill > 0 and after_restart > 0  # used before the kill and again after the restart
    rows = table_rows(tmp_path / "postings.duckdb", "SELECT count(*), max(attempts) FROM results")
    assert rows == [(1600, 1)]  # nothing lost, no attempt spent on the outage
    assert table_rows(tmp_path / "postings.duckdb", "SELECT count(*) FROM failures") == [(0,)]
    names = [event.get("event") for event in events(stderr)]
    assert any(str(name).startswith("endpoint down") for name in names)
    assert "endpoint answers again: back in the rotation" in names


def test_a_server_that_refuses_response_format_gets_the_schema_in_the_prompt(tmp_path: Path) -> None:
    build_postings(tmp_path / "postings.duckdb", 30)
    with sim_process("--model", "test-model", "--reject-response-format") as sim:
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": sim.url, "structured_output": True},
            prompt={"include_schema": False},
        )
        done = run(job)
        requests = chat_requests(sim.metrics())
    assert done.returncode == 0, done.stderr[-2000:]
    rows = table_rows(tmp_path / "postings.duckdb", "SELECT count(*), max(attempts) FROM results")
    assert rows == [(30, 1)]
    assert table_rows(tmp_path / "postings.duckdb", "SELECT count(*) FROM failures") == [(0,)]
    said = [event for event in events(done.stderr) if "refuses response_format" in str(event.get("event"))]
    assert len(said) == 1  # said once
    assert requests <= 30 + 8  # the refused ones (at most one per worker in flight then) were sent again


def test_concurrency_auto_adapts_against_a_calibrated_profile(tmp_path: Path) -> None:
    # ~16 records/s at 8 streams: enough for a few of the controller's windows (15 s at least each)
    build_postings(tmp_path / "postings.duckdb", 800)
    with sim_process("--model", "test-model", "--profile", "nemotron-nano-9b", "--speed", "10") as sim:
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": sim.url},
            concurrency="auto",
            max_concurrency=64,
            max_tokens=512,
        )
        done = run(job, timeout=300)
        peak_waiting = sim.metrics().get("pipeline_sim:peak_requests_waiting", 0.0)
    assert done.returncode == 0, done.stderr[-2000:]
    changes = [event for event in events(done.stderr) if event.get("event") == "concurrency limit changed"]
    assert changes, "the limit never moved"
    assert all(event["reason"] for event in changes)
    assert max(event["new"] for event in changes) <= 64
    # nano runs 8 sequences at once: the limit must not sit far above that, queueing
    assert changes[-1]["new"] <= 16, changes[-3:]
    assert peak_waiting < 64


def test_a_router_in_front_is_just_one_endpoint(tmp_path: Path) -> None:
    build_postings(tmp_path / "postings.duckdb", 100)
    with (
        sim_process("--model", "test-model", "--latency", "0.02") as first,
        sim_process("--model", "test-model", "--latency", "0.02") as second,
        round_robin_proxy([first.url, second.url]) as url,
    ):
        job = write_job(tmp_path, database="postings.duckdb", endpoint={"base_url": url})
        done = run(job)
        split = (chat_requests(first.metrics()), chat_requests(second.metrics()))
    assert done.returncode == 0, done.stderr[-2000:]
    assert sum(split) == 100 and min(split) >= 40  # the router spread them; the run saw one server
    assert table_rows(tmp_path / "postings.duckdb", "SELECT base_url FROM runs") == [(url,)]
