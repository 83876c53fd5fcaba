"""The DuckDB boundary: every DuckDB error leaves pipeline.source.db as a DatabaseError of the right
kind, its reason one line without record text."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pytest

from pipeline.errors import EXIT_ABORTED, EXIT_CONFIG, DatabaseError, DatabaseFailure, exit_code_for
from pipeline.source.db import (
    DEFAULT_MEMORY_LIMIT,
    Database,
    memory_limit_or_default,
    open_database,
    reason,
    statement_kinds,
    translated_error,
)
from tests.support.jobs import make_job


@pytest.fixture
def database(tmp_path: Path) -> Database:
    connection = open_database(tmp_path / "test.duckdb")
    connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name VARCHAR)")
    return connection


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELECT * FROM nowhere", DatabaseFailure.MISSING),
        ("SELEC 1", DatabaseFailure.INVALID),
        ("SELECT * FROM read_csv('/no/such/file.csv')", DatabaseFailure.IO),
        ("INSERT INTO t VALUES (1, 'a'), (1, 'b')", DatabaseFailure.OTHER),
    ],
)
def test_each_failure_leaves_as_a_database_error_of_its_kind(database: Database, sql: str, kind: str) -> None:
    with pytest.raises(DatabaseError) as raised:
        database.execute(sql)
    error = raised.value
    assert error.kind is kind and error.database == database.path
    assert "\n" not in str(error) and str(error).startswith(f"{database.path}: DuckDB failed (")
    assert exit_code_for(error) == EXIT_ABORTED


def test_out_of_memory_names_the_job_key_and_is_a_configuration_error(database: Database) -> None:
    database.execute("SET memory_limit = '1KB'")
    with pytest.raises(DatabaseError) as raised:
        database.rows("SELECT i, repeat('x', 100) FROM range(200000) t(i) ORDER BY i DESC")
    assert raised.value.kind is DatabaseFailure.OUT_OF_MEMORY
    assert "raise duckdb_memory_limit in the job" in str(raised.value)
    assert exit_code_for(raised.value) == EXIT_CONFIG


def test_a_job_without_a_memory_limit_opens_its_database_with_the_default(tmp_path: Path) -> None:
    """The job leaves the key None (it cannot see this module); the default is decided here, once."""
    spec = make_job(tmp_path, records=0)
    assert spec.duckdb_memory_limit is None and DEFAULT_MEMORY_LIMIT == "96MB"
    assert memory_limit_or_default(spec.duckdb_memory_limit) == DEFAULT_MEMORY_LIMIT
    assert memory_limit_or_default("2GB") == "2GB"
    connection = open_database(spec.database, memory_limit=spec.duckdb_memory_limit)
    assert connection.rows("SELECT current_setting('memory_limit')") == [("91.5 MiB",)]  # 96 MB
    connection.close()


def test_a_bad_line_of_a_file_is_named_without_its_text(database: Database, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,name\n1,ok\nSECRET-RECORD-TEXT,b\n")
    columns = "{'id': 'INTEGER', 'name': 'VARCHAR'}"
    with pytest.raises(DatabaseError) as raised:
        database.rows(f"SELECT * FROM read_csv('{bad}', header = true, columns = {columns})")
    assert "SECRET-RECORD-TEXT" not in str(raised.value) and "\n" not in raised.value.reason
    assert "Line: 3" in raised.value.reason and "convert a value to 'INTEGER'" in raised.value.reason


def test_reason_is_one_line_without_the_echoed_query_or_suggestions() -> None:
    said = reason(Exception("Parser Error: syntax error\n\nLINE 1: SELEC 1\n        ^\nPossible Solution: x"))
    assert said == "Parser Error: syntax error"
    assert reason(Exception("x" * 1000)).endswith("...") and len(reason(Exception("x" * 1000))) == 400


def test_a_failed_transaction_leaves_nothing(database: Database) -> None:
    def insert_twice() -> None:
        with database.transaction():
            database.execute("INSERT INTO t VALUES (1, 'a')")
            database.execute("INSERT INTO t VALUES (1, 'again')")

    with pytest.raises(DatabaseError):
        insert_twice()
    assert database.scalar("SELECT count(*) FROM t") == 0
    with database.transaction():
        database.execute("INSERT INTO t VALUES ($id, $name)", {"id": 2, "name": "b", "unused": 0})
    assert database.rows("SELECT * FROM t") == [(2, "b")]


def test_reads_through_the_boundary(database: Database) -> None:
    database.execute("ALTER TABLE t ADD COLUMN created_at TIMESTAMP")
    now = dt.datetime(2026, 11, 24)
    database.append("t", ["id", "name"], [[3, "c", now], [4, None, now]], "upsert")
    assert database.counts("SELECT count(*) AS n, count(name) AS named FROM t") == {"n": 2, "named": 1}
    assert database.table_names() == {"t"} and database.column_names("t") == ["id", "name", "created_at"]
    database.append("t", ["id"], [[3]], "delete")
    assert database.rows("SELECT id FROM t") == [(4,)]
    cursor = database.cursor()
    assert cursor.scalar("SELECT max(id) FROM t") == 4 and cursor.row("SELECT 1 WHERE false") is None


def test_statement_kinds() -> None:
    assert statement_kinds("SELECT 1; DELETE FROM t") == ["SELECT", "DELETE"]
    with pytest.raises(DatabaseError, match="syntax error"):
        statement_kinds("SELEC (")


@pytest.mark.parametrize(
    "said",
    [
        'TransactionContext Error: Failed to commit: Could not write file "{wal}": No space left on device',
        'IO Error: Could not write file "{wal}": No space left on device',
    ],
)
def test_a_full_disk_is_said_in_one_line_naming_the_database(database: Database, said: str) -> None:
    """DuckDB's words when the disk that holds the database (or its WAL) is full, as a commit or a write
    says them: the error says the disk is full, names the database, and the run stops (exit 3)."""
    wal = f"{database.path}.wal"
    exc = duckdb.TransactionException if said.startswith("Transaction") else duckdb.IOException
    error = translated_error(exc(said.format(wal=wal)), database.path)
    assert error.kind is DatabaseFailure.DISK_FULL
    assert str(error).startswith(f"{database.path}: the disk is full (")
    assert "No space left on device" in str(error) and "\n" not in str(error)
    assert error.reason.startswith("the disk is full (")  # what a caller that words it itself says
    assert exit_code_for(error) == EXIT_ABORTED


def test_a_commit_that_fails_says_why_not_that_nothing_was_left_to_roll_back(database: Database) -> None:
    """A failed commit ends DuckDB's transaction itself; rolling back then failed with "cannot rollback -
    no transaction is active", which hid the real reason (a full disk, for `pipeline load`)."""
    other = database.cursor()

    def insert_beside_another() -> None:
        with database.transaction():
            database.execute("INSERT INTO t VALUES (1, 'mine')")
            other.execute("INSERT INTO t VALUES (1, 'theirs')")  # committed first: ours conflicts at commit

    with pytest.raises(DatabaseError) as raised:
        insert_beside_another()
    assert "Failed to commit" in raised.value.reason and "duplicate key" in raised.value.reason
    assert database.rows("SELECT * FROM t") == [(1, "theirs")]
    with database.transaction():  # and the connection goes on
        database.execute("INSERT INTO t VALUES (2, 'next')")
    assert database.scalar("SELECT count(*) FROM t") == 2


def make_ready(connection: Database, *, fail: bool) -> Database:
    with connection.closed_on_error():
        connection.execute("CREATE TABLE t AS SELECT 1 AS x")
        if fail:
            raise ZeroDivisionError  # the block's error goes on
    return connection


def test_an_error_while_a_connection_is_made_ready_closes_it(tmp_path: Path) -> None:
    failing = open_database(tmp_path / "failing.duckdb")
    with pytest.raises(ZeroDivisionError):
        make_ready(failing, fail=True)
    with pytest.raises(DatabaseError, match="closed"):
        failing.execute("SELECT 1")
    ready = make_ready(open_database(tmp_path / "ready.duckdb"), fail=False)
    assert ready.scalar("SELECT x FROM t") == 1  # left open for its caller
    ready.close()
