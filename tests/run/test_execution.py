"""A run's task groups: a writer that fails (the disk is full) ends the run with its own one error,
never a group of the workers' errors, and what it wrote stays written; after the answer breaker's stop,
the failures a plain run cannot do are named with the command that does them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb
import pytest
from structlog.testing import capture_logs

from pipeline.errors import EXIT_ABORTED, AnswersRejectedError, FatalRunError, exit_code_for
from pipeline.extraction.outcomes import Stored
from pipeline.job.commands import command
from pipeline.run import committer
from pipeline.run.options import RunStatus
from pipeline.source.db import translated_error
from pipeline.store.numbers import RunNumbers
from pipeline.store.writer import StoreWriter
from tests.support.fakes import ScriptedServer, completion, error, good_completion, respond
from tests.support.jobs import make_job, make_source, table_rows
from tests.support.runs import QuietProgress, run_served

pytestmark = pytest.mark.anyio


async def test_a_full_disk_ends_the_run_in_one_line_and_the_next_run_does_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third batch finds the disk full, as DuckDB says it at commit. The workers still sending then
    find the writer's stream closed: that used to escape as an ExceptionGroup of BrokenResourceErrors
    (a traceback, exit 1)."""
    spec = make_job(tmp_path, records=600, concurrency=32)
    monkeypatch.setattr(committer, "FLUSH_MAX_ROWS", 40)  # many small batches, whatever the timing
    write_batch = StoreWriter._write_batch
    batches = 0

    def disk_fills_up(writer: StoreWriter, outcomes: Sequence[Stored], numbers: RunNumbers) -> None:
        nonlocal batches
        batches += 1
        if batches > 2:
            said = f'TransactionContext Error: Failed to commit: Could not write file "{spec.database}.wal"'
            full = duckdb.TransactionException(f"{said}: No space left on device")
            raise translated_error(full, spec.database)
        write_batch(writer, outcomes, numbers)

    server = ScriptedServer([respond(good_completion())])
    with monkeypatch.context() as full_disk:
        full_disk.setattr(StoreWriter, "_write_batch", disk_fills_up)
        with pytest.raises(FatalRunError) as raised:
            await run_served(spec, server)
    message = str(raised.value)
    assert message.startswith(f"{spec.database}: cannot write results: the disk is full (")
    assert "free space and run again" in message and "\n" not in message
    assert exit_code_for(raised.value) == EXIT_ABORTED
    written = table_rows(spec.database, "SELECT count(*) FROM results")[0][0]
    assert 0 < written < 600
    assert table_rows(spec.database, "SELECT status, done FROM runs") == [("aborted", written)]

    again = await run_served(spec, server)  # space freed: the next run does the rest, none twice
    assert again.status is RunStatus.COMPLETED and again.done == 600 - written
    assert table_rows(spec.database, "SELECT count(*), count(DISTINCT record_id) FROM results") == [
        (600, 600)
    ]


async def test_failures_the_breaker_could_not_keep_retryable_are_named_with_the_run_that_retries_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The breaker stops the run and the writer cannot make its window's failures retryable (the disk
    filled meanwhile): they stay failures a plain run passes over, so the warning names the run with
    --retry-failed, on the database and variant this run had."""
    spec = make_job(tmp_path, records=100, concurrency=8)
    trial = spec.with_overrides(database=tmp_path / "trial db.duckdb").for_variant("quick")
    make_source(trial.database, 100)

    async def refused(writer: StoreWriter, *_: object) -> None:
        raise translated_error(duckdb.IOException("No space left on device"), trial.database)

    monkeypatch.setattr(StoreWriter, "keep_retryable", refused)
    with capture_logs() as logs, pytest.raises(AnswersRejectedError):
        await run_served(trial, ScriptedServer([respond(completion("not JSON at all"))]))
    (warning,) = [entry["event"] for entry in logs if "not made retryable" in entry["event"]]
    given = ("--database", str(trial.database), "--variant", "quick")
    retry = command("run", str(spec.source_file), "--retry-failed", *given)
    assert warning.endswith(
        f"so a plain run leaves them: `{retry}` does them with the rest once the server is fixed"
    )
    assert table_rows(trial.database, "SELECT count(*) FROM failures WHERE failure_class = 'transient'") == [
        (0,)
    ]


async def test_the_backlog_a_limited_run_leaves_is_what_status_calls_pending(tmp_path: Path) -> None:
    """--limit 4 of 10 records, one failing transiently (a plain run takes it again): the run has none of
    its own left, and the job 7 (it said 0 before: its own remaining)."""
    spec = make_job(tmp_path, records=10, retry={"transient_retries": 0})
    server = ScriptedServer([respond(good_completion())] * 3 + [error(503)])
    progress = QuietProgress()
    summary = await run_served(spec, server, limit=4, progress=progress)
    assert (summary.done, summary.failed) == (3, 1)
    numbers = summary.numbers
    assert (numbers.backlog_at_start, numbers.remaining, numbers.backlog) == (10, 0, 7)
    assert progress.closed_with is not None and progress.closed_with["backlog"] == 7  # the run's last word
    assert table_rows(spec.database, "SELECT backlog_at_start FROM runs") == [(10,)]
