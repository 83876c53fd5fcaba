"""The read copy readers open while a run holds the database: what it holds, how it is opened, how a
reader asks for a fresh one, and that a copy is published whole or not at all."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import duckdb
import pytest

from pipeline.errors import AlreadyRunningError, DatabaseLockedError
from pipeline.job.spec import JobSpec
from pipeline.reports.reading import keys_scope, open_output
from pipeline.store.opening import prepare_database
from pipeline.store.read_copy import (
    COPY_TABLE,
    copy_path,
    copy_requested,
    open_read_copy,
    read_copy_of,
    remove_copies,
    request_path,
    source_copy_path,
    wait_for_copy,
    write_copy,
)
from tests.support.outputs import database_held_by_another_process
from tests.support.variants import SOURCE_IDS, main_answer, run_variant, variants_job

LOCKED = AlreadyRunningError("test.duckdb: this job is already running (pid 1)", pid=1)


@pytest.fixture
def job(tmp_path: Path) -> JobSpec:
    spec = variants_job(tmp_path)
    run_variant(spec, "main", main_answer)
    return spec


def copy_of(spec: JobSpec, run_id: int = 7) -> float:
    connection = prepare_database(spec)
    try:
        return write_copy(connection, spec, run_id)
    finally:
        connection.close()


def test_a_copy_holds_the_output_tables_and_a_copy_of_the_source(job: JobSpec) -> None:
    assert copy_of(job) > 0
    with duckdb.connect(str(copy_path(job.database)), read_only=True) as copy:
        tables = {row[0] for row in copy.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert tables == {
            "runs",
            "results",
            "results_history",
            "failures",
            "results_chunks",
            "judgments",
            COPY_TABLE,
        }
        assert copy.execute("SELECT count(*) FROM results").fetchone() == (9,)
    with duckdb.connect(str(source_copy_path(job.database)), read_only=True) as source:
        assert source.execute("SELECT count(*) FROM postings").fetchone() == (len(SOURCE_IDS),)


def test_a_reader_runs_the_same_sql_on_the_copy_and_is_told_so(job: JobSpec) -> None:
    copy_of(job, run_id=7)
    connection = open_read_copy(job, LOCKED)
    try:
        found = read_copy_of(connection)
        assert found is not None and found.run_id == 7 and found.age_s() < 60
        assert "run #7 in progress" in found.describe()
        # the source's tables are visible under their own names, joined with the copied results
        joined = connection.row("SELECT count(*) FROM results r JOIN postings p ON p.id = r.record_id")
        assert joined == (9,)
    finally:
        connection.close()


def test_the_readers_library_reads_a_copy_like_the_database(
    job: JobSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy_of(job)

    def locked(*args: object, **kwargs: object) -> object:
        raise LOCKED

    with monkeypatch.context() as held:  # as while a run holds the database
        held.setattr("pipeline.store.opening.open_database", locked)
        with open_output(job) as output:
            assert output.read_copy is not None
            assert len(output.results(["main"], keys_scope([str(n) for n in SOURCE_IDS]))["main"]) == 9
    with open_output(job) as output:  # the run ended: the database itself
        assert output.read_copy is None


@pytest.mark.process
def test_a_database_held_by_another_process_than_a_run_is_refused_without_waiting_for_a_copy(
    job: JobSpec,
) -> None:
    """A `load` or a DuckDB shell writes no read copy: the reader says so at once instead of asking for
    one and waiting 30 s (before, every such reader waited the whole 30 s for nothing)."""
    copy_of(job)  # a copy left by a run killed earlier: not what this holder holds
    stale = time.time() - 120
    os.utime(copy_path(job.database), (stale, stale))
    with (
        database_held_by_another_process(job.database),
        pytest.raises(DatabaseLockedError) as refused,
        open_output(job),
    ):
        pass
    assert "in use by another process" in str(refused.value)
    assert not request_path(job.database).exists()  # no copy was asked for


def test_a_reader_asks_for_a_fresh_copy_and_waits_for_it(job: JobSpec) -> None:
    copy_of(job)
    stale = time.time() - 120
    os.utime(copy_path(job.database), (stale, stale))

    def run_side() -> None:  # the run: sees the request, writes a new copy
        for _ in range(100):
            if copy_requested(job.database):
                copy_of(job)
                return
            time.sleep(0.05)

    writer = threading.Thread(target=run_side)
    writer.start()
    assert wait_for_copy(job.database, wait_s=10)
    writer.join()
    assert copy_path(job.database).stat().st_mtime > stale + 60


def test_without_any_copy_the_reader_is_told_to_try_again(job: JobSpec) -> None:
    with pytest.raises(DatabaseLockedError, match="has written no read copy yet: try again in a minute"):
        open_read_copy(job, LOCKED, wait_s=0.3)
    assert request_path(job.database).exists()  # the run will see it asked


def test_a_half_written_copy_is_never_what_a_reader_opens(job: JobSpec) -> None:
    copy_of(job, run_id=1)
    # a run killed while writing leaves only a temporary file; the published copy is the last whole one
    leftover = copy_path(job.database).with_name(copy_path(job.database).name + ".tmp-dead")
    leftover.write_bytes(b"half a database")
    connection = open_read_copy(job, LOCKED)
    try:
        found = read_copy_of(connection)
        assert found is not None and found.run_id == 1
    finally:
        connection.close()
    remove_copies(job.database)
    assert not leftover.exists() and not copy_path(job.database).exists()
    assert not source_copy_path(job.database).exists()
