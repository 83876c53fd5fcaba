"""The one record of a run's numbers: what it counts, what it derives, and its runs-table columns."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from pipeline.errors import FailureClass
from pipeline.extraction.outcomes import ChunkDone, Extracted, Failed, Usage
from pipeline.servers.replies import Reply
from pipeline.store.numbers import RUN_NUMBER_ASSIGNMENTS, RUN_NUMBER_COLUMNS, RunNumbers, columns_of
from pipeline.store.opening import open_for_reading, prepare_database
from tests.support.jobs import make_job, table_rows

REPLY = Reply("{}", None, "stop", 10, 5, 1, 0.1)


def done(record_id: int) -> Extracted:
    return Extracted(record_id, "{}", 1, REPLY, Usage(1), 256, record_id)


def failed(record_id: int, failure_class: FailureClass) -> Failed:
    return Failed(record_id, failure_class, "no", 1, None, Usage(1), 256, record_id)


def test_committed_outcomes_count_records_done_failed_by_class_and_chunks() -> None:
    chunk = ChunkDone(3, 1, 1, 2, 0, 10, done(3))
    before = RunNumbers(pending_at_start=10, attempts=7)
    after = before.plus(
        [done(1), failed(2, FailureClass.INVALID_JSON), chunk, failed(4, FailureClass.TRANSIENT)]
    )
    assert (after.done, after.failed, after.chunks_done) == (1, 2, 1)
    assert after.failures == {"invalid_json": 1, "transient": 1}
    assert after.attempts == 7  # requests are counted as they are sent, not again from the outcomes
    assert (before.done, before.failures) == (0, {})  # plus() is a copy: the live record is untouched
    recovered = dataclasses.replace(done(5), from_reasoning=True)  # the answer was in the reasoning field
    assert after.plus([recovered, done(6)]).answers_from_reasoning == 1


def test_records_too_long_never_sent_are_counted_apart() -> None:
    """A record a count says cannot fit fails without a request: what the summary says it did not send."""
    unsent = dataclasses.replace(failed(1, FailureClass.TOO_LONG), attempts=0)
    sent = failed(2, FailureClass.TOO_LONG)  # its answer was cut off at the end of the context
    other = dataclasses.replace(failed(3, FailureClass.PERMANENT), attempts=0)
    numbers = RunNumbers().plus([unsent, sent, other])
    assert (numbers.failures, numbers.too_long_unsent) == ({"too_long": 2, "permanent": 1}, 1)


def test_remaining_is_the_run_s_own_and_backlog_the_job_s_whatever_the_limit() -> None:
    """A --limit 300 run of a job with 1,491 pending, one of its failures transient (a plain run takes it
    again): nothing remains of the run, 1,192 are still pending."""
    numbers = RunNumbers(pending_at_start=300, backlog_at_start=1491, done=297, failed=3)
    numbers.failures = {"invalid_json": 2, "transient": 1}
    assert (numbers.finished, numbers.remaining, numbers.backlog) == (300, 0, 1192)
    numbers.made_transient(Counter({"invalid_json": 2}))  # the answer breaker's window, kept retryable
    assert numbers.failures == {"transient": 3}
    assert numbers.backlog == 1194


def test_records_per_min_and_eta_are_over_the_run_s_own_time() -> None:
    numbers = RunNumbers(pending_at_start=1000, done=290, failed=10, completion_tokens=60_000, elapsed_s=60.0)
    assert numbers.records_per_min == 300.0
    assert numbers.output_tokens_per_s == 1000.0
    assert numbers.eta_s == 140.0  # 700 remaining at 5 a second
    assert numbers.seconds_for(1500) == 300.0
    idle = RunNumbers(pending_at_start=5)
    assert (idle.records_per_min, idle.eta_s, idle.seconds_for(5)) == (0.0, None, None)


def test_tokens_per_done_record_count_every_request_over_the_records_done() -> None:
    """Re-asks, retries and the failed record's requests are in the run's tokens: what a result cost."""
    numbers = RunNumbers(done=4, failed=1, prompt_tokens=1000, completion_tokens=600, reasoning_tokens=200)
    assert numbers.tokens_per_done == {"prompt": 250.0, "completion": 150.0, "reasoning": 50.0}
    assert numbers.to_json()["tokens_per_done"] == numbers.tokens_per_done
    assert RunNumbers(failed=3, prompt_tokens=900).tokens_per_done is None  # none done yet


def test_a_row_an_older_version_wrote_reads_with_defaults_and_its_timestamps() -> None:
    started = dt.datetime(2026, 11, 27, 2, 0, tzinfo=dt.UTC)
    row = {
        "done": 300,
        "failed": None,  # NULL
        "started_at": started,
        "updated_at": started + dt.timedelta(seconds=90),
        "ended_at": started + dt.timedelta(seconds=100),
    }  # no elapsed_s, no attempts: the columns are newer than the row
    numbers = RunNumbers.of(row)
    assert (numbers.done, numbers.failed, numbers.attempts, numbers.failures) == (300, 0, 0, {})
    assert numbers.elapsed_s == 100.0 and numbers.records_per_min == 180.0
    running = RunNumbers.of({**row, "ended_at": None, "started_at": started.isoformat()})
    assert running.elapsed_s == 90.0  # to its last commit, from a JSON timestamp too


def test_its_json_reads_back_as_the_same_record() -> None:
    numbers = RunNumbers(
        pending_at_start=20, done=5, failed=2, failures={"transient": 2}, retries={"reask": 1}, elapsed_s=7.5
    )
    numbers.prefix_cache_hit_rate, numbers.preemptions = 0.5, 3
    as_json = numbers.to_json()
    assert RunNumbers.of(as_json) == numbers
    assert (as_json["remaining"], as_json["records_per_min"], as_json["eta_s"]) == (13, 56.0, 14)


def test_the_columns_and_the_update_are_the_fields() -> None:
    names = [field.name for field in dataclasses.fields(RunNumbers)]
    assert [name for name, _ in RUN_NUMBER_COLUMNS] == names
    assert ", ".join(f"{name} = ?" for name in names) == RUN_NUMBER_ASSIGNMENTS
    assert len(RunNumbers().row_values()) == len(names)
    kinds = dict(RUN_NUMBER_COLUMNS)
    assert (kinds["done"], kinds["elapsed_s"], kinds["failures"]) == ("BIGINT DEFAULT 0", "DOUBLE", "JSON")
    assert kinds["prefix_cache_hit_rate"] == "DOUBLE" and kinds["preemptions"] == "BIGINT"  # NULL: unknown


@dataclasses.dataclass(slots=True)
class WithACounter(RunNumbers):
    recovered: int = 0  # a counter added at the end


@dataclasses.dataclass(slots=True)
class WithAList(RunNumbers):
    seen: list[int] = dataclasses.field(default_factory=list)


def test_a_field_added_is_a_column_and_one_with_no_column_type_is_refused() -> None:
    assert columns_of(WithACounter) == [*RUN_NUMBER_COLUMNS, ("recovered", "BIGINT DEFAULT 0")]
    with pytest.raises(TypeError, match=r"WithAList\.seen: list\[int\] has no column type"):
        columns_of(WithAList)


def test_an_older_runs_table_gets_the_new_columns_on_opening(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    prepare_database(spec).close()
    with duckdb.connect(str(spec.database)) as connection:
        for name in ("backlog_at_start", "elapsed_s", "failures", "prefix_cache_hit_rate"):
            connection.execute(f"ALTER TABLE runs DROP COLUMN {name}")
        connection.execute("INSERT INTO runs (run_id, status, done) VALUES (1, 'completed', 3)")
    open_for_reading(spec).close()  # a reader opens it as it is
    prepare_database(spec).close()  # a run brings it up to date
    columns = table_rows(spec.database, "SELECT column_name FROM duckdb_columns() WHERE table_name = 'runs'")
    assert {name for name, _ in RUN_NUMBER_COLUMNS} <= {name for (name,) in columns}
    cursor_rows = table_rows(spec.database, "SELECT done, backlog_at_start, elapsed_s FROM runs")
    assert cursor_rows == [(3, 0, None)]  # an old run's time is its timestamps' (RunNumbers.of)
