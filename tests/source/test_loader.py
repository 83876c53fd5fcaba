from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import duckdb
import pytest

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec, load_job
from pipeline.source.db import open_database
from pipeline.source.loader import LoadReport, load_file
from pipeline.store.opening import prepare_database
from tests.support.datasets import ADZUNA
from tests.support.jobs import table_rows, write_job


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return load_job(write_job(tmp_path))


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def load(
    spec: JobSpec,
    path: Path,
    *,
    table: str | None = None,
    rename: Mapping[str, str] | None = None,
    replace: bool = False,
) -> LoadReport:
    connection = open_database(spec.database)
    try:
        return load_file(connection, spec, path, table=table, rename=rename, replace=replace)
    finally:
        connection.close()


ROWS = [{"id": i, "title": f"T{i}", "description": f"D{i}", "extra": i * 2} for i in range(5)]


def test_jsonl_then_again_skips_known_ids(spec: JobSpec, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ROWS[:3])
    report = load(spec, path)
    assert (report.inserted, report.rows_in_file, report.table) == (3, 3, "postings")
    bigger = write_jsonl(tmp_path / "b.jsonl", ROWS)
    report = load(spec, bigger)
    assert (report.inserted, report.skipped) == (2, 3)
    assert table_rows(spec.database, "SELECT count(*), count(DISTINCT id) FROM postings") == [(5, 5)]


def test_csv_and_parquet(spec: JobSpec, tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    csv.write_text('id,title,description\n1,Nurse,"Care, with commas"\n2,Chef,Cook\n')
    load(spec, csv)
    with duckdb.connect() as connection:
        parquet = tmp_path / "p.parquet"
        connection.execute(
            f"COPY (SELECT 3 AS id, 'Pilot' AS title, 'Fly' AS description) TO '{parquet}' (FORMAT parquet)"
        )
    load(spec, parquet)
    assert table_rows(spec.database, "SELECT id, description FROM postings ORDER BY id") == [
        (1, "Care, with commas"),
        (2, "Cook"),
        (3, "Fly"),
    ]


def test_replace(spec: JobSpec, tmp_path: Path) -> None:
    load(spec, write_jsonl(tmp_path / "a.jsonl", ROWS))
    load(spec, write_jsonl(tmp_path / "b.jsonl", ROWS[:1]), replace=True)
    assert table_rows(spec.database, "SELECT count(*) FROM postings") == [(1,)]


def test_a_newer_export_inserts_new_updates_changed_and_leaves_identical_rows(
    spec: JobSpec, tmp_path: Path
) -> None:
    load(spec, write_jsonl(tmp_path / "monday.jsonl", ROWS[:4]))
    tuesday = [
        ROWS[0],  # identical
        {**ROWS[1], "description": "D1, edited"},  # changed text
        {**ROWS[2], "extra": 99},  # changed in a column the prompt does not use: still an update
        ROWS[3],
        ROWS[4],  # new
    ]
    report = load(spec, write_jsonl(tmp_path / "tuesday.jsonl", tuesday))
    counts = (report.inserted, report.updated, report.unchanged, report.removed)
    assert counts == (1, 2, 2, 0)
    assert table_rows(spec.database, "SELECT id, description, extra FROM postings ORDER BY id") == [
        (0, "D0", 0),
        (1, "D1, edited", 2),
        (2, "D2", 99),
        (3, "D3", 6),
        (4, "D4", 8),
    ]
    again = load(spec, write_jsonl(tmp_path / "again.jsonl", tuesday))
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 5)


def test_a_file_without_some_columns_updates_only_those_it_has(spec: JobSpec, tmp_path: Path) -> None:
    load(spec, write_jsonl(tmp_path / "a.jsonl", ROWS[:2]))
    slim = [{"id": 0, "title": "T0", "description": "new"}, {"id": 1, "title": "T1", "description": "D1"}]
    report = load(spec, write_jsonl(tmp_path / "b.jsonl", slim))
    assert (report.updated, report.unchanged) == (1, 1)
    assert table_rows(spec.database, "SELECT id, description, extra FROM postings ORDER BY id") == [
        (0, "new", 0),
        (1, "D1", 2),
    ]


def test_replace_counts_what_changed_and_what_it_removed(spec: JobSpec, tmp_path: Path) -> None:
    load(spec, write_jsonl(tmp_path / "a.jsonl", ROWS[:4]))
    newer = [ROWS[0], {**ROWS[1], "title": "changed"}, ROWS[4]]
    report = load(spec, write_jsonl(tmp_path / "b.jsonl", newer), replace=True)
    counts = (report.inserted, report.updated, report.unchanged, report.removed)
    assert counts == (1, 1, 1, 2)
    assert table_rows(spec.database, "SELECT id FROM postings ORDER BY id") == [(0,), (1,), (4,)]


def test_a_failed_load_changes_nothing(spec: JobSpec, tmp_path: Path) -> None:
    load(spec, write_jsonl(tmp_path / "a.jsonl", ROWS[:3]))
    before = table_rows(spec.database, "SELECT * FROM postings ORDER BY id")
    # a changed row and a new one, then a row the table cannot take (a list where a number was)
    broken = [{**ROWS[0], "description": "edited"}, ROWS[3], {**ROWS[4], "extra": "not a number"}]
    with pytest.raises(ConfigError, match=r"b\.jsonl: cannot load into table 'postings'"):
        load(spec, write_jsonl(tmp_path / "b.jsonl", broken))
    assert table_rows(spec.database, "SELECT * FROM postings ORDER BY id") == before


def test_rename_and_other_table(spec: JobSpec, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"Ref": 1, "Title": "x", "Body": "y"}])
    load(spec, path, rename={"Ref": "id", "Body": "description"}, table="other")
    assert table_rows(spec.database, "SELECT id, Title, description FROM other") == [(1, "x", "y")]


def test_a_rename_of_a_column_the_file_does_not_have_names_what_was_typed(
    spec: JobSpec, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": 1, "title": "x", "FullDescription": "y"}])
    with pytest.raises(ConfigError) as caught:
        load(spec, path, rename={"FullDescriptoin": "description"})
    assert str(caught.value) == (
        f"--rename FullDescriptoin=description: {path} has no column 'FullDescriptoin'; "
        "it has ['id', 'title', 'FullDescription']"
    )
    load(spec, path, rename={"fulldescription": "description"})  # as DuckDB matches names: any case
    assert table_rows(spec.database, "SELECT description FROM postings") == [("y",)]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"title": "x", "description": "y"}], r"no column \['id'\] .*--rename FILE_COLUMN=NAME"),
        ([{"id": 1, "title": "x"}], r"no column \['description'\]"),
        (
            [{"id": 1, "title": "x", "description": "y"}, {"id": 1, "title": "z", "description": "w"}],
            r"ids are not unique in column id \(e.g. 1\)",
        ),
        (
            [{"id": None, "title": "x", "description": "y"}, {"id": 2, "title": "x", "description": "y"}],
            "1 record has a NULL id in column id",
        ),
    ],
)
def test_bad_files_name_the_file(
    spec: JobSpec, tmp_path: Path, rows: list[dict[str, object]], message: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ConfigError, match=message) as caught:
        load(spec, path)
    assert str(caught.value).startswith(str(path))
    assert not spec.database.exists() or table_rows(
        spec.database, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'postings'"
    ) == [(0,)]


def test_missing_unknown_and_unreadable(spec: JobSpec, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.csv: no such file"):
        load(spec, tmp_path / "nope.csv")
    (tmp_path / "a.xlsx").write_text("x")
    with pytest.raises(ConfigError, match="unknown file type '.xlsx'"):
        load(spec, tmp_path / "a.xlsx")
    (tmp_path / "broken.jsonl").write_text('{"id": 1, "title": \n')
    with pytest.raises(ConfigError, match="broken.jsonl: cannot read"):
        load(spec, tmp_path / "broken.jsonl")


def test_an_empty_seed_file_names_the_key_and_the_file(tmp_path: Path) -> None:
    seed = tmp_path / "seed.csv"
    seed.write_text("")
    spec = load_job(write_job(tmp_path, source={"seed_file": "seed.csv"}))
    with pytest.raises(ConfigError) as caught:
        prepare_database(spec)
    assert str(caught.value).endswith(f"key 'source.seed_file': {seed}: empty file (nothing to load)")


def test_replace_keeps_the_tables_text_ids_as_text(spec: JobSpec, tmp_path: Path) -> None:
    load(spec, write_jsonl(tmp_path / "text.jsonl", [{"id": "a7", "title": "T", "description": "D"}]))
    numeric = write_jsonl(tmp_path / "n.jsonl", [{"id": 7, "title": "T", "description": "D"}])
    report = load(spec, numeric, replace=True)
    assert (report.inserted, report.removed) == (1, 1)
    assert table_rows(spec.database, "SELECT id FROM postings") == [("7",)]


@pytest.mark.skipif(not ADZUNA.is_file(), reason="../shared datasets not present")
def test_real_adzuna_csv_with_renames(spec: JobSpec) -> None:
    report = load(spec, ADZUNA, rename={"FullDescription": "description"})
    assert report.inserted == 2499
    rows = table_rows(spec.database, "SELECT count(*), min(length(description)) > 0 FROM postings")
    assert rows == [(2499, True)]


def test_a_load_says_which_records_have_nothing_to_extract_from(spec: JobSpec, tmp_path: Path) -> None:
    """Every prompt field empty (NULL, '' or whitespace): the file's records a run will not send."""
    csv = tmp_path / "tickets.csv"
    csv.write_text('id,title,description\n1,Nurse,Care\n17,,\n42," ",""\n99,,"\t"\n5,,Text\n')
    report = load(spec, csv)
    assert (report.blank.count, report.blank.ids) == (3, (17, 42, 99))
    assert report.blank.describe("they will not be sent") == (
        "3 records have empty title and description: ids 17, 42, 99; they will not be sent"
    )
    csv.write_text("id,title,description\n17,Now,with text\n")  # the record edited since
    assert load(spec, csv).blank.count == 0
