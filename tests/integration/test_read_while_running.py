"""Looking at a job while a run holds its database: every reading command answers from the run's read
copy and says how old it is, no older than the snapshot interval; a run killed while writing a copy
leaves the last whole copy, never half of one. Real runs over HTTP to the simulator, real DuckDB files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from pipeline.store.read_copy import CHAOS_LINE, CHAOS_READ_COPY_DELAY_ENV, COPY_TABLE, copy_path
from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.logged_run import Run, wait_for_snapshot
from tests.support.processes import run_pipeline, sim_process

pytestmark = pytest.mark.integration

INTERVAL_S = 3.0
NOTE = "note: a run holds the database; read from its copy, as of "


def job_on(tmp_path: Path, port: int) -> Path:
    return write_job(
        tmp_path,
        database="postings.duckdb",
        endpoint={"base_url": f"http://127.0.0.1:{port}/v1"},
        concurrency=16,
        request_timeout_s=600,  # no request times out while the server is paused
        schema="schemas.linkedin:JobPosting",
        max_tokens=2048,
        operations={"snapshot_interval_s": INTERVAL_S},
        variants={"terse": {"prompt": {"system": "Extract the posting, tersely."}}},
    )


def read(*args: str | Path) -> tuple[str, str]:
    done = run_pipeline(*(str(arg) for arg in args), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert NOTE in done.stderr and "run #3 in progress" in done.stderr, done.stderr
    return done.stdout, done.stderr


def fresh(copy: dict[str, Any]) -> None:
    assert copy["run_id"] == 3 and copy["age_s"] <= INTERVAL_S + 2, copy


def test_every_reader_answers_from_the_copy_while_a_run_holds_the_database(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, 1300)
    with sim_process("--model", "test-model", "--latency", "0.4") as sim:
        job = job_on(tmp_path, sim.port)
        for variant in ("main", "terse"):  # runs 1 and 2: 100 records each, done
            assert run_pipeline("run", str(job), "--variant", variant, "--limit", "100").returncode == 0
        rows = table_rows(database, "SELECT record_id, extracted FROM results WHERE variant = 'main'")
        gold = tmp_path / "gold.jsonl"
        gold.write_bytes(b"".join(orjson.dumps({"id": i, **orjson.loads(e)}) + b"\n" for i, e in rows))
        run = Run(job)  # run 3: 1,100 more records at 16 x 0.4 s, half a minute once the readers are done
        run.wait_for("run started")
        wait_for_snapshot(database, run.process)  # it holds the database and has sent requests
        with sim.paused():  # the run waits for its answers, however long the readers take
            check_readers(job, database, gold, tmp_path)
            assert run.process.poll() is None, "the run ended before every reader had read"
        assert run.finish() == 0
    assert not copy_path(database).exists()  # the run removed its copy: readers open the database again
    after = run_pipeline("status", str(job))
    assert after.returncode == 0 and NOTE not in after.stderr and "done:     1,300" in after.stdout


def check_readers(job: Path, database: Path, gold: Path, tmp_path: Path) -> None:
    out, _ = read("status", job, "--json")
    status = orjson.loads(out)
    fresh(status["read_copy"])
    assert status["done"] >= 100 and status["last_run"]["status"] == "running"
    assert status["live"]["run_id"] == 3  # and the run's live numbers beside them
    out, _ = read("status", job)
    assert "copy:     as of " in out and "now:      " in out
    out, _ = read("failures", job, "--json")
    fresh(orjson.loads(out)["read_copy"])
    exported = tmp_path / "during.jsonl"
    out, _ = read("export", job, "--out", exported)
    assert out.startswith("exported ") and len(exported.read_text().splitlines()) >= 100
    out, _ = read("eval", job, "--gold", gold, "--json")
    evaluated = orjson.loads(out)
    fresh(evaluated["read_copy"])
    assert evaluated["records"] == 100 and evaluated["micro"]["f1"] == 1.0
    out, _ = read("compare", job, "--variants", "main,terse", "--json")
    compared = orjson.loads(out)
    fresh(compared["read_copy"])
    assert compared["records"] == 100
    review = tmp_path / "review.html"
    read("review", job, "--html", review)
    assert "a run holds the database: read from its copy" in review.read_text()
    out, _ = read("report", job, "--json")
    reported = orjson.loads(out)
    assert [entry["run_id"] for entry in reported["runs"]] == [1]  # run 3 has no profile until it ends
    fresh(reported["read_copy"])


def test_a_run_killed_while_writing_a_copy_leaves_the_last_whole_one(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, 2000)
    with sim_process("--model", "test-model", "--latency", "0.4") as sim:
        job = job_on(tmp_path, sim.port)
        # Each copy is held half-written 0.4 s (then the next waits 0.4 / 5% = 8 s): kill the second.
        run = Run(job, "--log-format", "json", **{CHAOS_READ_COPY_DELAY_ENV: "0.4"})
        run.wait_for(CHAOS_LINE)
        deadline = time.monotonic() + 30
        while not copy_path(database).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first = copy_path(database).stat().st_mtime_ns
        run.wait_for(CHAOS_LINE)
        run.kill()
    assert copy_path(database).stat().st_mtime_ns == first  # the half-written one was never published
    leftovers = list(tmp_path.glob("postings.duckdb.read.duckdb.tmp-*"))
    assert leftovers  # it was being written
    with duckdb.connect(str(copy_path(database)), read_only=True) as copy:
        ((run_id,),) = copy.execute(f"SELECT run_id FROM {COPY_TABLE}").fetchall()
        done, results = copy.execute(
            "SELECT (SELECT done FROM runs WHERE run_id = 1), (SELECT count(*) FROM results)"
        ).fetchone() or (None, None)
    assert run_id == 1 and done == results  # one consistent read: the counters match the rows
