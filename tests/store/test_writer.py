from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import orjson
import pytest
from structlog.testing import capture_logs

from pipeline.errors import ConfigError, DatabaseError, DatabaseLockedError, FailureClass
from pipeline.extraction.context import RunContext
from pipeline.extraction.outcomes import Extracted, Failed, Usage
from pipeline.job.spec import JobSpec
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.replies import Reply
from pipeline.source.db import open_database
from pipeline.source.versions import version_of
from pipeline.store.numbers import RunNumbers
from pipeline.store.opening import known_knees, open_for_reading, prepare_database
from pipeline.store.writer import StoreWriter
from tests.support.jobs import make_job, table_rows
from tests.support.runs import WriterRun

pytestmark = pytest.mark.anyio

REPLY = Reply('{"a": 1}', "thinking", "stop", 120, 45, 12, 0.25)


def usage(attempts: int) -> Usage:
    """As if every attempt had been answered like REPLY."""
    return Usage(attempts, 120 * attempts, 45 * attempts, 12 * attempts, 0.25 * attempts)


def extracted(record_id: int, attempts: int = 1, data: int | None = None) -> Extracted:
    body = orjson.dumps({"id": record_id if data is None else data}).decode()
    return Extracted(record_id, body, attempts, REPLY, usage(attempts), 256, record_id * 1000)


def failed(record_id: int, failure_class: FailureClass = FailureClass.SCHEMA_INVALID) -> Failed:
    return Failed(
        record_id,
        failure_class,
        "skills: Input should be a valid list",
        3,
        '{"skills": 1}',
        usage(3),
        512,
        record_id * 1000,
    )


async def started_writer(spec: JobSpec) -> WriterRun:
    run = WriterRun(StoreWriter(prepare_database(spec), RunContext.of(spec)))
    await run.begin()
    return run


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return make_job(tmp_path, records=10)


async def test_results_and_failures_rows(spec: JobSpec) -> None:
    run = await started_writer(spec)
    writer = run.writer
    await run.write([extracted(1, attempts=2), failed(2)])
    writer.connection.close()
    rows = table_rows(
        spec.database,
        "SELECT variant, record_id, run_id, extracted, model, attempts, prompt_tokens, "
        "completion_tokens, reasoning_tokens, latency_s, finish_reason, max_tokens, total_prompt_tokens, "
        "total_completion_tokens, total_reasoning_tokens, total_latency_s, content_hash, content_fields, "
        "prompt_hash, schema_hash, settings_hash, created_at IS NOT NULL FROM results",
    )
    version = version_of(spec)
    assert rows == [
        (
            "main",
            1,
            1,
            '{"id":1}',
            "test-model",
            2,
            120,  # the last attempt's
            45,
            12,
            0.25,
            "stop",
            256,
            240,  # every attempt's
            90,
            24,
            0.5,
            1000,
            "title,description",
            version.prompt_hash,
            version.schema_hash,
            version.settings_hash,
            True,
        )
    ]
    failures = table_rows(
        spec.database,
        "SELECT variant, record_id, run_id, failure_class, message, attempts, last_raw_output, "
        "last_max_tokens, prompt_tokens, completion_tokens, reasoning_tokens, latency_s, content_hash, "
        "prompt_hash, counted_prompt_tokens, answer_cut_at FROM failures",
    )
    assert failures == [
        (
            "main",
            2,
            1,
            "schema_invalid",
            "skills: Input should be a valid list",
            3,
            '{"skills": 1}',
            512,
            360,
            135,
            36,
            0.75,
            2000,
            version.prompt_hash,
            None,  # the fit a too_long failure keeps (below)
            None,
        )
    ]


async def test_a_too_long_failure_keeps_the_servers_count_of_its_prompt_and_its_cut_answer(
    spec: JobSpec,
) -> None:
    run = await started_writer(spec)
    cut = dataclasses.replace(failed(2, FailureClass.TOO_LONG), counted_prompt_tokens=3788, answer_cut_at=308)
    await run.write([cut])
    run.writer.connection.close()
    assert table_rows(spec.database, "SELECT counted_prompt_tokens, answer_cut_at FROM failures") == [
        (3788, 308)
    ]


async def test_the_run_s_numbers_are_committed_with_each_batch_and_read_back_whole(spec: JobSpec) -> None:
    run = await started_writer(spec)
    await run.write([extracted(1), extracted(2), failed(3)])
    run.numbers.attempts, run.numbers.completion_tokens = 9, 300  # counted as sent, as replies came
    await run.write([extracted(4)])
    connection = run.writer.connection
    row = connection.execute(
        "SELECT status, done, failed, attempts, completion_tokens, pending_at_start FROM runs"
    )
    assert row.fetchall() == [("running", 3, 1, 9, 300, 10)]
    run.numbers.attempts, run.numbers.elapsed_s, run.numbers.retries = 12, 6.0, {"reask": 2}
    run.numbers.prefix_cache_hit_rate, run.numbers.preemptions = 0.875, 0
    await run.finish("completed_with_failures")
    cursor = connection.execute("SELECT * FROM runs")
    stored = dict(zip(cursor.columns, cursor.fetchone() or (), strict=True))
    assert (stored["status"], stored["ended_at"] is not None) == ("completed_with_failures", True)
    assert RunNumbers.of(stored) == run.numbers  # every field, written and read back
    assert RunNumbers.of(stored).records_per_min == 40.0  # 4 records in 6 s
    connection.close()


async def test_answers_taken_from_the_reasoning_are_marked_counted_and_said_at_the_end(spec: JobSpec) -> None:
    run = await started_writer(spec)
    recovered = dataclasses.replace(extracted(2), from_reasoning=True)
    await run.write([extracted(1), recovered, failed(3)])
    with capture_logs() as logs:
        await run.finish("completed_with_failures")
    said = [entry for entry in logs if entry.get("answers_from_reasoning") == 1]
    assert len(said) == 1 and said[0]["event"].startswith("1 answer recovered from reasoning:")
    run.writer.connection.close()
    rows = table_rows(spec.database, "SELECT record_id, answer_from_reasoning FROM results ORDER BY 1")
    assert rows == [(1, False), (2, True)]


def test_a_results_table_without_the_reasoning_mark_gets_it_on_opening(spec: JobSpec) -> None:
    prepare_database(spec).close()
    with duckdb.connect(str(spec.database)) as connection:
        for table in ("results", "results_history"):
            connection.execute(f"ALTER TABLE {table} DROP COLUMN answer_from_reasoning")
    open_for_reading(spec).close()  # an older database opens without a step
    columns = table_rows(spec.database, "SELECT table_name FROM duckdb_columns() "
                         "WHERE column_name = 'answer_from_reasoning' ORDER BY 1")  # fmt: skip
    assert columns == [("results",), ("results_history",)]


async def test_success_clears_an_earlier_failure_and_failures_are_upserted(spec: JobSpec) -> None:
    run = await started_writer(spec)
    writer = run.writer
    await run.write([failed(1, FailureClass.TRANSIENT), failed(2)])
    await run.write([failed(2, FailureClass.TRUNCATED)])
    await run.write([extracted(1)])
    assert writer.connection.execute("SELECT record_id, failure_class FROM failures").fetchall() == [
        (2, "truncated")
    ]
    assert writer.connection.execute("SELECT record_id FROM results").fetchall() == [(1,)]
    writer.connection.close()


async def test_results_are_unique_per_record_and_a_redo_moves_the_old_one_to_history(spec: JobSpec) -> None:
    run = await started_writer(spec)
    writer = run.writer
    await run.write([extracted(1, data=10), extracted(2, data=20)])
    await run.write([extracted(1, attempts=5, data=11)])
    assert writer.connection.execute("SELECT count(*), max(attempts) FROM results").fetchall() == [(2, 5)]
    assert writer.connection.execute("SELECT extracted FROM results WHERE record_id = 1").fetchall() == [
        ('{"id":11}',)
    ]
    history = writer.connection.execute(
        "SELECT variant, record_id, extracted, attempts, run_id, superseded_by_run, "
        "superseded_at IS NOT NULL FROM results_history"
    ).fetchall()
    assert history == [("main", 1, '{"id":10}', 1, 1, 1, True)]
    with pytest.raises(DatabaseError, match="Constraint Error"):
        writer.connection.execute("INSERT INTO results (variant, record_id) VALUES ('main', 1)")
    writer.connection.close()


async def test_variants_keep_their_own_results_and_failures(spec: JobSpec) -> None:
    main_run = await started_writer(spec)
    main = main_run.writer
    await main_run.write([extracted(1, data=10), failed(2)])
    other_spec = spec.model_copy(update={"variant": "b"})
    other = WriterRun(StoreWriter(main.connection, RunContext.of(other_spec)))
    await other.begin()
    await other.write([extracted(1, data=99), extracted(2)])
    rows = main.connection.execute(
        "SELECT variant, record_id, extracted FROM results ORDER BY ALL"
    ).fetchall()
    assert rows == [("b", 1, '{"id":99}'), ("b", 2, '{"id":2}'), ("main", 1, '{"id":10}')]
    assert main.connection.execute("SELECT variant, record_id FROM failures").fetchall() == [("main", 2)]
    assert main.connection.execute("SELECT count(*) FROM results_history").fetchall() == [(0,)]
    runs = main.connection.execute("SELECT run_id, variant FROM runs ORDER BY run_id").fetchall()
    assert runs == [(1, "main"), (2, "b")]
    main.connection.close()


async def test_the_variants_latest_answers_are_read_oldest_first(spec: JobSpec) -> None:
    """What a run starts its answers' sizes from: the variant's own latest results, in one query."""
    main_run = await started_writer(spec)
    main = main_run.writer
    for record_id in range(1, 6):  # one batch each: one creation time each, in this order
        tokens = 0 if record_id == 3 else 100 + record_id  # 0: a reply without usage says nothing
        await main_run.write(
            [
                dataclasses.replace(
                    extracted(record_id), reply=dataclasses.replace(REPLY, completion_tokens=tokens)
                )
            ]
        )
    other = WriterRun(StoreWriter(main.connection, RunContext.of(spec.model_copy(update={"variant": "b"}))))
    await other.begin()
    await other.write([extracted(9)])
    assert await main.recent_answers(3) == [102, 104, 105]
    assert await main.recent_answers(1000) == [101, 102, 104, 105]
    assert await other.writer.recent_answers(1000) == [45]
    main.connection.close()


async def test_each_server_s_latest_knee_is_kept_across_runs_and_variants(spec: JobSpec) -> None:
    first_run = await started_writer(spec)
    first = first_run.writer
    await first_run.finish(
        "completed", knees={"http://a/v1 m": KneeMemory(256, True), "http://b/v1 m": KneeMemory(64, True)}
    )
    second_spec = spec.model_copy(update={"variant": "b"})
    second = WriterRun(StoreWriter(first.connection, RunContext.of(second_spec)))
    await second.begin("http://a/v1")
    await second.finish("interrupted", knees={"http://a/v1 m": KneeMemory(240, False, worse_above=480)})
    third = WriterRun(StoreWriter(first.connection, RunContext.of(spec)))
    await third.begin("http://a/v1")
    await third.finish("completed")  # found no knee: the earlier ones stand
    assert known_knees(first.connection, spec) == {
        "http://a/v1 m": KneeMemory(240, False, worse_above=480),
        "http://b/v1 m": KneeMemory(64, True),
    }
    first.connection.close()


async def test_a_failed_batch_leaves_nothing_behind(spec: JobSpec) -> None:
    run = await started_writer(spec)
    writer = run.writer
    writer.connection.execute("ALTER TABLE failures RENAME TO failures_away")  # the failure rows cannot land
    with pytest.raises(DatabaseError, match="failures"):
        await run.write([extracted(1), failed(3)])
    assert writer.connection.execute("SELECT count(*) FROM results").fetchall() == [(0,)]
    assert writer.connection.execute("SELECT done FROM runs").fetchall() == [(0,)]
    assert run.numbers.done == 0
    writer.connection.execute("ALTER TABLE failures_away RENAME TO failures")
    await run.write([extracted(2), failed(3)])
    assert run.numbers.done == 1
    assert writer.connection.execute("SELECT done, failed FROM runs").fetchall() == [(1, 1)]
    writer.connection.close()


async def test_a_run_left_running_is_marked_abandoned(spec: JobSpec) -> None:
    run = await started_writer(spec)
    writer = run.writer
    writer.connection.close()
    run = await started_writer(spec)
    writer = run.writer
    assert writer.run_id == 2
    rows = writer.connection.execute("SELECT run_id, status FROM runs ORDER BY run_id").fetchall()
    assert rows == [(1, "abandoned"), (2, "running")]
    writer.connection.close()


async def test_a_run_killed_after_its_last_commit_is_abandoned_even_when_nothing_is_left(
    spec: JobSpec,
) -> None:
    run = await started_writer(spec)
    writer = run.writer
    writer.connection.close()  # killed before recording its end; the next run finds nothing to do
    prepare_database(spec).close()
    assert table_rows(spec.database, "SELECT run_id, status FROM runs") == [(1, "abandoned")]


def test_string_ids_keep_their_type(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            "CREATE TABLE postings AS "
            "SELECT 'job-' || i AS id, 't' AS title, 'd' AS description FROM range(3) t(i)"
        )
    prepare_database(spec).close()
    types = table_rows(
        spec.database,
        "SELECT data_type FROM information_schema.columns WHERE table_name IN "
        "('results', 'failures', 'results_history') AND column_name = 'record_id'",
    )
    assert types == [("VARCHAR",), ("VARCHAR",), ("VARCHAR",)]


@pytest.mark.process
def test_locked_database_is_reported(spec: JobSpec, tmp_path: Path) -> None:
    import subprocess
    import sys

    path = str(spec.database)
    hold = f"import duckdb, time; c = duckdb.connect({path!r}); print('ok', flush=True); time.sleep(9)"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.raises(DatabaseLockedError, match="database is in use by another process"):
            open_database(spec.database)
    finally:
        holder.kill()
        holder.wait()


def test_missing_database_for_reading(tmp_path: Path) -> None:
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="does not exist yet"):
        open_database(tmp_path / "nope.duckdb", read_only=True)


def test_memory_limit_is_bounded_and_configurable(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2, duckdb_memory_limit="64MB")
    connection = prepare_database(spec)
    row = connection.execute("SELECT current_setting('memory_limit')").fetchone()
    assert row == ("61.0 MiB",)  # DuckDB reports 64 MB as 61 MiB
    connection.close()


def test_a_memory_limit_too_small_to_open_the_database_is_a_configuration_error(tmp_path: Path) -> None:
    """A limit of a few KB fails inside DuckDB's first catalog read: one line naming the key, for the
    run and for every reading command, not DuckDB's exception."""
    spec = make_job(tmp_path, records=2)
    prepare_database(spec).close()
    small = spec.model_copy(update={"duckdb_memory_limit": "1KB"})
    with pytest.raises(ConfigError, match=r"key 'duckdb_memory_limit': 1KB is too small for .*Out of Memory"):
        prepare_database(small)
    with pytest.raises(ConfigError, match=r"key 'duckdb_memory_limit': 1KB is too small"):
        open_for_reading(small)
