"""≥ 5,000 records at c=256 over HTTP to a real server process, into a real DuckDB file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.processes import REPO, pipeline_command, sim_metric, sim_server, subprocess_env

pytestmark = pytest.mark.integration

RECORDS = 6000
FAULTS = (
    *("--fault-server-error", "0.01", "--fault-reset", "0.005", "--fault-invalid-json", "0.01"),
    *("--fault-schema-invalid", "0.01", "--fault-length", "0.005", "--fault-context-length", "0.003"),
)


def test_6000_records_at_concurrency_256(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, RECORDS)
    # 1.5 s a request (±50%): slow enough that the server, not the client's CPU, sets the pace, as a
    # real model server does; 256 in flight then ask for ~170 records/s.
    with sim_server(
        "--model", "test-model", "--latency", "1.5", "--jitter", "0.5", "--seed", "3", *FAULTS
    ) as url:
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": url},
            concurrency=256,
            request_timeout_s=60,
            max_tokens=2048,
            schema="schemas.linkedin:JobPosting",
            retry={"backoff_initial_s": 0.05, "backoff_max_s": 0.5},
        )
        started = time.perf_counter()
        run = subprocess.run(
            pipeline_command("run", str(job)),
            capture_output=True,
            text=True,
            timeout=600,
            env=subprocess_env(),
            cwd=REPO,
        )
        elapsed = time.perf_counter() - started
        peak = sim_metric(url, "pipeline_sim:peak_requests_in_flight")
        requests = sim_metric(url, "pipeline_sim:requests_total")
    assert run.returncode in (0, 1), run.stderr[-2000:]
    print(
        f"\n{RECORDS} records at c=256 in {elapsed:.1f} s: {RECORDS / elapsed:.0f} records/s "
        f"({requests:.0f} chat requests, peak {peak:.0f} in flight at the server)"
    )
    assert peak == 256  # the slots were full, and never more than the concurrency
    results = table_rows(database, "SELECT count(*), count(DISTINCT record_id) FROM results")[0]
    failures = table_rows(database, "SELECT failure_class, count(*) FROM failures GROUP BY ALL")
    failed = sum(count for _, count in failures)
    assert results[0] == results[1]
    assert results[0] + failed == RECORDS
    assert {name for name, _ in failures} <= {"permanent", "truncated", "invalid_json", "schema_invalid"}
    assert table_rows(database, "SELECT count(*) FROM results r JOIN failures f USING (record_id)") == [(0,)]
    assert table_rows(
        database,
        "SELECT count(*) FROM postings p ANTI JOIN results r ON p.id = r.record_id "
        "ANTI JOIN failures f ON p.id = f.record_id",
    ) == [(0,)]
    retried = table_rows(database, "SELECT count(*) FROM results WHERE attempts > 1")[0][0]
    assert retried > 0  # the faults were met and overcome
