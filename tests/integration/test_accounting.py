"""Honest accounting against a real simulator: every attempt's tokens (re-asks, truncations, failures
included) add up in the runs table to exactly what the server counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.jobs import make_source, table_rows, write_job
from tests.support.processes import pipeline_command, sim_metrics, sim_server, subprocess_env

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
