"""Bad input, through the command line: each gives one clear line, the right exit code, and loses nothing.

The configuration cases run in-process (typer's CliRunner: no server is needed, nothing is sent); the
cases about record content run against a real ``pipeline sim`` process. Every case that can touch the
database starts from one with the results of a previous run, and checks they are all still there.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import duckdb
import httpx2
import pytest

from pipeline.extraction.prompt import PromptBuilder
from pipeline.job.spec import JobSpec, load_job
from pipeline.run.progress import LogProgress
from tests.support.cli import cli_run, error_line
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.http import routed_to
from tests.support.jobs import job_dict, make_source, table_rows, write_job
from tests.support.local_vllm import LOCAL_EXTRA, hide_the_local_extra
from tests.support.process_guard import starts_a_process
from tests.support.processes import sim_server
from tests.support.runs import run_served

PREVIOUS_RECORDS = 6
MAX_MODEL_LEN = 8192
ONE_MB = 1_000_000
CONTROL = "nul\x00 esc\x1b[31m ff\x0c bell\x07 del\x7f unit\x1f tab\t cr\r lf\n end"


# --- helpers ----------------------------------------------------------------------------------------


def database_state(database: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, as text: equal before and after means untouched."""
    with duckdb.connect(str(database), read_only=True) as connection:
        tables = [
            str(row[0]) for row in connection.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        ]
        return {
            table: sorted(
                tuple(str(value) for value in row)
                for row in connection.execute(f'SELECT * FROM "{table}"').fetchall()
            )
            for table in sorted(tables)
        }


def rewrite_job(folder: Path, **overrides: Any) -> Path:
    """The job file of ``folder`` with a mistake in it (same database as before)."""
    return write_job(folder, **overrides)


@pytest.fixture(scope="module")
def previous_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database of a previous, successful run (made once; each test gets a copy)."""
    folder = tmp_path_factory.mktemp("previous")
    make_source(folder / "test.duckdb", PREVIOUS_RECORDS)
    server = ScriptedServer([respond(good_completion())])
    spec = load_job(write_job(folder))
    summary = anyio.run(functools.partial(run_served, spec, server, progress=LogProgress(interval_s=3600)))
    assert summary.done == PREVIOUS_RECORDS
    return folder / "test.duckdb"


@pytest.fixture
def previous(tmp_path: Path, previous_database: Path) -> Path:
    """A job folder whose database holds the results of a previous, successful run."""
    shutil.copyfile(previous_database, tmp_path / "test.duckdb")
    write_job(tmp_path)
    return tmp_path


def model_list(request: httpx2.Request) -> httpx2.Response:
    """A server's ``/v1/models`` listing the job's model: all a run with nothing to do asks."""
    return respond({"object": "list", "data": [{"id": "test-model"}]})


def assert_nothing_lost(folder: Path, before: dict[str, list[tuple[Any, ...]]]) -> None:
    database = folder / "test.duckdb"
    assert database_state(database) == before  # the database still opens, and is unchanged
    assert table_rows(database, "SELECT count(*) FROM results") == [(PREVIOUS_RECORDS,)]


# --- the job file -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key", "expected"),
    [
        ({"concurency": 64}, "concurency", "unknown key (did you mean 'concurrency'?)"),
        ({"retry": {"reask": 3}}, "retry.reask", "unknown key (did you mean 'reasks'?)"),
        ({"source": {"feilds": ["x"]}}, "source.feilds", "unknown key (did you mean 'fields'?)"),
        ({"schema": "schemas.nope:Thing"}, "schema", "cannot import module 'schemas.nope'"),
        (
            {"schema": "tests.support.schemas:Nope"},
            "schema",
            "module 'tests.support.schemas' has no class 'Nope'",
        ),
        ({"schema": "tests.support.schemas:NotAModel"}, "schema", "is not a Pydantic model class"),
        ({"chunking": {"field": "description", "pases": 2}}, "chunking.pases", "(did you mean 'passes'?)"),
        ({"chunking": {"field": "body"}}, "chunking.field", "'body' is not a field prompt.user sends"),
        (
            {"chunking": {"field": "description", "max_chunk_tokens": 10}},
            "chunking.max_chunk_tokens",
            "must be a number of tokens from 64",
        ),
        (
            {"schema": "tests.support.schemas:MisdeclaredMerge"},
            "schema",
            "field 'years' (number) declares merge 'union', which does not fit it",
        ),
        ({"schema": "no colon"}, "schema", "must be an import path like package.module:Class"),
    ],
)
@pytest.mark.parametrize("command", ["run", "status", "load"])
def test_a_bad_job_file_is_one_line_naming_file_and_key(
    previous: Path, overrides: dict[str, Any], key: str, expected: str, command: str
) -> None:
    before = database_state(previous / "test.duckdb")
    job = rewrite_job(previous, **overrides)
    args = {"run": ["run", str(job)], "status": ["status", str(job)]}.get(command)
    args = args or ["load", str(previous / "none.jsonl"), "--job", str(job)]
    result = cli_run(*args)
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: {job}: key '{key}': "), line
    assert expected in line
    assert_nothing_lost(previous, before)


@pytest.mark.parametrize(
    ("overrides", "key", "shown"),
    [
        (
            {"source": {"table": "postings; DROP TABLE results"}},
            "source.table",
            "'postings; DROP TABLE results'",
        ),
        ({"output": {"results_table": 'x" OR 1=1 --'}}, "output.results_table", "'x\" OR 1=1 --'"),
        ({"output": {"failures_table": "failures; DROP TABLE results"}}, "output.failures_table", "DROP"),
        ({"output": {"runs_table": "runs--"}}, "output.runs_table", "'runs--'"),
        (
            {"source": {"id_column": "id); DROP TABLE postings; --"}},
            "source.id_column",
            "DROP TABLE postings",
        ),
        (
            {"source": {"fields": ['ti"tle', "description"]}, "prompt": {"user": "{description}"}},
            "source.fields.0",
            "'ti\"tle'",
        ),
        ({"name": "x'; DROP TABLE runs; --"}, "name", "DROP TABLE runs"),
    ],
)
def test_sql_in_an_identifier_is_refused_and_the_database_is_untouched(
    previous: Path, overrides: dict[str, Any], key: str, shown: str
) -> None:
    before = database_state(previous / "test.duckdb")
    job = rewrite_job(previous, **overrides)
    for args in (["run", str(job)], ["status", str(job)]):
        result = cli_run(*args)
        assert result.exit_code == 2
        line = error_line(result)
        assert line.startswith(f"error: {job}: key '{key}': must be a plain SQL name"), line
        assert shown in line
    assert_nothing_lost(previous, before)


@pytest.mark.parametrize(
    "query",
    [
        # Closes the parenthesis the query is put in, to run a second statement after it.
        "SELECT * FROM postings) ; DROP TABLE results; SELECT * FROM (SELECT 1 AS id",
        "SELECT * FROM postings; DROP TABLE results",
        "DELETE FROM results",
    ],
)
def test_a_source_query_cannot_run_a_second_statement(previous: Path, query: str) -> None:
    before = database_state(previous / "test.duckdb")
    job = rewrite_job(previous, source={"table": None, "query": query})
    for args in (["run", str(job)], ["status", str(job)]):
        result = cli_run(*args)
        assert result.exit_code == 2
        line = error_line(result)
        assert line.startswith(f"error: {job}: key source.query "), line
    assert_nothing_lost(previous, before)


def test_a_source_query_with_a_trailing_semicolon_still_works(previous: Path) -> None:
    job = rewrite_job(previous, source={"table": None, "query": "SELECT * FROM postings WHERE id < 4;"})
    result = cli_run("status", str(job), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source_records"] == 4


def test_load_refuses_sql_in_the_table_option(previous: Path) -> None:
    before = database_state(previous / "test.duckdb")
    data = previous / "more.jsonl"
    data.write_text(json.dumps({"id": 99, "title": "t", "description": "d"}) + "\n")
    job = previous / "job.yaml"
    result = cli_run("load", str(data), "--job", str(job), "--table", "x; DROP TABLE postings")
    assert result.exit_code == 2
    assert (
        error_line(result)
        == "error: --table 'x; DROP TABLE postings': must be a plain SQL name (letters, digits and _)"
    )
    assert_nothing_lost(previous, before)


# --- server URLs ------------------------------------------------------------------------------------

BAD_PORTS = [
    ("http://127.0.0.1:abc/v1", "abc"),
    ("http://127.0.0.1:99999/v1", "99999"),
    ("http://127.0.0.1:0/v1", "0"),
    ("http://[::1]:-1/v1", "-1"),
]


def port_message(url: str, port: str) -> str:
    return f"port '{port}' is not a number from 1 to 65535 ({url})"


@pytest.mark.parametrize(("url", "port"), BAD_PORTS)
@pytest.mark.parametrize(
    ("where", "key"),
    [
        ({"endpoint": {"base_url": "URL"}}, "endpoint.base_url"),
        ({"endpoint": {"base_url": None}, "endpoints": [{"base_url": "URL"}]}, "endpoints.0.base_url"),
    ],
)
@pytest.mark.parametrize("command", ["run", "status"])
def test_a_bad_port_in_the_job_file_is_one_line_naming_the_key_and_the_value(
    previous: Path, url: str, port: str, where: dict[str, Any], key: str, command: str
) -> None:
    before = database_state(previous / "test.duckdb")
    placed = json.loads(json.dumps(where).replace('"URL"', json.dumps(url)))
    job = rewrite_job(previous, **placed)
    result = cli_run(command, str(job))
    assert result.exit_code == 2
    assert error_line(result) == f"error: {job}: key '{key}': {port_message(url, port)}"
    assert_nothing_lost(previous, before)


@pytest.mark.parametrize(("url", "port"), BAD_PORTS[:2])
def test_a_bad_port_from_an_environment_variable_names_the_variable(
    previous: Path, monkeypatch: pytest.MonkeyPatch, url: str, port: str
) -> None:
    monkeypatch.setenv("TEST_BASE_URL", url)
    job = rewrite_job(previous, endpoint={"base_url": "${TEST_BASE_URL:-http://127.0.0.1:8000/v1}"})
    result = cli_run("run", str(job))
    assert result.exit_code == 2
    assert error_line(result) == (
        f"error: {job}: key 'endpoint.base_url': {port_message(url, port)}; "
        "'endpoint.base_url' comes from environment variable TEST_BASE_URL"
    )


@pytest.mark.parametrize(("url", "port"), BAD_PORTS)
@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_bad_port_on_the_command_line_names_the_option(
    previous: Path, url: str, port: str, command: str
) -> None:
    before = database_state(previous / "test.duckdb")
    args = ["run", str(previous / "job.yaml")] if command == "run" else ["bench", "--model", "m"]
    result = cli_run(*args, "--endpoint", url)
    assert result.exit_code == 2
    assert error_line(result) == f"error: --endpoint: {port_message(url, port)}"
    assert_nothing_lost(previous, before)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ftp://127.0.0.1:8000/v1", "must start with http:// or https://"),
        ("http:///v1", "has no host name"),
        ("http://user:sk-secret@127.0.0.1:8000/v1", "must not contain credentials, a query or a fragment"),
        ("http://127.0.0.1:8000/v1?key=sk-secret", "must not contain credentials, a query or a fragment"),
    ],
)
@pytest.mark.parametrize("command", ["run", "bench", "job"])
def test_other_bad_urls_keep_their_messages_everywhere(
    previous: Path, url: str, expected: str, command: str
) -> None:
    job = previous / "job.yaml"
    if command == "job":
        result = cli_run("run", str(rewrite_job(previous, endpoint={"base_url": url})))
        prefix = f"error: {job}: key 'endpoint.base_url': "
    else:
        args = ["run", str(job)] if command == "run" else ["bench", "--model", "m"]
        result = cli_run(*args, "--endpoint", url)
        prefix = "error: --endpoint: "
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(prefix + expected), line
    assert "sk-secret" not in line


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": "8k"}, "max_model_len"),
        ({"max_model_len": True}, "max_model_len"),
        ({"endpoint": {"max_model_len": -4096}}, "endpoint.max_model_len"),
        ({"endpoint": {"max_model_len": 8192.5}}, "endpoint.max_model_len"),
        (
            {
                "endpoint": {"base_url": None},
                "endpoints": [{"base_url": "http://a:1/v1", "max_model_len": ""}],
            },
            "endpoints.0.max_model_len",
        ),
    ],
)
def test_a_bad_max_model_len_is_one_line_naming_the_key(
    previous: Path, overrides: dict[str, Any], key: str
) -> None:
    job = rewrite_job(previous, **overrides)
    result = cli_run("run", str(job))
    assert result.exit_code == 2
    assert error_line(result) == (
        f"error: {job}: key '{key}': must be a whole number of tokens from 1 to 100000000 "
        "(the server's --max-model-len)"
    )


# --- the source table -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            "INSERT INTO postings VALUES (0, 'again', 'a second record with id 0'), (3, 'x', 'y')",
            "ids are not unique in column id (e.g. 0, 3)",
        ),
        (
            "INSERT INTO postings VALUES (NULL, 'no id', 'a record without an id')",
            "1 record has a NULL id in column id",
        ),
        (
            "ALTER TABLE postings RENAME COLUMN id TO posting_id",
            "the source has no column ['id'] (keys source.id_column / source.fields); "
            "it has ['description', 'posting_id', 'title']",
        ),
        (
            "ALTER TABLE postings DROP COLUMN description",
            "the source has no column ['description'] (keys source.id_column / source.fields); "
            "it has ['id', 'title']",
        ),
    ],
)
def test_a_bad_source_table_exits_2_naming_the_column(previous: Path, change: str, expected: str) -> None:
    database = previous / "test.duckdb"
    with duckdb.connect(str(database)) as connection:
        connection.execute(change)
    before = database_state(database)
    result = cli_run("run", str(previous / "job.yaml"), "--log-format", "json")
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: {previous / 'job.yaml'}: source in {database}: "), line
    assert line.endswith(expected), line
    assert_nothing_lost(previous, before)


# --- pipeline load ----------------------------------------------------------------------------------


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        (
            "latin1.csv",
            b"id,title,description\n10,Chef,Cook\n11,Caf\xe9 manager,Runs the caf\xe9\n",
            "CSV Error on Line: 3",
        ),
        (
            "latin1.jsonl",
            b'{"id": 10, "title": "Chef", "description": "Cook"}\n'
            b'{"id": 11, "title": "Caf\xe9", "description": "x"}\n',
            "invalid UTF-8",
        ),
        (
            # Past DuckDB's 20,480-row sample: found while loading, inside the transaction.
            "late.csv",
            b"id,title,description\n"
            + b"".join(b"%d,Title %d,Text %d\n" % (i, i, i) for i in range(100, 21_100))
            + b"21100,Caf\xe9,x\n",
            "cannot load into table 'postings'",
        ),
    ],
)
def test_invalid_utf8_names_the_file_and_line_and_loads_nothing(
    previous: Path, name: str, content: bytes, expected: str
) -> None:
    before = database_state(previous / "test.duckdb")
    data = previous / name
    data.write_bytes(content)
    result = cli_run("load", str(data), "--job", str(previous / "job.yaml"))
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: {data}: "), line
    assert expected in line and "line" in line.lower()
    assert "the file must be UTF-8" in line
    assert "Possible Solution" not in line and "sample_size" not in line and len(line) < 500
    assert_nothing_lost(previous, before)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            [{"id": 7, "title": "a", "description": "b"}, {"id": 7, "title": "c", "description": "d"}],
            "ids are not unique in column id (e.g. 7)",
        ),
        (
            [{"id": None, "title": "a", "description": "b"}, {"id": 8, "title": "c", "description": "d"}],
            "1 record has a NULL id in column id",
        ),
        (
            [{"posting_id": 9, "title": "a", "description": "b"}],
            "no column ['id'] (needed by the job's source.id_column / source.fields); "
            "the file has ['posting_id', 'title', 'description']",
        ),
        (
            [{"id": 9, "title": "a", "body": "b"}],
            "no column ['description'] (needed by the job's source.id_column / source.fields); "
            "the file has ['id', 'title', 'body']",
        ),
    ],
)
def test_load_refuses_bad_ids_and_missing_columns(
    previous: Path, rows: list[dict[str, Any]], expected: str
) -> None:
    before = database_state(previous / "test.duckdb")
    data = write_rows(previous / "bad.jsonl", rows)
    result = cli_run("load", str(data), "--job", str(previous / "job.yaml"))
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: {data}: "), line
    assert expected in line
    assert_nothing_lost(previous, before)


# --- record content, against a real server ----------------------------------------------------------


@pytest.fixture(scope="module")
@starts_a_process
def sim_url() -> Iterator[str]:
    with sim_server("--model", "test-model", "--max-model-len", str(MAX_MODEL_LEN)) as url:
        yield url


ODD_RECORDS: list[dict[str, Any]] = [
    {"id": 100, "title": None, "description": None},
    {"id": 101, "title": "", "description": ""},
    {"id": 102, "title": "Huge", "description": "word " * (ONE_MB // 5)},
    {"id": 103, "title": CONTROL, "description": "\x00" * 3 + "only control \x01\x02\x03"},
    {"id": 104, "title": "Plain", "description": "A normal posting."},
    {"id": 105, "title": "Ünïcødé ✓ 职位", "description": "emoji 🚀 and RTL שלום"},
]


def test_null_empty_huge_and_control_character_fields(previous: Path, sim_url: str) -> None:
    job = rewrite_job(previous, endpoint={"base_url": sim_url}, max_tokens=512)
    database = previous / "test.duckdb"
    earlier_results = table_rows(database, "SELECT * FROM results ORDER BY record_id")
    data = write_rows(previous / "odd.jsonl", ODD_RECORDS)

    loaded = cli_run("load", str(data), "--job", str(job))
    assert loaded.exit_code == 0, loaded.output
    assert f": {len(ODD_RECORDS)} new, 0 updated, 0 unchanged" in loaded.stdout
    stored = dict(table_rows(database, "SELECT id, [title, description] FROM postings WHERE id >= 100"))
    assert stored == {row["id"]: [row["title"], row["description"]] for row in ODD_RECORDS}  # byte-exact

    result = cli_run("run", str(job), "--log-format", "json")
    assert result.exit_code == 1, result.output  # finished, with one failure
    # NULL and empty fields alone make a blank record: nothing to extract, so never sent, and said.
    assert "3 done, 1 failed of 4" in result.stdout
    assert "blank:    2 records" in result.stdout, result.stdout
    done = [row[0] for row in table_rows(database, "SELECT record_id FROM results WHERE record_id >= 100")]
    failed = table_rows(database, "SELECT record_id, failure_class, message, attempts FROM failures")
    assert sorted(done) == [103, 104, 105]  # control characters and unicode: extracted
    # 1 MB does not fit the context: counted by the server (/tokenize) and never sent: too_long, with
    # the numbers and the field that made it long, not retried.
    assert len(failed) == 1
    record_id, failure_class, message, attempts = failed[0]
    assert (record_id, failure_class, attempts) == (102, "too_long", 0)
    assert message.startswith("the prompt alone does not fit the context: ")
    assert f"tokens against a context of {MAX_MODEL_LEN} tokens" in message and len(message) < 400
    assert "most of it is field 'description'" in message
    # Nothing was dropped, and nothing from before was lost.
    assert (
        table_rows(database, "SELECT * FROM results WHERE record_id < 100 ORDER BY record_id")
        == earlier_results
    )
    again = cli_run("run", str(job), "--log-format", "json")
    assert again.exit_code == 0 and "nothing to do" in again.stdout  # the too_long failure stays put


def test_a_null_field_renders_as_an_empty_string(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(job_dict())
    content = PromptBuilder(spec).request_for({"title": None, "description": None}).messages[1]["content"]
    assert content == "Title: \n\n"
    control = PromptBuilder(spec).request_for({"title": CONTROL, "description": ""}).messages[1]["content"]
    assert control == f"Title: {CONTROL}\n\n"


@pytest.mark.parametrize("where", ["job", "option", "variant"])
def test_a_model_the_server_does_not_serve_exits_2_naming_both_where_it_was_typed(
    previous: Path, sim_url: str, where: str
) -> None:
    """The model named where it was given: the job file's key, the option on the command line, or
    the key of the variant that sets it."""
    model = {"model": "gpt-oss-120b"} if where == "job" else {}
    variants = {"variants": {"big": {"model": "gpt-oss-120b"}}} if where == "variant" else {}
    job = rewrite_job(previous, endpoint={"base_url": sim_url}, **model, **variants)
    with duckdb.connect(str(previous / "test.duckdb")) as connection:  # something is pending
        connection.execute("INSERT INTO postings VALUES (50, 'Pending', 'Not extracted yet')")
    before = database_state(previous / "test.duckdb")
    given = {"job": [], "option": ["--model", "gpt-oss-120b"], "variant": ["--variant", "big"]}[where]
    result = cli_run("run", str(job), *given, "--log-format", "json")
    assert result.exit_code == 2, result.output
    said = {
        "job": f"{job}: key 'model'",
        "option": "--model gpt-oss-120b",
        "variant": f"{job}: key 'variants.big.model'",
    }[where]
    assert error_line(result) == (
        f"error: {said}: {sim_url} does not serve model 'gpt-oss-120b'; it serves: test-model"
    )
    assert_nothing_lost(previous, before)


# --- one line, exit 2: a schema that fails, options, the local extra, the database, the endpoint ------

SCHEMA_FAILURES = {
    "name_error": ("from pydantic import BaseModel\nx = undefined_name\n", "NameError", 2),
    "syntax_error": (
        "from pydantic import BaseModel\nclass Thing(BaseModel)\n    a: int\n",
        "SyntaxError",
        2,
    ),
    "bare_raise": ("raise RuntimeError('the schema module is broken')\n", "RuntimeError", 1),
    "missing_dependency": ("import pipeline_no_such_package\n", "ModuleNotFoundError", 1),
    "exits": ("import sys\nsys.exit(3)\n", "SystemExit", 2),
}


@pytest.mark.parametrize("failure", sorted(SCHEMA_FAILURES))
@pytest.mark.parametrize("command", ["run", "status", "load"])
def test_a_schema_module_that_raises_on_import_is_one_line_with_its_file_and_line(
    previous: Path, failure: str, command: str
) -> None:
    source, kind, line_number = SCHEMA_FAILURES[failure]
    module = f"broken_schema_{failure}_{command}"  # one module name per test: nothing cached between them
    module_file = previous / f"{module}.py"
    module_file.write_text(source)
    before = database_state(previous / "test.duckdb")
    job = rewrite_job(previous, schema=f"{module}:Thing")
    args = {"run": ["run", str(job)], "status": ["status", str(job)]}.get(command)
    result = cli_run(*(args or ["load", str(previous / "none.jsonl"), "--job", str(job)]))
    assert result.exit_code == 2, result.output
    line = error_line(result)
    assert line.startswith(f"error: {job}: key 'schema': cannot import module '{module}' ({kind}"), line
    assert f"{module_file}:{line_number}" in line
    assert_nothing_lost(previous, before)


@pytest.mark.parametrize(
    ("schema", "field"), [("WithCallback", "normalise"), ("WithArbitraryType", "contacts.handle")]
)
@pytest.mark.parametrize("command", ["run", "status", "check"])
def test_a_schema_without_a_json_schema_is_one_line_naming_class_and_field(
    previous: Path, schema: str, field: str, command: str
) -> None:
    before = database_state(previous / "test.duckdb")
    job = rewrite_job(previous, schema=f"tests.support.schemas:{schema}")
    result = cli_run(command, str(job))
    assert result.exit_code == 2, result.output  # a configuration error, not "finished with failures"
    line = error_line(result)
    assert line.startswith(
        f"error: {job}: key 'schema': tests.support.schemas:{schema}: field '{field}' cannot be put into "
        "a JSON schema"
    ), line
    assert_nothing_lost(previous, before)


@pytest.mark.parametrize("level", ["loud", "", "WARN "])
def test_an_unknown_log_level_names_the_option_and_the_levels(previous: Path, level: str) -> None:
    before = database_state(previous / "test.duckdb")
    result = cli_run("run", str(previous / "job.yaml"), "--log-level", level)
    assert result.exit_code == 2
    assert error_line(result) == (f"error: --log-level {level!r}: must be one of debug, info, warning, error")
    assert_nothing_lost(previous, before)


def test_a_log_level_in_capitals_is_taken(previous: Path) -> None:
    with routed_to(model_list):  # nothing to do: the server is asked its model list only
        result = cli_run("run", str(previous / "job.yaml"), "--log-level", "WARNING")
    assert result.exit_code == 0, result.output
    assert "nothing to do" in result.stdout


@pytest.fixture
def without_the_local_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_the_local_extra(monkeypatch)


@pytest.mark.usefixtures("without_the_local_extra")
@pytest.mark.parametrize("command", ["run", "serve-local"])
def test_local_without_the_local_extra_exits_2_with_the_install_command(previous: Path, command: str) -> None:
    database = previous / "test.duckdb"
    with duckdb.connect(str(database)) as connection:  # something is pending: the server is needed
        connection.execute("INSERT INTO postings VALUES (50, 'Pending', 'Not extracted yet')")
    before = database_state(database)
    args = ["run", str(previous / "job.yaml"), "--local"] if command == "run" else ["serve-local"]
    result = cli_run(*args)
    assert result.exit_code == 2, result.output  # nothing was sent: not an aborted run (3)
    line = error_line(result)
    assert f"needs the 'local' extra ({', '.join(LOCAL_EXTRA)} missing)" in line
    assert "pip install -e '.[local]'" in line
    assert_nothing_lost(previous, before)  # no run was recorded


@pytest.mark.parametrize(
    ("command", "option"),
    [("run", "--database"), ("load", "--database"), ("status", "--database"), ("export", "--out")],
)
def test_a_file_in_a_folder_that_does_not_exist_is_refused_and_nothing_is_created(
    previous: Path, command: str, option: str
) -> None:
    before = database_state(previous / "test.duckdb")
    typo = previous / "trail" / ("out.parquet" if option == "--out" else "test.duckdb")
    data = write_rows(previous / "more.jsonl", [{"id": 60, "title": "t", "description": "d"}])
    job = str(rewrite_job(previous, source={"seed_file": str(data)}))  # a typo must not start a new job
    args = {"run": ["run", job], "status": ["status", job], "export": ["export", job]}.get(command)
    result = cli_run(*(args or ["load", str(data), "--job", job]), option, str(typo))
    assert result.exit_code == 2, result.output
    assert error_line(result) == (
        f"error: {option} {typo}: folder {typo.parent} does not exist (nothing was created)"
    )
    assert not typo.parent.exists()
    assert_nothing_lost(previous, before)


def test_a_new_database_in_an_existing_folder_is_created_with_a_line_saying_so(
    previous: Path, sim_url: str
) -> None:
    seed = write_rows(
        previous / "seed.jsonl", [{"id": i, "title": "t", "description": "d"} for i in range(3)]
    )
    job = str(rewrite_job(previous, endpoint={"base_url": sim_url}, source={"seed_file": str(seed)}))
    trial = previous / "trial.duckdb"
    note = f"note: --database {trial} did not exist: a new database was created there"

    result = cli_run("run", job, "--database", str(trial), "--log-format", "json")
    assert result.exit_code == 0, result.output
    assert note in result.stderr.splitlines()
    assert "3 done, 0 failed of 3" in result.stdout  # the seed file, loaded into the new database
    again = cli_run("run", job, "--database", str(trial), "--log-format", "json")
    assert again.exit_code == 0 and note not in again.stderr  # it exists now

    loaded = cli_run("load", str(seed), "--job", job, "--database", str(previous / "other.duckdb"))
    assert loaded.exit_code == 0, loaded.output
    assert f"note: --database {previous / 'other.duckdb'} did not exist: a new database" in loaded.stderr
    assert table_rows(previous / "other.duckdb", "SELECT count(*) FROM postings") == [(3,)]


def files_in(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")}


# A failure on the input, for load and for run (whose seed file it is), each naming what is at fault.
INPUT_FAILURES: dict[str, tuple[list[dict[str, Any]] | None, str]] = {
    "no such file": (None, "no such file"),
    "duplicate ids": ([{"id": 1, "title": "a", "description": "d"}] * 2, "ids are not unique in column id"),
    "NULL ids": ([{"id": None, "title": "a", "description": "d"}], "has a NULL id in column id"),
    "a missing column": ([{"id": 1, "title": "a"}], "no column ['description']"),
}


@pytest.mark.parametrize("failure", sorted(INPUT_FAILURES))
@pytest.mark.parametrize("command", ["load", "run"])
@pytest.mark.parametrize("where", ["--database", "the job's own, in a new folder"])
def test_a_load_or_run_that_fails_on_its_input_creates_nothing(
    tmp_path: Path, failure: str, command: str, where: str
) -> None:
    rows, expected = INPUT_FAILURES[failure]
    data = tmp_path / "records.jsonl"
    if rows is not None:
        write_rows(data, rows)
    own = where != "--database"
    job = write_job(
        tmp_path,
        database="new/folders/test.duckdb" if own else "test.duckdb",
        source={"seed_file": str(data)} if command == "run" else {},
        endpoint={"base_url": "http://127.0.0.1:9/v1"},  # never asked: the input fails first
    )
    before = files_in(tmp_path)
    args = ["run", str(job)] if command == "run" else ["load", str(data), "--job", str(job)]
    result = cli_run(*args, *([] if own else ["--database", str(tmp_path / "trial.duckdb")]))
    assert result.exit_code == 2, result.output
    assert expected in error_line(result)  # the one line: no note that a database was created
    assert files_in(tmp_path) == before  # no .duckdb, .wal, .lock, .progress.json, folder or leftover


def test_a_run_on_a_table_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    job = write_job(tmp_path, endpoint={"base_url": "http://127.0.0.1:9/v1"})
    before = files_in(tmp_path)
    result = cli_run("run", str(job), "--database", str(tmp_path / "trial.duckdb"))
    assert result.exit_code == 2, result.output
    assert "postings" in error_line(result)
    assert files_in(tmp_path) == before


@pytest.mark.parametrize("failure", sorted(INPUT_FAILURES))
def test_a_load_that_fails_on_an_existing_database_leaves_it_as_it_was(previous: Path, failure: str) -> None:
    rows, expected = INPUT_FAILURES[failure]
    data = previous / "records.jsonl"
    if rows is not None:
        write_rows(data, rows)
    before, files = database_state(previous / "test.duckdb"), files_in(previous)
    result = cli_run("load", str(data), "--job", str(previous / "job.yaml"))
    assert result.exit_code == 2, result.output
    assert expected in error_line(result)
    assert_nothing_lost(previous, before)
    assert files_in(previous) == files


def test_status_on_a_database_that_does_not_exist_yet_says_so_and_creates_nothing(previous: Path) -> None:
    new = previous / "new.duckdb"
    result = cli_run("status", str(previous / "job.yaml"), "--database", str(new))
    assert result.exit_code == 2
    assert "database does not exist yet" in error_line(result)  # a reader creates nothing, says nothing else
    assert not new.exists()


@pytest.mark.parametrize(
    ("name", "content"),
    [("empty.csv", b""), ("blank.csv", b"\n \n"), ("empty.jsonl", b""), ("empty.parquet", b"")],
)
def test_an_empty_file_is_refused_as_empty(previous: Path, name: str, content: bytes) -> None:
    before = database_state(previous / "test.duckdb")
    data = previous / name
    data.write_bytes(content)
    result = cli_run("load", str(data), "--job", str(previous / "job.yaml"))
    assert result.exit_code == 2
    assert error_line(result) == f"error: {data}: empty file (nothing to load)"
    assert_nothing_lost(previous, before)


def test_a_header_only_csv_loads_0_records_and_run_says_the_source_has_none(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    data = tmp_path / "header.csv"
    data.write_text("id,title,description\n")
    loaded = cli_run("load", str(data), "--job", str(job))
    assert loaded.exit_code == 0, loaded.output
    assert loaded.stdout.startswith(f"loaded 0 records from {data} into table postings")
    with routed_to(model_list) as asked:
        result = cli_run("run", str(job), "--log-format", "json")
    assert [request.url.path for request in asked] == ["/v1/models"]  # checked as for a run with work
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"nothing to do: the source has no records ({tmp_path / 'test.duckdb'}")
    assert "done or failed permanently" not in result.stdout


@pytest.mark.parametrize("where", ["option", "job"])
def test_an_endpoint_without_v1_gets_the_hint_to_add_it(previous: Path, sim_url: str, where: str) -> None:
    bare = sim_url.removesuffix("/v1")
    with duckdb.connect(str(previous / "test.duckdb")) as connection:  # something is pending
        connection.execute("INSERT INTO postings VALUES (50, 'Pending', 'Not extracted yet')")
    before = database_state(previous / "test.duckdb")
    if where == "option":
        result = cli_run("run", str(previous / "job.yaml"), "--endpoint", bare, "--log-format", "json")
    else:
        job = rewrite_job(previous, endpoint={"base_url": bare})
        result = cli_run("run", str(job), "--log-format", "json")
    assert result.exit_code == 2, result.output
    line = error_line(result)
    assert line.startswith(f"error: {bare}/models: not found (HTTP 404)"), line
    assert f"did you mean {sim_url}?" in line
    assert_nothing_lost(previous, before)


def test_bench_against_an_endpoint_without_v1_gets_the_hint(sim_url: str, tmp_path: Path) -> None:
    bare = sim_url.removesuffix("/v1")
    result = cli_run("bench", "--endpoint", bare, "--model", "test-model", "--out", str(tmp_path / "b"))
    assert result.exit_code == 2, result.output
    assert f"did you mean {sim_url}?" in error_line(result)


# --- pipeline load: the table's id type wins --------------------------------------------------------


def text_id_table(folder: Path) -> Path:
    """A source table whose ids are text, as a first load of ids like 'tiny' makes it."""
    database = folder / "test.duckdb"
    with duckdb.connect(str(database)) as connection:
        connection.execute(
            "CREATE TABLE postings AS SELECT * FROM (VALUES ('tiny', 'T', 'D'), ('7', 'Seven', 'D7')) "
            "t(id, title, description)"
        )
    return database


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("numeric.csv", "id,title,description\n7,Seven again,D7\n8,Eight,D8\n10,Ten,D\n"),
        (
            "numeric.jsonl",
            '{"id": 7, "title": "Seven again", "description": "D7"}\n'
            '{"id": 8, "title": "Eight", "description": "D8"}\n'
            '{"id": 10, "title": "Ten", "description": "D"}\n',
        ),
    ],
)
def test_numeric_looking_ids_load_into_a_table_of_text_ids_as_text(
    tmp_path: Path, name: str, content: str
) -> None:
    job = write_job(tmp_path)
    database = text_id_table(tmp_path)
    data = tmp_path / name
    data.write_text(content)
    result = cli_run("load", str(data), "--job", str(job))
    assert result.exit_code == 0, result.output
    assert ": 2 new, 1 updated, 0 unchanged" in result.stdout  # 7 is the same record as '7'
    assert table_rows(database, "SELECT id, title FROM postings ORDER BY id") == [
        ("10", "Ten"),
        ("7", "Seven again"),
        ("8", "Eight"),
        ("tiny", "T"),
    ]
    assert table_rows(database, "SELECT data_type FROM duckdb_columns() WHERE column_name = 'id'") == [
        ("VARCHAR",)
    ]


def test_a_misspelt_rename_names_the_rename_and_the_file_not_the_column_it_was_for(previous: Path) -> None:
    before = database_state(previous / "test.duckdb")
    data = previous / "adzuna.csv"
    data.write_text("id,title,FullDescription\n60,Sixty,D\n")
    result = cli_run(
        "load", str(data), "--job", str(previous / "job.yaml"), "--rename", "FullDescriptoin=description"
    )
    assert result.exit_code == 2, result.output
    assert error_line(result) == (
        f"error: --rename FullDescriptoin=description: {data} has no column 'FullDescriptoin'; "
        "it has ['id', 'title', 'FullDescription']"
    )
    assert_nothing_lost(previous, before)


def test_ids_past_the_csv_sample_keep_their_leading_zeros_in_a_table_of_text_ids(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    database = text_id_table(tmp_path)
    data = tmp_path / "renamed.csv"  # DuckDB guesses the type from the first 20,480 rows: numbers here
    rows = "".join(f"{i},T{i},D\n" for i in range(100, 21_100))
    data.write_text(f"AdId,title,description\n{rows}0042,Zeros,D\n")
    result = cli_run("load", str(data), "--job", str(job), "--rename", "AdId=id")
    assert result.exit_code == 0, result.output
    assert table_rows(database, "SELECT id FROM postings WHERE title = 'Zeros'") == [("0042",)]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("text.csv", "id,title,description\n60,Sixty,D\nabc,Text id,D\n"),
        (
            "text.jsonl",
            '{"id": 60, "title": "Sixty", "description": "D"}\n'
            '{"id": "abc", "title": "T", "description": "D"}\n',
        ),
    ],
)
def test_text_ids_into_a_table_of_integer_ids_is_one_clear_line(
    previous: Path, name: str, content: str
) -> None:
    before = database_state(previous / "test.duckdb")
    data = previous / name
    data.write_text(content)
    result = cli_run("load", str(data), "--job", str(previous / "job.yaml"))
    assert result.exit_code == 2, result.output
    assert error_line(result) == (
        f"error: {data}: ids that are not BIGINT (e.g. 'abc') cannot go into table 'postings', whose id "
        "column 'id' is BIGINT; load them into a new table (--table) or database (--database)"
    )
    assert_nothing_lost(previous, before)
