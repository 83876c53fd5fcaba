from __future__ import annotations

from pathlib import Path

import anyio
import duckdb
import pytest

from pipeline.errors import PERMANENT_FAILURE_CLASSES, ConfigError, FailureClass
from pipeline.job import JobSpec
from pipeline.outcomes import SourceRecord
from pipeline.source import SourceReader, describe_source, pending_sql
from pipeline.store import prepare_database
from tests.support.jobs import make_job

pytestmark = pytest.mark.anyio


def mark(connection: duckdb.DuckDBPyConnection, table: str, rows: list[tuple[int, str]]) -> None:
    for record_id, failure_class in rows:
        if table == "results":
            connection.execute("INSERT INTO results (record_id, extracted) VALUES (?, '{}')", [record_id])
        else:
            connection.execute(
                "INSERT INTO failures (record_id, failure_class, message) VALUES (?, ?, 'x')",
                [record_id, failure_class],
            )


async def pending_ids(spec: JobSpec, connection: duckdb.DuckDBPyConnection, **kwargs: object) -> list[object]:
    reader = SourceReader(connection.cursor(), spec)
    send, receive = anyio.create_memory_object_stream[SourceRecord](4)
    ids: list[object] = []
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: reader.stream_pending(send, **kwargs))  # type: ignore[arg-type]
        async with receive:
            async for record in receive:
                ids.append(record.id)
    return sorted(ids)  # type: ignore[type-var]


async def test_pending_is_source_minus_done_and_permanent_failures(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    connection = prepare_database(spec)
    mark(connection, "results", [(0, ""), (1, "")])
    mark(connection, "failures", [(2, "schema_invalid"), (3, "transient"), (4, "permanent")])
    assert await pending_ids(spec, connection) == [3, 5, 6, 7, 8, 9]
    assert await pending_ids(spec, connection, retry=PERMANENT_FAILURE_CLASSES) == [2, 3, 4, 5, 6, 7, 8, 9]
    only_schema = {FailureClass.SCHEMA_INVALID}
    assert await pending_ids(spec, connection, retry=only_schema) == [2, 3, 5, 6, 7, 8, 9]
    assert await SourceReader(connection.cursor(), spec).count_pending() == 6
    assert await SourceReader(connection.cursor(), spec).count_pending(retry=only_schema) == 7
    assert await SourceReader(connection.cursor(), spec).count_pending(limit=4) == 4
    connection.close()


async def test_stream_in_batches_with_fields_and_limit(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2500, source={"batch_size": 100})
    connection = prepare_database(spec)
    reader = SourceReader(connection.cursor(), spec)
    send, receive = anyio.create_memory_object_stream[SourceRecord](1)
    records: list[SourceRecord] = []
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: reader.stream_pending(send, limit=1234))
        async with receive:
            async for record in receive:
                records.append(record)
    assert len(records) == 1234
    assert len({r.id for r in records}) == 1234
    first = records[0]
    assert first.fields == {"title": f"Title {first.id}", "description": f"Description of posting {first.id}"}
    connection.close()


def test_pending_sql_is_an_anti_join() -> None:
    from tests.support.jobs import job_dict

    spec = JobSpec.model_validate(job_dict())
    sql = pending_sql(spec)
    assert sql.startswith('SELECT s."id" FROM "postings" s WHERE')  # ids only: no text read to subtract
    assert 'NOT EXISTS (SELECT 1 FROM "results"' in sql
    assert "failure_class IN ('empty', 'invalid_json', 'permanent', 'schema_invalid', 'truncated')" in sql
    assert "transient" not in sql
    assert "failures" not in pending_sql(spec, retry=PERMANENT_FAILURE_CLASSES)
    assert "failure_class IN ('empty', 'invalid_json', 'permanent', 'schema_invalid')" in pending_sql(
        spec, retry={FailureClass.TRUNCATED}
    )


def test_query_source(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    query_spec = spec.model_copy(
        update={
            "source": spec.source.model_copy(
                update={"table": None, "query": "SELECT * FROM postings WHERE id < 4"}
            )
        }
    )
    connection = prepare_database(query_spec)
    row = connection.execute(f"SELECT count(*) FROM ({pending_sql(query_spec)})").fetchone()
    assert row == (4,)
    connection.close()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("CREATE TABLE postings AS SELECT 1 AS id, 'x' AS title", r"no column \['description'\]"),
        (
            "CREATE TABLE postings AS SELECT NULL::INT AS id, 'x' AS title, 'y' AS description",
            "1 records have a NULL id in column id",
        ),
        (
            "CREATE TABLE postings AS SELECT 5 AS id, 'x' AS title, 'y' AS description FROM range(2)",
            r"ids are not unique in column id \(e.g. 5\)",
        ),
        ("SELECT 1", r"table 'postings' does not exist .*pipeline load"),
    ],
)
def test_bad_sources_are_config_errors(tmp_path: Path, setup: str, message: str) -> None:
    spec = make_job(tmp_path, records=0)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(setup)
        with pytest.raises(ConfigError, match=message):
            describe_source(connection, spec)


def test_failing_query_is_a_config_error(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    broken = spec.model_copy(
        update={"source": spec.source.model_copy(update={"table": None, "query": "SELEC nope"})}
    )
    with (
        duckdb.connect(str(spec.database)) as connection,
        pytest.raises(ConfigError, match="key source.query fails"),
    ):
        describe_source(connection, broken)


def test_id_type_is_kept(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            "CREATE TABLE postings AS "
            "SELECT 'a-' || i AS id, 't' AS title, 'd' AS description FROM range(3) t(i)"
        )
        assert describe_source(connection, spec).id_type == "VARCHAR"


def test_seed_file_is_loaded_once_and_named_when_broken(tmp_path: Path) -> None:
    seed = tmp_path / "seed.jsonl"
    seed.write_text('{"id": 1, "title": "t", "description": "d"}\n')
    spec = make_job(tmp_path, records=0, source={"seed_file": "seed.jsonl"})
    prepare_database(spec).close()
    seed.write_text('{"id": 2, "title": "t", "description": "d"}\n')
    prepare_database(spec).close()  # the table exists now: the seed is not loaded again
    with duckdb.connect(str(spec.database)) as connection:
        assert connection.execute("SELECT id FROM postings").fetchall() == [(1,)]
    other = tmp_path / "other"
    other.mkdir()
    missing = make_job(other, records=0, source={"seed_file": "gone.jsonl"})
    with pytest.raises(ConfigError, match=r"job\.yaml: key 'source.seed_file': .*gone\.jsonl: no such file"):
        prepare_database(missing)


def test_unopenable_database_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder")
    spec = make_job(tmp_path, records=0, database="afile/db.duckdb")
    with pytest.raises(ConfigError, match=r"job\.yaml: key 'database': .*cannot open database"):
        prepare_database(spec)


async def test_string_ids_from_a_query_source_stream_with_their_fields(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            "CREATE TABLE ads AS SELECT 'ad-' || i AS ref, 'T' || i AS heading, 'D' || i AS body "
            "FROM range(300) t(i)"
        )
    source = {"table": None, "query": "SELECT ref AS id, heading AS title, body AS description FROM ads",
              "batch_size": 64}  # fmt: skip
    query_spec = spec.model_copy(update={"source": spec.source.model_copy(update=source)})
    connection = prepare_database(query_spec)
    mark_text = (
        "INSERT INTO results (record_id, extracted) SELECT 'ad-' || i, '{}' FROM range(0, 300, 3) t(i)"
    )
    connection.execute(mark_text)
    reader = SourceReader(connection.cursor(), query_spec)
    send, receive = anyio.create_memory_object_stream[SourceRecord](1)
    records: list[SourceRecord] = []
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: reader.stream_pending(send))
        async with receive:
            async for record in receive:
                records.append(record)
    assert len(records) == 200 and len({r.id for r in records}) == 200
    for record in records:
        number = str(record.id).removeprefix("ad-")
        assert int(number) % 3 != 0
        assert record.fields == {"title": f"T{number}", "description": f"D{number}"}
    connection.close()
