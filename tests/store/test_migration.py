"""A database written by the previous version opens without a manual step: nothing is lost, old
results count as stale with cause ``unknown`` (not silently current), and runs go on."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.job.spec import JobSpec
from pipeline.reports.export import ExportFormat, export_results
from pipeline.reports.failures import failure_report
from pipeline.reports.status import job_status
from pipeline.source.versions import JOB_CAUSES
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.jobs import make_job, table_rows
from tests.support.previous_schema import write_previous_database
from tests.support.runs import run_served

pytestmark = pytest.mark.anyio


@pytest.fixture
def previous(tmp_path: Path) -> JobSpec:
    spec = make_job(tmp_path, records=10)
    write_previous_database(spec.database, done=range(0, 6), failed=range(6, 8))
    return spec


def test_status_reads_an_old_database_and_calls_its_results_unknown(previous: JobSpec) -> None:
    report = job_status(previous)
    assert (report.done, report.pending, report.failed) == (6, 2, {"schema_invalid": 2})
    assert report.stale == {
        "total": 6, "prompt": 0, "schema": 0, "model": 0, "settings": 0, "unknown": 6,
    }  # fmt: skip
    rows = table_rows(
        previous.database, "SELECT variant, record_id, extracted->>'title' FROM results ORDER BY record_id"
    )
    assert rows == [("main", i, f"old {i}") for i in range(6)]  # every old row kept, as variant main
    assert table_rows(previous.database, "SELECT variant, count(*) FROM failures GROUP BY 1") == [("main", 2)]
    assert table_rows(previous.database, "SELECT variant, done FROM runs") == [("main", 6)]


async def test_a_plain_run_does_only_the_new_records_and_redo_stale_replaces_the_old(
    previous: JobSpec,
) -> None:
    server = ScriptedServer([respond(good_completion())])
    summary = await run_served(previous, server)
    assert (summary.done, len(server.bodies)) == (2, 2)
    assert summary.stale_kept == {"total": 6, "unknown": 6}
    server = ScriptedServer([respond(good_completion())])
    summary = await run_served(previous, server, redo_stale=frozenset(JOB_CAUSES))
    # the six old results, and the two old failures: made by an unknown version of the job too
    assert (summary.done, len(server.bodies)) == (8, 8)
    history = table_rows(
        previous.database, "SELECT record_id, extracted->>'title', run_id FROM results_history ORDER BY 1"
    )
    assert history == [(i, f"old {i}", 1) for i in range(6)]
    assert job_status(previous).stale["total"] == 0


def test_failures_and_export_read_an_old_database(previous: JobSpec, tmp_path: Path) -> None:
    assert failure_report(previous).total == 2
    report = export_results(previous, tmp_path / "out.jsonl", ExportFormat.JSONL, history=True)
    assert (report.rows, report.history_rows) == (6, 0)
