from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pipeline.errors import ConfigError
from pipeline.reports.status import job_status
from tests.support.fakes import ScriptedServer, completion, good_completion, respond
from tests.support.jobs import make_job
from tests.support.outputs import job_with_outputs
from tests.support.runs import run_served

pytestmark = pytest.mark.anyio


async def test_status_counts_failures_by_class_and_pending(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=12, retry={"reasks": 0})
    server = ScriptedServer([respond(good_completion())] * 8 + [respond(completion("nope"))])
    await run_served(spec, server, limit=10)
    report = job_status(spec)
    assert (report.source_records, report.done, report.pending) == (12, 8, 2)
    assert report.failed == {"invalid_json": 2}
    assert report.last_run is not None and report.last_run["status"] == "completed_with_failures"
    assert report.rate_per_min is not None and report.rate_per_min > 0
    assert report.eta_s is not None
    assert report.live is None


def test_status_before_any_run(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5)
    report = job_status(spec)
    assert (report.source_records, report.done, report.pending, report.last_run) == (5, 0, 5, None)


def test_status_without_a_database(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    with pytest.raises(ConfigError, match="does not exist yet"):
        job_status(spec)


async def test_a_killed_run_shows_as_abandoned(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    await run_served(spec, ScriptedServer([respond(good_completion())]), limit=1)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE runs SET status = 'running'")  # what kill -9 leaves behind
    report = job_status(spec)
    assert report.last_run is not None and report.last_run["status"] == "abandoned"


def test_a_missing_source_table_is_said_and_what_is_stored_still_shown(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("DROP TABLE postings")
    report = job_status(spec)
    assert report.source_problem is not None
    assert f"source in {spec.database}: table 'postings' does not exist (key source.table)" in (
        report.source_problem
    )
    assert f"`pipeline load FILE --job {spec.source_file}`" in report.source_problem
    assert (report.source_records, report.done, report.pending) == (None, None, None)
    assert report.results == 5 and sum(report.failed.values()) == 7
    assert report.last_run is not None and report.last_run["done"] == 5
    assert report.eta_s is None


def test_a_missing_seeded_table_says_a_run_loads_it(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0, source={"seed_file": "seed.jsonl"})
    duckdb.connect(str(spec.database)).close()
    report = job_status(spec)
    assert report.source_problem is not None
    assert f"`pipeline run` loads key source.seed_file, {tmp_path / 'seed.jsonl'}" in report.source_problem
    assert (report.results, report.failed, report.last_run) == (0, {}, None)


def test_a_failing_source_query_names_the_key(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3, source={"table": None, "query": "SELECT * FROM nothere"})
    report = job_status(spec)
    assert report.source_problem is not None
    assert "key source.query fails: Catalog Error: Table with name nothere does not exist" in (
        report.source_problem
    )
