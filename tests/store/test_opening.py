"""Opening the job's database: a new one exists only once what it was created for succeeded, built
beside where it goes (the commands' own cases are in tests/cli/test_bad_input.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.job.commands import command
from pipeline.store.opening import (
    load_source,
    new_database,
    open_for_reading,
    open_job_output,
    prepare_database,
)
from tests.support.jobs import make_job, make_source, table_rows


def files_in(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")}


def build(database: Path, then: Callable[[], object]) -> None:
    """A new database with one table, ``then`` called before the block ends."""
    with new_database(database, None) as connection:
        connection.execute("CREATE TABLE t AS SELECT 42 AS x")
        then()


def refuse() -> None:
    raise ConfigError("the input is bad")


def test_a_new_database_is_put_in_place_when_the_block_succeeds(tmp_path: Path) -> None:
    database = tmp_path / "made" / "here" / "new.duckdb"
    with new_database(database, None) as connection:
        connection.execute("CREATE TABLE t AS SELECT 42 AS x")
        assert not database.exists()  # built beside it until the block ends
    assert files_in(tmp_path) == {"made", "made/here", "made/here/new.duckdb"}  # no WAL, no leftover
    assert table_rows(database, "SELECT x FROM t") == [(42,)]


def test_a_block_that_fails_leaves_nothing_it_made(tmp_path: Path) -> None:
    database = tmp_path / "made" / "here" / "new.duckdb"
    with pytest.raises(ConfigError, match="the input is bad"):
        build(database, refuse)
    assert files_in(tmp_path) == set()  # not the file, not its WAL, not the folders made for it


def test_a_database_another_process_made_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    database = tmp_path / "new.duckdb"
    with pytest.raises(ConfigError) as caught:
        build(database, lambda: database.write_bytes(b"theirs"))
    assert str(caught.value) == (
        f"{database}: another process created this database meanwhile; run the command again"
    )
    assert database.read_bytes() == b"theirs"
    assert files_in(tmp_path) == {"new.duckdb"}


def test_a_run_whose_source_check_fails_creates_no_database(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0, database="sub/test.duckdb")  # no table postings anywhere
    before = files_in(tmp_path)
    with pytest.raises(ConfigError, match="postings"):
        prepare_database(spec)
    assert files_in(tmp_path) == before


def test_a_run_on_a_new_database_loads_its_seed_and_keeps_the_connection_open(tmp_path: Path) -> None:
    seed = tmp_path / "seed.jsonl"
    seed.write_text('{"id": 1, "title": "t", "description": "d"}\n')
    spec = make_job(tmp_path, records=0, source={"seed_file": str(seed)})
    connection = prepare_database(spec)
    try:
        assert {"postings", "results", "failures", "runs"} <= connection.table_names()
        assert connection.path == spec.database  # the database itself, not the file it was built in
    finally:
        connection.close()
    assert files_in(tmp_path) == {"job.yaml", "seed.jsonl", "test.duckdb"}


def test_a_load_that_fails_creates_no_database_and_one_that_succeeds_does(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    data = tmp_path / "records.jsonl"
    data.write_text('{"id": 1, "title": "t"}\n')  # no description
    with pytest.raises(ConfigError, match=r"no column \['description'\]"):
        load_source(spec, data)
    assert not spec.database.exists()
    data.write_text('{"id": 1, "title": "t", "description": "d"}\n')
    assert load_source(spec, data).inserted == 1
    assert table_rows(spec.database, "SELECT id FROM postings") == [(1,)]
    assert files_in(tmp_path) == {"job.yaml", "records.jsonl", "test.duckdb"}


def test_what_a_killed_build_left_is_removed_and_a_running_ones_is_not(tmp_path: Path) -> None:
    dead = 2**22 + 1  # above any pid (Linux's pid_max is at most 2**22): as a build killed with -9
    abandoned = [
        tmp_path / f".new.duckdb.{dead}-0a1b2c3d.new",
        tmp_path / f".new.duckdb.{dead}-0a1b2c3d.new.wal",
    ]
    running = tmp_path / f".new.duckdb.{os.getpid()}-99999999.new"  # this process's, still building
    for path in (*abandoned, running):
        path.write_bytes(b"half a database")
    build(tmp_path / "new.duckdb", lambda: None)
    assert files_in(tmp_path) == {"new.duckdb", running.name}


def test_a_reader_before_anything_was_made_names_the_commands_that_make_it(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    trial = spec.with_overrides(database=tmp_path / "a trial.duckdb").for_variant("v2")
    with pytest.raises(ConfigError) as missing:
        open_for_reading(trial)
    given = ("--database", str(trial.database))
    load = command("load", "FILE", "--job", str(spec.source_file), *given)
    run = command("run", str(spec.source_file), *given, "--variant", "v2")
    assert str(missing.value) == f"{trial.database}: database does not exist yet (run `{load}` or `{run}`)"
    assert not trial.database.exists()  # a reader creates nothing
    make_source(trial.database, 2)
    with pytest.raises(ConfigError) as empty:
        open_job_output(trial, ["results"])
    assert str(empty.value).endswith(f"nothing has been extracted (run `{run}` first)")


def test_a_reader_refused_leaves_no_connection_open(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2)
    with pytest.raises(ConfigError, match="nothing has been extracted") as refused:
        open_job_output(spec, ["results"])
    # The error is kept (its traceback holds the opener's frame), yet the connection is closed: DuckDB
    # refuses a writable connection to a file this process still holds read-only.
    prepare_database(spec).close()
    assert refused.traceback
