from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pipeline.errors import ConfigError
from pipeline.job import JobSpec, load_job
from pipeline.loader import load_file
from tests.support.jobs import table_rows, write_job

ADZUNA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return load_job(write_job(tmp_path))


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def load(spec: JobSpec, path: Path, **kwargs: object) -> object:
    with duckdb.connect(str(spec.database)) as connection:
        return load_file(connection, spec, path, **kwargs)  # type: ignore[arg-type]


ROWS = [{"id": i, "title": f"T{i}", "description": f"D{i}", "extra": i * 2} for i in range(5)]


def test_jsonl_then_again_skips_known_ids(spec: JobSpec, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ROWS[:3])
    report = load(spec, path)
    assert (report.inserted, report.rows_in_file, report.table) == (3, 3, "postings")  # type: ignore[attr-defined]
    bigger = write_jsonl(tmp_path / "b.jsonl", ROWS)
    report = load(spec, bigger)
    assert (report.inserted, report.skipped) == (2, 3)  # type: ignore[attr-defined]
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


def test_rename_and_other_table(spec: JobSpec, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"Ref": 1, "Title": "x", "Body": "y"}])
    load(spec, path, rename={"Ref": "id", "Body": "description"}, table="other")
    assert table_rows(spec.database, "SELECT id, Title, description FROM other") == [(1, "x", "y")]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"title": "x", "description": "y"}], r"no column \['id'\] .*--rename FILE_COLUMN=NAME"),
        ([{"id": 1, "title": "x"}], r"no column \['description'\]"),
        (
            [{"id": 1, "title": "x", "description": "y"}, {"id": 1, "title": "z", "description": "w"}],
            r"id column 'id' has duplicate values \(e.g. 1\)",
        ),
        (
            [{"id": None, "title": "x", "description": "y"}, {"id": 2, "title": "x", "description": "y"}],
            "1 rows have no value in the id column 'id'",
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


@pytest.mark.skipif(not ADZUNA.is_file(), reason="../shared datasets not present")
def test_real_adzuna_csv_with_renames(spec: JobSpec) -> None:
    report = load(spec, ADZUNA, rename={"FullDescription": "description"})
    assert report.inserted == 2499  # type: ignore[attr-defined]
    rows = table_rows(spec.database, "SELECT count(*), min(length(description)) > 0 FROM postings")
    assert rows == [(2499, True)]
