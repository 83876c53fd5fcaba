"""The API key is read from the environment only, and is never written anywhere.

A unique key is planted in the variable the job's ``endpoint.api_key_env`` names, and a real simulator
requires it. Runs with faults (so failures and their messages are stored), with a refused key, and
with a job file that holds the key where it does not belong must not show it in stdout, stderr, any
table of the database, any file beside it (progress snapshot, exports), ``status``, ``failures`` or
exception messages.
"""

from __future__ import annotations

import subprocess
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import duckdb
import pytest
from typer.testing import CliRunner

import pipeline.cli as cli
from pipeline.errors import FatalRunError
from pipeline.extraction.prompt import client_settings
from pipeline.job.spec import load_job
from pipeline.run.progress import LogProgress
from pipeline.run.runner import RunOptions, run_job
from pipeline.store.snapshot import snapshot_path
from tests.support.jobs import make_source, table_rows, write_job
from tests.support.processes import REPO, pipeline_command, sim_server, subprocess_env

pytestmark = pytest.mark.integration

KEY_ENV = "PIPELINE_TEST_PLANTED_API_KEY"
KEY = f"sk-planted-{uuid.uuid4().hex}"
WRONG_KEY = f"sk-planted-wrong-{uuid.uuid4().hex}"
SECRETS = (KEY, WRONG_KEY)
FAULTS = ("--fault-server-error", "0.15", "--fault-invalid-json", "0.2", "--fault-context-length", "0.2")
FAST_RETRIES = {"transient_retries": 1, "reasks": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.05}


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with sim_server("--model", "test-model", "--api-key", KEY, "--seed", "11", *FAULTS) as url:
        yield url


def pipeline(*args: str, key: str | None) -> subprocess.CompletedProcess[str]:
    extra = {"OPENAI_LOG": "debug"}  # the SDK's own debug log as well
    if key is not None:
        extra[KEY_ENV] = key
    return subprocess.run(
        pipeline_command(*args),
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(**extra),
        cwd=REPO,
    )


def keyed_job(folder: Path, url: str, records: int, **overrides: Any) -> Path:
    endpoint = {"base_url": url, "api_key_env": KEY_ENV, **overrides.pop("endpoint", {})}
    job = write_job(folder, endpoint=endpoint, concurrency=4, retry=FAST_RETRIES, **overrides)
    make_source(folder / "test.duckdb", records)
    return job


def database_text(database: Path) -> str:
    """Every column of every table, cast to text by DuckDB, and the tables' definitions."""
    with duckdb.connect(str(database), read_only=True) as connection:
        tables = connection.execute("SELECT table_name, sql FROM duckdb_tables()").fetchall()
        parts = [str(sql) for _, sql in tables]
        for name, _ in tables:
            rows = connection.execute(f'SELECT COLUMNS(*)::VARCHAR FROM "{name}"').fetchall()
            parts.extend("\t".join(str(value) for value in row) for row in rows)
    return "\n".join(parts)


def files_text(folder: Path) -> dict[str, str]:
    """Every file the pipeline wrote (not the job file), as raw text: database, WAL, snapshot, exports."""
    return {
        str(path): path.read_bytes().decode("latin-1")
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.suffix != ".yaml"
    }


def reports(job: Path, folder: Path) -> dict[str, str]:
    """What a person looks at after a run: status, failures (text and JSON), an export."""
    runner = CliRunner()
    commands = {
        "status": ["status", str(job)],
        "status --json": ["status", str(job), "--json"],
    }
    registered = {
        command.name or getattr(command.callback, "__name__", "") for command in cli.app.registered_commands
    }
    if "failures" in registered:
        commands["failures"] = ["failures", str(job), "--examples", "20"]
        commands["failures --json"] = ["failures", str(job), "--json", "--examples", "20"]
    if "export" in registered:
        out = folder / "exported" / "results.jsonl"
        out.parent.mkdir()  # export makes no folder, as no command does for a file it is named
        commands["export"] = ["export", str(job), "--out", str(out), "--include-failures"]
    outputs = {}
    for name, args in commands.items():
        result = runner.invoke(cli.app, args)
        assert result.exception is None or isinstance(result.exception, SystemExit), (name, result.exception)
        outputs[name] = result.output
    return outputs


def assert_no_secret(texts: dict[str, str]) -> None:
    leaks = [(where, secret) for where, text in texts.items() for secret in SECRETS if secret in text]
    assert not leaks, f"the API key shows up in: {leaks}"


def everything(result: subprocess.CompletedProcess[str], job: Path, folder: Path) -> dict[str, str]:
    return {
        "stdout": result.stdout,
        "stderr": result.stderr,
        "database tables": database_text(folder / "test.duckdb"),
        **reports(job, folder),
        **files_text(folder),  # after the reports: includes the exported files
    }


def test_a_run_with_faults_writes_the_key_nowhere(tmp_path: Path, sim_url: str) -> None:
    job = keyed_job(tmp_path, sim_url, records=30)
    result = pipeline("run", str(job), "--log-level", "debug", "--log-format", "json", key=KEY)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    assert '"retrying"' in result.stderr  # debug events were logged, with their error messages
    database = tmp_path / "test.duckdb"
    done, failed = table_rows(
        database, "SELECT (SELECT count(*) FROM results), (SELECT count(*) FROM failures)"
    )[0]
    assert done + failed == 30 and done > 0 and failed > 0  # the key got through; failures were stored
    assert table_rows(database, "SELECT count(*) FROM failures WHERE message <> ''") == [(failed,)]
    assert snapshot_path(database).is_file()
    assert_no_secret(everything(result, job, tmp_path))


def test_a_refused_key_aborts_naming_the_variable_not_the_key(tmp_path: Path, sim_url: str) -> None:
    job = keyed_job(tmp_path, sim_url, records=5)
    result = pipeline("run", str(job), "--log-level", "debug", "--log-format", "json", key=WRONG_KEY)
    assert result.returncode == 3, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "401" in error[0], result.stderr[-2000:]
    assert f"environment variable {KEY_ENV} (endpoint.api_key_env), which is set" in error[0]
    assert table_rows(tmp_path / "test.duckdb", "SELECT status FROM runs") == [("aborted",)]
    assert_no_secret(everything(result, job, tmp_path))


def test_a_key_in_extra_body_goes_to_the_server_only(tmp_path: Path, sim_url: str) -> None:
    # The key reaches the YAML through ${VAR}; extra_body is sent with each request, never stored.
    job = keyed_job(tmp_path, sim_url, records=6, extra_body={"metadata": {"token": "${" + KEY_ENV + "}"}})
    result = pipeline("run", str(job), "--log-level", "debug", "--log-format", "json", key=KEY)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    assert table_rows(tmp_path / "test.duckdb", "SELECT count(*) FROM results") != [(0,)]
    assert_no_secret(everything(result, job, tmp_path))


def test_exceptions_never_carry_the_key(
    tmp_path: Path, sim_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(KEY_ENV, WRONG_KEY)
    spec = load_job(keyed_job(tmp_path, sim_url, records=3))
    assert spec.api_key() == WRONG_KEY  # read from the environment...
    assert WRONG_KEY not in spec.model_dump_json() and WRONG_KEY not in repr(spec)  # ...and not kept
    with pytest.raises(FatalRunError) as caught:
        anyio.run(run_job, spec, RunOptions(progress=LogProgress(interval_s=3600)))
    texts: dict[str, str] = {"traceback": "".join(traceback.format_exception(caught.value))}
    error: BaseException | None = caught.value
    depth = 0
    while error is not None and depth < 20:
        texts[f"str {depth}"], texts[f"repr {depth}"] = str(error), repr(error)
        texts[f"args {depth}"] = repr(error.args)
        error, depth = error.__cause__ or error.__context__, depth + 1
    assert KEY_ENV in str(caught.value)
    captured = capsys.readouterr()
    texts |= {"stdout": captured.out, "stderr": captured.err}
    assert_no_secret(texts)
    assert cli.app.pretty_exceptions_enable is False  # a traceback would print locals holding the key


def test_an_unset_variable_is_named_not_guessed(
    tmp_path: Path, sim_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    spec = load_job(keyed_job(tmp_path, sim_url, records=3))
    with pytest.raises(FatalRunError, match=f"environment variable {KEY_ENV} .*which is not set"):
        anyio.run(run_job, spec, RunOptions(progress=LogProgress(interval_s=3600)))


@pytest.mark.parametrize(
    ("where", "endpoint"),
    [
        ("endpoint.api_key", {"api_key": KEY}),
        ("endpoint.token", {"token": KEY}),
        ("api_key", None),
    ],
)
def test_a_job_file_has_no_place_for_a_key(
    tmp_path: Path, where: str, endpoint: dict[str, str] | None
) -> None:
    overrides: dict[str, Any] = {"endpoint": endpoint} if endpoint else {"api_key": KEY}
    job = write_job(tmp_path, **overrides)
    result = CliRunner().invoke(cli.app, ["run", str(job)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {job}: key '{where}': unknown key (a job file holds no secrets: put the API key in an "
        "environment variable and name that variable in endpoint.api_key_env)"
    )
    assert_no_secret({"output": result.output})
    assert not (tmp_path / "test.duckdb").exists()


# --- a key where a job file names the server or the variable ---------------------------------------


def test_the_client_settings_do_not_show_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = load_job(
        write_job(tmp_path, endpoint={"base_url": "http://127.0.0.1:1/v1", "api_key_env": KEY_ENV})
    )
    settings = client_settings(spec)
    assert settings.api_key == KEY
    assert_no_secret({"repr": repr(settings), "str": str(settings)})


def key_in_base_url_userinfo(url: str) -> dict[str, str]:
    return {"base_url": url.replace("http://", f"http://user:{KEY}@")}


def key_in_base_url_query(url: str) -> dict[str, str]:
    return {"base_url": f"{url}?api-key={KEY}"}


def key_as_the_variable_name(url: str) -> dict[str, str]:
    return {"base_url": url, "api_key_env": KEY}


@pytest.mark.parametrize(
    "endpoint", [key_in_base_url_userinfo, key_in_base_url_query, key_as_the_variable_name]
)
def test_a_key_where_the_job_file_names_the_server_or_the_variable_is_refused(
    tmp_path: Path, sim_url: str, monkeypatch: pytest.MonkeyPatch, endpoint: Any
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    job = keyed_job(tmp_path, sim_url, records=3, endpoint=endpoint(sim_url))
    result = CliRunner().invoke(cli.app, ["run", str(job), "--log-format", "json"])
    texts = {"output": result.output, "exception": repr(result.exception)}
    if (tmp_path / "test.duckdb").exists():
        texts["database tables"] = database_text(tmp_path / "test.duckdb")
    assert_no_secret(texts)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
