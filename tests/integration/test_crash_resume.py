"""kill -9 at several points, resume, and every source record ends up exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.processes import REPO, pipeline_command, sim_metric, sim_server, subprocess_env

pytestmark = pytest.mark.integration

RECORDS = 3000
CONCURRENCY = 64
KILL_AFTER_S = (0.4, 2.5, 1.5, 3.0)  # the first lands during start-up, the others mid-run


def run_and_kill(job: Path, after_s: float) -> int:
    process = subprocess.Popen(
        pipeline_command("run", str(job)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=subprocess_env(),
        cwd=REPO,
    )
    time.sleep(after_s)
    os.kill(process.pid, signal.SIGKILL)
    return process.wait(timeout=30)


def test_kill_9_at_several_points_then_resume(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, RECORDS)
    faults = (
        "--fault-invalid-json",
        "0.02",
        "--fault-server-error",
        "0.02",
        "--fault-context-length",
        "0.01",
    )
    with sim_server("--model", "test-model", "--latency", "0.1", "--jitter", "0.5", *faults) as url:
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": url},
            concurrency=CONCURRENCY,
            retry={"backoff_initial_s": 0.05, "backoff_max_s": 0.2},
        )
        progress = []
        for after_s in KILL_AFTER_S:
            assert run_and_kill(job, after_s) == -signal.SIGKILL
            progress.append(
                table_rows(database, "SELECT count(*) FROM results")[0][0]
                if table_rows(database, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'results'")[
                    0
                ][0]
                else 0
            )
        final = subprocess.run(
            pipeline_command("run", str(job)),
            capture_output=True,
            text=True,
            timeout=300,
            env=subprocess_env(),
            cwd=REPO,
        )
        requests = sim_metric(url, "pipeline_sim:requests_total")
    assert final.returncode in (0, 1), final.stderr[-2000:]
    assert progress == sorted(progress) and progress[-1] > 0  # each killed run kept what it had committed

    ids = table_rows(database, "SELECT id FROM postings ORDER BY id")
    done = table_rows(database, "SELECT record_id FROM results")
    failed = table_rows(database, "SELECT record_id FROM failures")
    assert len(done) == len(set(done))
    assert len(failed) == len(set(failed))
    assert sorted(done + failed) == ids  # every record exactly once across results + failures
    runs = table_rows(database, "SELECT status FROM runs ORDER BY run_id")
    assert runs[-1][0] in ("completed", "completed_with_failures")
    assert all(status == "abandoned" for (status,) in runs[:-1])
    # Resuming redid only what was in flight or not yet committed at each kill, not the whole job.
    first_attempts = RECORDS * 1.2  # faults cost retries
    assert requests < first_attempts + len(KILL_AFTER_S) * (CONCURRENCY + 700)
