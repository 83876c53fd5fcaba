"""Honest accounting against a real simulator: every attempt's tokens (re-asks, truncations, failures
included) add up in the runs table to exactly what the server counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.jobs import make_source, table_rows, write_job
from tests.support.logged_run import Run
from tests.support.processes import (
    pipeline_command,
    run_pipeline,
    sim_metrics,
    sim_server,
    subprocess_env,
    wait_until,
)

pytestmark = pytest.mark.integration

FAULTS = (
    *("--fault-invalid-json", "0.1", "--fault-schema-invalid", "0.1", "--fault-length", "0.1"),
    *("--fault-server-error", "0.05", "--fault-context-length", "0.02"),
)


def test_token_totals_equal_the_sum_over_attempts_at_the_server(tmp_path: Path) -> None:
    import subprocess

    with sim_server("--model", "test-model", "--seed", "5", *FAULTS) as url:
        job = write_job(
            tmp_path,
            endpoint={"base_url": url},
            concurrency=16,
            retry={"backoff_initial_s": 0.01, "backoff_max_s": 0.05, "reasks": 1},
        )
        make_source(tmp_path / "test.duckdb", 300)
        for _ in range(2):  # the second run retries the transient failures, if any
            done = subprocess.run(
                pipeline_command("run", str(job), "--log-format", "json"),
                env=subprocess_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode in (0, 1), done.stderr[-2000:]
        server = sim_metrics(url)
    runs = table_rows(
        tmp_path / "test.duckdb",
        "SELECT sum(attempts), sum(prompt_tokens), sum(completion_tokens), sum(reasoning_tokens) FROM runs",
    )[0]
    assert runs[0] == server["pipeline_sim:chat_requests_total"]
    assert runs[1] == server["vllm:prompt_tokens_total"]
    assert runs[2] == server["vllm:generation_tokens_total"]
    assert runs[3] == server["pipeline_sim:reasoning_tokens_total"]
    assert runs[0] > 300 and runs[1] > 0  # the faults made some records take several attempts
    per_record = table_rows(
        tmp_path / "test.duckdb",
        "SELECT (SELECT sum(total_prompt_tokens) FROM results) + (SELECT sum(prompt_tokens) FROM failures)",
    )[0][0]
    # what the rows carry is what the runs counted, less what earlier tries of redone records spent
    assert 0 < per_record <= runs[1]


def added_up(report: dict[str, Any]) -> int:
    return int(report["done"] + sum(report["failed"].values()) + report["pending"])


def test_status_counts_each_record_once_during_and_after_a_run(tmp_path: Path) -> None:
    """Against the simulator with 5xx (transient, not retried here) and invalid answers (permanent):
    done + failed + pending is the source's records, while a run holds the database (every count from
    its read copy) and after it. Before, each transient failure was counted as failed and as pending
    (888 + 49 + 1,611 of 2,499 records)."""
    faults = ("--fault-server-error", "0.1", "--fault-invalid-json", "0.1", "--latency", "0.05")
    with sim_server("--model", "test-model", "--seed", "7", *faults) as url:
        job = write_job(
            tmp_path,
            endpoint={"base_url": url},
            concurrency=4,
            retry={"transient_retries": 0, "reasks": 0, "abort_after_consecutive_failures": 1000},
            operations={"snapshot_interval_s": 1},
        )
        make_source(tmp_path / "test.duckdb", 400)
        run = Run(job)
        run.wait_for("run started")
        wait_until(lambda: (tmp_path / "test.duckdb.read.duckdb").exists(), timeout_s=60)
        during = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
        assert run.process.poll() is None, "the run ended before status read its copy"
        assert run.finish() == 1  # finished with failures
    assert during["read_copy"] is not None and during["source_records"] == 400
    assert added_up(during) == 400, during
    assert not {"done", "failed", "remaining"} & set(during["live"] or {})  # one snapshot's counts
    after = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
    stored = dict(
        table_rows(tmp_path / "test.duckdb", "SELECT failure_class, count(*) FROM failures GROUP BY 1")
    )
    assert stored["transient"] > 0 and stored["invalid_json"] > 0
    assert after["failed"] == {"invalid_json": stored["invalid_json"]}  # a plain run retries the rest
    assert after["pending"] == after["pending_retried"]["transient"] == stored["transient"]
    assert added_up(after) == 400 and after["done"] == 400 - sum(stored.values())
