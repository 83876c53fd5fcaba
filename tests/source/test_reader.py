from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pipeline.errors import ConfigError, SourceMissingError
from pipeline.job.commands import command
from pipeline.source.db import open_database
from pipeline.source.relation import describe_source
from pipeline.store.opening import prepare_database
from tests.support.jobs import make_job


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("CREATE TABLE postings AS SELECT 1 AS id, 'x' AS title", r"no column \['description'\]"),
        (
            "CREATE TABLE postings AS SELECT NULL::INT AS id, 'x' AS title, 'y' AS description",
            "1 record has a NULL id in column id",
        ),
        (
            "CREATE TABLE postings AS SELECT NULL::INT AS id, 'x' AS title, 'y' AS description FROM range(2)",
            "2 records have a NULL id in column id",
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
    connection = open_database(spec.database)
    connection.execute(setup)
    with pytest.raises(ConfigError, match=message):
        describe_source(connection, spec)
    connection.close()


def test_a_missing_table_names_the_commands_that_fill_it_as_given(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0, source={"seed_file": "seed.jsonl"})
    trial = spec.with_overrides(database=tmp_path / "trial.duckdb").for_variant("v2")
    connection = open_database(trial.database)
    with pytest.raises(SourceMissingError) as missing:
        describe_source(connection, trial)
    connection.close()
    given = ("--database", str(trial.database))
    load = command("load", "FILE", "--job", str(spec.source_file), *given)
    run = command("run", str(spec.source_file), *given, "--variant", "v2")
    assert str(missing.value).endswith(  # the program by its path: pasted outside the virtualenv too
        f"table 'postings' does not exist (key source.table); load records with `{load}` "
        f"(`{run}` loads key source.seed_file, {tmp_path / 'seed.jsonl'})"
    )


def test_failing_query_is_a_config_error(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    broken = spec.model_copy(
        update={"source": spec.source.model_copy(update={"table": None, "query": "SELEC nope"})}
    )
    connection = open_database(spec.database)
    with pytest.raises(ConfigError, match="key source.query fails"):
        describe_source(connection, broken)
    connection.close()


def test_id_type_is_kept(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    connection = open_database(spec.database)
    connection.execute(
        "CREATE TABLE postings AS SELECT 'a-' || i AS id, 't' AS title, 'd' AS description FROM range(3) t(i)"
    )
    assert describe_source(connection, spec).id_type == "VARCHAR"
    connection.close()


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
