"""`pipeline export`: results joined to the source ids, written by DuckDB's COPY, atomically."""

from __future__ import annotations

import csv
import functools
import re
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from random import Random
from typing import Any

import anyio
import duckdb
import httpx2
import orjson
import pytest
from typer.testing import CliRunner

import pipeline.reports.export as export_module
from pipeline.cli import app
from pipeline.errors import ConfigError, DatabaseLockedError
from pipeline.job.spec import JobSpec
from pipeline.quality.fields import schema_fields
from pipeline.reports.export import (
    ExportFormat,
    export_format,
    export_memory_limit,
    export_results,
    failures_path,
)
from pipeline.reports.flatten import SESSION_SETTINGS, flat_columns, select_list
from pipeline.sim.instances import InstanceGenerator
from tests.support.fakes import completion, respond
from tests.support.jobs import make_job
from tests.support.outputs import database_held_by_another_process, job_with_outputs, record_number
from tests.support.runs import run_served
from tests.support.schema_constructs import EveryConstruct

COLUMNS = [
    "id",
    "extracted",
    "model",
    "attempts",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "finish_reason",
    "created_at",
    "variant",
    "run_id",
    "latency_s",
    "max_tokens",
    "total_prompt_tokens",
    "total_completion_tokens",
    "total_reasoning_tokens",
    "total_latency_s",
    "content_hash",
    "prompt_hash",
    "schema_hash",
    "settings_hash",
]
DONE_IDS = [0, 8, 9, 10, 11]  # job_with_outputs: records 1-7 fail


def export_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["export", *args])
    return result.exit_code, result.stdout, result.stderr


def read_rows(path: Path, fmt: ExportFormat) -> list[dict[str, Any]]:
    """The exported rows as Python values, sorted by id; ``extracted`` parsed from JSON text."""
    if fmt is ExportFormat.JSONL:
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    elif fmt is ExportFormat.CSV:
        with path.open(newline="") as file:
            rows = [dict(row) for row in csv.DictReader(file)]
        for row in rows:
            row["id"] = int(row["id"])
    else:
        with duckdb.connect() as connection:
            cursor = connection.execute("SELECT * FROM read_parquet(?)", [str(path)])
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return sorted(rows, key=lambda row: row["id"])


def parquet_type(path: Path, column: str) -> str:
    with duckdb.connect() as connection:
        described = connection.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall()
    return next(str(row[1]) for row in described if row[0] == column)


@pytest.mark.parametrize("fmt", list(ExportFormat))
def test_each_format_holds_every_result_with_its_id(tmp_path: Path, fmt: ExportFormat) -> None:
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "export" / f"results.{fmt}"
    out.parent.mkdir()
    report = export_results(spec, out, fmt)
    assert (report.out, report.rows, report.failures_out) == (out, 5, None)
    rows = read_rows(out, fmt)
    assert list(rows[0]) == COLUMNS
    assert [row["id"] for row in rows] == DONE_IDS
    for row in rows:
        # jsonl nests the object; csv and parquet carry its text (parquet typed as JSON)
        extracted = row["extracted"] if fmt is ExportFormat.JSONL else orjson.loads(row["extracted"])
        assert extracted == {
            "title": f"Title {row['id']}",
            "skills": ["SQL", "Python"],
            "years": row["id"],
            "low": 1,
            "high": 2,
        }
        assert (row["model"], str(row["attempts"]), row["finish_reason"]) == ("test-model", "1", "stop")
        assert str(row["completion_tokens"]) == "40" and str(row["reasoning_tokens"]) == "10"
    if fmt is ExportFormat.PARQUET:
        assert parquet_type(out, "extracted") == "JSON"
    assert sorted(path.name for path in out.parent.iterdir()) == [out.name]  # no temporary file left


def test_only_ids_still_in_the_source_under_the_source_id_name(tmp_path: Path) -> None:
    query = "SELECT id AS posting_id, title, description FROM postings WHERE id <> 9"
    spec = job_with_outputs(tmp_path, source={"table": None, "query": query, "id_column": "posting_id"})
    out = tmp_path / "out.jsonl"
    assert export_results(spec, out, ExportFormat.JSONL).rows == 4
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(row["posting_id"] for row in rows) == [0, 8, 10, 11]
    assert all("id" not in row for row in rows)


def test_include_failures_writes_them_beside_the_results(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "results.parquet"
    report = export_results(spec, out, ExportFormat.PARQUET, include_failures=True)
    assert report.failures_out == tmp_path / "results.failures.parquet"
    assert (report.rows, report.failure_rows) == (5, 7)
    with duckdb.connect() as connection:
        failures = connection.execute(
            "SELECT id, failure_class, attempts, message, length(last_raw_output) FROM read_parquet(?) "
            "ORDER BY id",
            [str(report.failures_out)],
        ).fetchall()
    assert [(row[0], row[1]) for row in failures] == [
        (1, "invalid_json"),
        (2, "invalid_json"),
        (3, "invalid_json"),
        (4, "truncated"),
        (5, "schema_invalid"),
        (6, "schema_invalid"),
        (7, "permanent"),
    ]
    assert failures[0][4] > 500  # the whole raw output, not an excerpt
    assert failures[6][3] == "HTTP 400: the prompt is longer than the context window"


def test_formats_from_extensions_and_failure_paths() -> None:
    assert export_format(Path("a.PARQUET"), None) is ExportFormat.PARQUET
    assert export_format(Path("a.ndjson"), None) is ExportFormat.JSONL
    assert export_format(Path("a.txt"), "csv") is ExportFormat.CSV
    with pytest.raises(ConfigError, match=r"^a\.xlsx: cannot tell the export format .* '\.xlsx'"):
        export_format(Path("a.xlsx"), None)
    with pytest.raises(
        ConfigError, match=r"^out: unknown export format 'xml'; use --format parquet\|jsonl\|csv"
    ):
        export_format(Path("out"), "xml")
    assert failures_path(Path("/x/r.csv"), ExportFormat.CSV) == Path("/x/r.failures.csv")
    assert failures_path(Path("/x/r.ndjson"), ExportFormat.JSONL) == Path("/x/r.failures.ndjson")
    assert failures_path(Path("/x/dump"), ExportFormat.PARQUET) == Path("/x/dump.failures.parquet")


def test_the_export_gets_at_least_a_gigabyte(tmp_path: Path) -> None:
    assert export_memory_limit(make_job(tmp_path, records=0)) == "1GB"
    assert export_memory_limit(make_job(tmp_path, records=0, duckdb_memory_limit="2GiB")) == "2GiB"


def test_a_failed_export_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "export" / "results.jsonl"
    out.parent.mkdir()
    out.write_text("the previous export\n")

    def failing(spec: JobSpec) -> str:
        # The results file is written in full before the failures' COPY fails. (An error() raised
        # midway through a parallel COPY can deadlock DuckDB 2.0's task executor, so none here.)
        return "SELECT * FROM the_disk_is_gone"

    monkeypatch.setattr(export_module, "_failures_sql", failing)
    with pytest.raises(ConfigError, match=r"results\.failures\.jsonl: export failed \(.*the_disk_is_gone"):
        export_results(spec, out, ExportFormat.JSONL, include_failures=True)
    assert out.read_text() == "the previous export\n"
    assert [path.name for path in out.parent.iterdir()] == ["results.jsonl"]


def test_a_path_with_quotes_is_passed_safely(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "it's a \"test\"'); DROP TABLE results; --" / "out.csv"
    out.parent.mkdir()
    assert export_results(spec, out, ExportFormat.CSV).rows == 5
    assert [row["id"] for row in read_rows(out, ExportFormat.CSV)] == DONE_IDS


def test_cli_prints_one_line_and_takes_the_format_from_the_path(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "results.ndjson"
    code, stdout, _ = export_cli(str(spec.source_file), "--out", str(out), "--include-failures")
    assert code == 0
    assert stdout == (
        f"exported 5 results to {out} (jsonl), 7 failures to {tmp_path / 'results.failures.ndjson'}\n"
    )
    assert [row["id"] for row in read_rows(out, ExportFormat.JSONL)] == DONE_IDS
    dump = tmp_path / "dump"
    code, stdout, _ = export_cli(str(spec.source_file), "--out", str(dump), "--format", "csv")
    assert (code, stdout) == (0, f"exported 5 results to {dump} (csv)\n")
    assert read_rows(dump, ExportFormat.CSV)[0]["id"] == 0


def test_cli_unknown_format_or_extension_exits_2_naming_the_path(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "results.xlsx"
    code, stdout, stderr = export_cli(str(spec.source_file), "--out", str(out))
    assert code == 2 and stdout == "" and len(stderr.splitlines()) == 1
    assert stderr.startswith(f"error: {out}: cannot tell the export format from the extension '.xlsx'")
    code, _, stderr = export_cli(str(spec.source_file), "--out", str(out), "--format", "excel")
    assert code == 2 and stderr.startswith(f"error: {out}: unknown export format 'excel'")
    assert not out.exists()


def test_cli_missing_database_or_results_exit_2(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    out = tmp_path / "out.parquet"
    code, _, stderr = export_cli(str(spec.source_file), "--out", str(out))
    assert code == 2 and len(stderr.splitlines()) == 1 and "does not exist yet" in stderr
    make_job(tmp_path, records=3)  # a source, but no run yet
    code, _, stderr = export_cli(str(spec.source_file), "--out", str(out))
    assert code == 2 and stderr.startswith(f"error: {spec.database}: no table 'results' yet")
    assert not any(path.name.startswith(("out", ".out")) for path in tmp_path.iterdir())


def test_a_folder_that_does_not_exist_is_not_made(tmp_path: Path) -> None:
    """As with --database: a typo in the folder is refused, by the command in one line naming the
    folder, and by the library naming the file it could not write."""
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "exprots" / "out.parquet"
    code, stdout, stderr = export_cli(str(spec.source_file), "--out", str(out))
    assert (code, stdout) == (2, "")
    assert stderr == f"error: --out {out}: folder {out.parent} does not exist (nothing was created)\n"
    with pytest.raises(
        ConfigError, match=f"^{re.escape(str(out))}: export failed .*No such file or directory"
    ):
        export_results(spec, out, ExportFormat.PARQUET)
    assert not out.parent.exists()


def test_an_id_column_named_like_an_exported_column_is_refused(tmp_path: Path) -> None:
    query = "SELECT id AS model, title, description FROM postings"
    spec = make_job(tmp_path, records=0, source={"table": None, "query": query, "id_column": "model"})
    with pytest.raises(ConfigError, match=r"job\.yaml: key 'source\.id_column': 'model' is also the name"):
        export_results(spec, tmp_path / "out.csv", ExportFormat.CSV)


@pytest.mark.process
def test_a_database_held_by_another_process_exits_3(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    out = tmp_path / "out.parquet"
    with database_held_by_another_process(spec.database):
        with pytest.raises(DatabaseLockedError):
            export_results(spec, out, ExportFormat.PARQUET)
        code, stdout, stderr = export_cli(str(spec.source_file), "--out", str(out))
    assert code == 3 and stdout == ""
    assert len(stderr.splitlines()) == 1 and stderr.startswith(f"error: {spec.database}: ")
    assert not any(path.name.startswith(("out", ".out")) for path in tmp_path.iterdir())


# --- --flatten: a column per schema field ------------------------------------------------------------

LINKEDIN_FIELD_COLUMNS = [
    "title",
    "company",
    "recruiter",
    "location",
    "remote_policy",
    "employment_type",
    "working_time",
    "seniority",
    "manages_people",
    "explicit_skills",
    "inferred_capabilities",
    "requirements[].text",
    "requirements[].kind",
    "requirements[].mandatory",
    "experience_years.minimum",
    "experience_years.maximum",
    "education.level",
    "education.fields",
    "education.mandatory",
    "salary.minimum",
    "salary.maximum",
    "salary.currency",
    "salary.period",
    "salary.text",
    "benefits",
    "culture_signals",
]


def posting(number: int) -> dict[str, Any]:
    """A valid LinkedIn extraction; odd records state a salary and years, even ones neither."""
    paid = number % 2 == 1
    return {
        "title": f"Title {number}",
        "company": "Acme; Sons" if paid else None,
        "recruiter": None,
        "location": "Leeds",
        "remote_policy": "hybrid",
        "employment_type": "permanent",
        "working_time": "full-time",
        "seniority": "Senior",
        "manages_people": paid,
        "explicit_skills": ["Python", "SQL"] if paid else [],
        "inferred_capabilities": ["mentoring"],
        "requirements": [
            {"text": "Python", "kind": "skill", "mandatory": True},
            {"text": "driving licence", "kind": "legal", "mandatory": False},
        ],
        "experience_years": {"minimum": number, "maximum": None} if paid else None,
        "education": {"level": "bachelor", "fields": ["Maths", "Physics"], "mandatory": False},
        "salary": (
            {"minimum": 35000.5, "maximum": 40000, "currency": "GBP", "period": "year", "text": "£35k"}
            if paid
            else None
        ),
        "benefits": [],
        "culture_signals": [],
    }


def linkedin_answer(request: httpx2.Request) -> httpx2.Response:
    if request.url.path.endswith("/models"):
        return respond({"data": [{"id": "test-model"}]})
    return respond(completion(orjson.dumps(posting(record_number(request))).decode()))


@pytest.fixture(scope="module")
def linkedin_results(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """Records 0-3 extracted with the LinkedIn schema: nested objects, a list of objects, ints, floats."""
    spec = make_job(tmp_path_factory.mktemp("linkedin"), records=4, schema="schemas.linkedin:JobPosting")
    summary = anyio.run(functools.partial(run_served, spec, linkedin_answer))
    assert (summary.done, summary.failed) == (4, 0), summary
    return spec


def test_flatten_gives_a_typed_column_per_schema_field_in_parquet(
    linkedin_results: JobSpec, tmp_path: Path
) -> None:
    out = tmp_path / "flat.parquet"
    assert export_results(linkedin_results, out, flatten=True).rows == 4
    rows = read_rows(out, ExportFormat.PARQUET)
    assert list(rows[0]) == ["id", *LINKEDIN_FIELD_COLUMNS, *COLUMNS[2:]]  # no `extracted`
    types = {column: parquet_type(out, column) for column in LINKEDIN_FIELD_COLUMNS}
    assert types["explicit_skills"] == "VARCHAR[]" and types["requirements[].mandatory"] == "BOOLEAN[]"
    assert types["experience_years.minimum"] == "BIGINT" and types["salary.minimum"] == "DOUBLE"
    assert types["manages_people"] == "BOOLEAN" and types["seniority"] == "VARCHAR"
    paid, unpaid = rows[1], rows[0]
    assert paid["salary.minimum"] == 35000.5 and paid["salary.maximum"] == 40000.0
    assert paid["experience_years.minimum"] == 1 and paid["experience_years.maximum"] is None
    assert paid["requirements[].text"] == ["Python", "driving licence"]
    assert paid["requirements[].mandatory"] == [True, False]
    assert (paid["education.fields"], paid["explicit_skills"]) == (["Maths", "Physics"], ["Python", "SQL"])
    # a null object is null in each of its columns; an empty list stays an empty list
    assert unpaid["salary.minimum"] is None and unpaid["salary.text"] is None
    assert unpaid["experience_years.minimum"] is None and unpaid["explicit_skills"] == []


def test_flatten_keeps_json_types_in_jsonl(linkedin_results: JobSpec, tmp_path: Path) -> None:
    out = tmp_path / "flat.jsonl"
    export_results(linkedin_results, out, flatten=True)
    paid = read_rows(out, ExportFormat.JSONL)[3]
    assert {column: paid[column] for column in LINKEDIN_FIELD_COLUMNS} == {
        "title": "Title 3",
        "company": "Acme; Sons",
        "recruiter": None,
        "location": "Leeds",
        "remote_policy": "hybrid",
        "employment_type": "permanent",
        "working_time": "full-time",
        "seniority": "Senior",
        "manages_people": True,
        "explicit_skills": ["Python", "SQL"],
        "inferred_capabilities": ["mentoring"],
        "requirements[].text": ["Python", "driving licence"],
        "requirements[].kind": ["skill", "legal"],
        "requirements[].mandatory": [True, False],
        "experience_years.minimum": 3,
        "experience_years.maximum": None,
        "education.level": "bachelor",
        "education.fields": ["Maths", "Physics"],
        "education.mandatory": False,
        "salary.minimum": 35000.5,
        "salary.maximum": 40000.0,
        "salary.currency": "GBP",
        "salary.period": "year",
        "salary.text": "£35k",
        "benefits": [],
        "culture_signals": [],
    }
    assert isinstance(paid["experience_years.minimum"], int)


def test_flatten_joins_lists_in_csv_for_a_spreadsheet(linkedin_results: JobSpec, tmp_path: Path) -> None:
    out = tmp_path / "flat.csv"
    code, stdout, _ = export_cli(str(linkedin_results.source_file), "--out", str(out), "--flatten")
    assert (code, stdout) == (0, f"exported 4 results to {out} (csv)\n")
    paid, unpaid = read_rows(out, ExportFormat.CSV)[1], read_rows(out, ExportFormat.CSV)[0]
    assert (paid["explicit_skills"], paid["requirements[].text"]) == (
        "Python; SQL",
        "Python; driving licence",
    )
    assert (paid["requirements[].mandatory"], paid["manages_people"]) == ("true; false", "true")
    assert (paid["company"], paid["salary.minimum"], paid["experience_years.minimum"]) == (
        "Acme; Sons",
        "35000.5",
        "1",
    )
    assert (unpaid["salary.minimum"], unpaid["explicit_skills"], unpaid["benefits"]) == ("", "", "")


TYPED_COLUMNS = {
    "day": "DATE",
    "moment": "TIMESTAMP",
    "aware": "TIMESTAMP",
    "clock": "TIME",
    "price": "DECIMAL(6,2)",
    "amount": "DOUBLE",
    "colour": "VARCHAR",
    "level": "BIGINT",
    "one": "BIGINT",
    "kind": "VARCHAR",
    "days": "DATE[]",
    "counts": "BIGINT[]",
    "ident": "VARCHAR",
    "span": "VARCHAR",
    "anything": "JSON",
}


def typed_answer(request: httpx2.Request) -> httpx2.Response:
    """A TypedColumns answer: odd records give every optional field, even ones leave them null."""
    if request.url.path.endswith("/models"):
        return respond({"data": [{"id": "test-model"}]})
    full = record_number(request) % 2 == 1
    answer = {
        "day": "2017-05-22" if full else None,
        "moment": "2017-05-22T10:30:00",
        "aware": "2017-05-22T10:30:00+02:00" if full else None,
        "clock": "09:15:00",
        "price": "12.5",
        "amount": "3.25" if full else None,
        "colour": "red" if full else None,
        "level": 2,
        "one": 1,
        "kind": "a" if full else None,
        "days": ["2017-05-22", "2018-01-31"] if full else None,
        "counts": [1, 2] if full else None,
        "ident": "12345678-1234-5678-1234-567812345678",
        "span": "PT1H30M",
        "anything": {"a": 1},
    }
    return respond(completion(orjson.dumps(answer).decode()))


@pytest.fixture(scope="module")
def typed_results(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """Records 0-1 extracted with TypedColumns: dates, times, decimals, enums, literals, optionals."""
    folder = tmp_path_factory.mktemp("typed")
    spec = make_job(folder, records=2, schema="tests.support.schema_constructs:TypedColumns")
    summary = anyio.run(functools.partial(run_served, spec, typed_answer))
    assert (summary.done, summary.failed) == (2, 0), summary
    return spec


def test_flatten_types_each_column_as_the_schema_says_in_parquet(
    typed_results: JobSpec, tmp_path: Path
) -> None:
    """A `date | None` field was a JSON column (and `"2017-05-22"`, quotes and all, in CSV)."""
    out = tmp_path / "flat.parquet"
    export_results(typed_results, out, flatten=True)
    assert {column: parquet_type(out, column) for column in TYPED_COLUMNS} == TYPED_COLUMNS
    nulls, full = read_rows(out, ExportFormat.PARQUET)
    assert (full["day"], full["days"]) == (date(2017, 5, 22), [date(2017, 5, 22), date(2018, 1, 31)])
    assert (full["moment"], full["clock"]) == (datetime(2017, 5, 22, 10, 30), time(9, 15))
    assert full["aware"] == datetime(2017, 5, 22, 8, 30)  # its offset applied: UTC
    assert (full["price"], full["amount"], full["colour"], full["level"]) == (
        Decimal("12.50"),
        3.25,
        "red",
        2,
    )
    assert (full["ident"], full["span"]) == ("12345678-1234-5678-1234-567812345678", "PT1H30M")
    optional = ("day", "aware", "amount", "colour", "kind", "days", "counts")
    assert [nulls[column] for column in optional] == [None] * len(optional)


def test_flatten_writes_typed_values_as_plain_text_in_csv(typed_results: JobSpec, tmp_path: Path) -> None:
    out = tmp_path / "flat.csv"
    export_results(typed_results, out, flatten=True)
    nulls, full = read_rows(out, ExportFormat.CSV)
    assert {column: full[column] for column in TYPED_COLUMNS} == {
        "day": "2017-05-22",
        "moment": "2017-05-22 10:30:00",
        "aware": "2017-05-22 08:30:00",
        "clock": "09:15:00",
        "price": "12.50",
        "amount": "3.25",
        "colour": "red",
        "level": "2",
        "one": "1",
        "kind": "a",
        "days": "2017-05-22; 2018-01-31",
        "counts": "1; 2",
        "ident": "12345678-1234-5678-1234-567812345678",
        "span": "PT1H30M",
        "anything": '{"a":1}',
    }
    assert (nulls["day"], nulls["days"], nulls["kind"], nulls["amount"]) == ("", "", "", "")


def test_flatten_gives_every_construct_pydantic_emits_a_column(tmp_path: Path) -> None:
    """Each construct of a user's schema flattens, in Parquet and CSV, and a date is a DATE there."""
    schema = EveryConstruct.model_json_schema()
    answers = [InstanceGenerator(schema, Random(seed)).generate() for seed in range(5)]
    stored = [EveryConstruct.model_validate_json(orjson.dumps(value)).model_dump_json() for value in answers]
    out = {fmt: tmp_path / f"flat.{fmt}" for fmt in (ExportFormat.PARQUET, ExportFormat.CSV)}
    with duckdb.connect() as connection:
        for setting in SESSION_SETTINGS:
            connection.execute(setting)
        connection.execute(
            "CREATE TABLE r AS SELECT unnest(?)::JSON AS extracted, unnest(range(5)) AS id", [stored]
        )
        for fmt, path in out.items():
            columns = select_list(flat_columns(schema_fields(EveryConstruct), csv=fmt is ExportFormat.CSV))
            connection.execute(
                f"COPY (SELECT r.id, {columns} FROM r) TO $path (FORMAT {fmt})", {"path": str(path)}
            )
    assert parquet_type(out[ExportFormat.PARQUET], "day") == "DATE"
    assert parquet_type(out[ExportFormat.PARQUET], "maybe_literal") == "VARCHAR"
    days = [orjson.loads(value)["day"] for value in stored]
    assert [
        row["day"].isoformat() for row in read_rows(out[ExportFormat.PARQUET], ExportFormat.PARQUET)
    ] == days
    assert [row["day"] for row in read_rows(out[ExportFormat.CSV], ExportFormat.CSV)] == days


def test_flatten_applies_to_the_history_too(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    with duckdb.connect(str(spec.database)) as connection:  # as a redo leaves it: one replaced result
        connection.execute(
            "INSERT INTO results_history BY NAME "
            "SELECT *, now() AS superseded_at, 2 AS superseded_by_run FROM results WHERE record_id = 8"
        )
    report = export_results(spec, tmp_path / "out.jsonl", history=True, flatten=True)
    assert report.history_out is not None and report.history_rows == 1
    (replaced,) = read_rows(report.history_out, ExportFormat.JSONL)
    assert {key: replaced[key] for key in ("id", "title", "skills", "years", "superseded_by_run")} == {
        "id": 8,
        "title": "Title 8",
        "skills": ["SQL", "Python"],
        "years": 8,
        "superseded_by_run": 2,
    }


def test_flatten_refuses_a_field_named_like_an_exported_column(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path, schema="tests.support.schemas:ItemWithModel")
    with pytest.raises(
        ConfigError,
        match=r"job\.yaml: key 'schema': field 'model' of tests\.support\.schemas:ItemWithModel is also the "
        "name of an exported column",
    ):
        export_results(spec, tmp_path / "out.csv", flatten=True)
    assert export_results(spec, tmp_path / "out.csv").rows == 5  # unflattened, `extracted` holds it
