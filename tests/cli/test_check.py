"""``pipeline check`` as a person or a script runs it: a real process against the simulator, its lines,
its JSON and its exit codes (0 all ok, 1 a warning, 2 a bad job or option, 3 the server cannot serve)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from pipeline.job.commands import command
from pipeline.store.opening import prepare_database
from pipeline.store.read_copy import copy_path, request_path, write_copy
from tests.support.fakes import dead_url
from tests.support.jobs import make_source, write_job
from tests.support.outputs import database_held_by_another_process, job_with_outputs
from tests.support.processes import run_pipeline, sim_server

pytestmark = pytest.mark.process  # each test runs `pipeline check` against a simulator process

KEYS = {
    "context",
    "kv_tokens",
    "requests_that_fit",
    "prefix_caching",
    "answer_in_reasoning",
    "reasoning_effort_honored",
    "longest_prompt",
    "eta_s",
    "checks",
}


def job(tmp_path: Path, records: int = 10, **overrides: object) -> Path:
    path = write_job(tmp_path, **overrides)
    make_source(tmp_path / "test.duckdb", records)
    return path


def test_a_good_server_is_all_ok_and_exit_0_and_json_has_every_key(tmp_path: Path) -> None:
    path = job(tmp_path)
    # --speed 100, not 1000: a probe's latency is the model's time x the speed, the client's own
    # milliseconds too, and on a busy 2-core machine 20 of them at x1000 read as a slow server.
    with sim_server("--profile", "gpt-oss-120b", "--speed", "100", "--model", "test-model") as url:
        text = run_pipeline("check", str(path), "--endpoint", url)
        data = run_pipeline("check", str(path), "--endpoint", url, "--json")
    assert text.returncode == 0, text.stdout + text.stderr
    names = [line.split(":")[0].split()[-1] for line in text.stdout.splitlines()]
    assert names == [
        "context",
        "kv_cache",
        "prefix_caching",
        "answer",
        "reasoning_effort",
        "response_format",
        "timeout",
        "backlog",
    ]
    assert all(line.startswith("ok ") for line in text.stdout.splitlines())
    report = orjson.loads(data.stdout)
    assert data.returncode == 0 and set(report) >= KEYS
    assert all(check["status"] in ("ok", "warn", "fail", "unknown") for check in report["checks"])
    assert report["kv_tokens"] == 4_800_000 and report["prefix_caching"] is True
    assert report["requests_that_fit"] > 1000 and report["reasoning_effort_honored"] is True


def test_a_warning_is_exit_1_and_says_what_to_do(tmp_path: Path) -> None:
    path = job(tmp_path)
    with sim_server("--model", "test-model", "--no-prefix-caching") as url:
        text = run_pipeline("check", str(path), "--endpoint", url)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "warn     prefix_caching: off:" in text.stdout and "--enable-prefix-caching" in text.stdout


def test_a_server_that_is_down_is_exit_3_with_one_fail_line(tmp_path: Path) -> None:
    """One line: not a second `ok backlog` beside a server that is not there."""
    path = job(tmp_path)
    text = run_pipeline("check", str(path), "--endpoint", dead_url())
    assert text.returncode == 3
    (line,) = text.stdout.splitlines()
    assert line.startswith("fail     server: cannot connect to") and "Traceback" not in text.stderr


def test_a_job_whose_source_table_does_not_exist_is_one_line_and_exit_2_as_run_says_it(
    tmp_path: Path,
) -> None:
    path = write_job(tmp_path)
    with sim_server("--model", "test-model") as url:
        checked = run_pipeline("check", str(path), "--endpoint", url)
        ran = run_pipeline("run", str(path), "--endpoint", url)
    assert checked.returncode == ran.returncode == 2, checked.stdout + checked.stderr
    assert not checked.stdout and checked.stderr == ran.stderr.splitlines()[-1] + "\n"
    assert checked.stderr.startswith(f"error: {path}: source in ") and "table 'postings' does not exist" in (
        checked.stderr
    )


@contextmanager
def answering_copy_requests(database: Path) -> Iterator[None]:
    """Answer a reader's request for a fresh read copy as a running run does (here, by making the copy
    there is new), so that it does not wait out its 30 s for one."""
    stop = threading.Event()

    def answer() -> None:
        while not stop.wait(0.05):
            if request_path(database).exists():
                os.utime(copy_path(database))
                request_path(database).unlink(missing_ok=True)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_while_a_run_holds_the_database_the_backlog_is_read_from_its_copy(tmp_path: Path) -> None:
    """As status, failures and export read it: the run's read copy, said on stderr, not `unknown`."""
    spec = job_with_outputs(tmp_path)  # 12 records: 5 done, 7 failed permanently
    connection = prepare_database(spec)
    try:
        connection.execute(
            "INSERT INTO postings SELECT i, 'Title ' || i, 'New ' || i FROM range(12, 15) t(i)"
        )
        connection.execute("UPDATE runs SET status = 'running', ended_at = NULL")
        write_copy(connection, spec, 1)
    finally:
        connection.close()
    with (
        sim_server("--model", "test-model") as url,
        database_held_by_another_process(spec.database, as_run=True),
        answering_copy_requests(spec.database),
    ):
        text = run_pipeline("check", str(spec.source_file), "--endpoint", url)
        data = orjson.loads(run_pipeline("check", str(spec.source_file), "--endpoint", url, "--json").stdout)
    assert text.returncode == 0, text.stdout + text.stderr
    backlog = text.stdout.splitlines()[-1]
    assert backlog.startswith("ok       backlog: 3 records x"), backlog
    assert "note: a run holds the database; read from its copy, as of " in text.stderr
    assert data["pending"] == 3 and data["read_copy"]["run_id"] == 1


def test_a_bad_endpoint_or_an_empty_source_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = job(tmp_path, records=0)
    bad = run_pipeline("check", str(path), "--endpoint", "gpu-box:8000")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --endpoint") and not bad.stdout
    with sim_server("--model", "test-model") as url:
        empty = run_pipeline("check", str(path), "--endpoint", url)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1
    assert "the source has no records to probe the server with" in empty.stderr
    local = run_pipeline("check", str(write_job(tmp_path, endpoint={"base_url": "local"})))
    assert local.returncode == 2 and f"start it with `{command('serve-local')}`" in local.stderr
    assert not local.stdout


def test_several_endpoints_each_get_their_lines_and_their_json(tmp_path: Path) -> None:
    path = job(tmp_path)
    with sim_server("--model", "test-model") as first, sim_server("--model", "test-model") as second:
        text = run_pipeline("check", str(path), "--endpoint", first, "--endpoint", second)
        data = run_pipeline("check", str(path), "--endpoint", first, "--endpoint", second, "--json")
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"{first} (test-model)" in text.stdout and f"{second} (test-model)" in text.stdout
    report = orjson.loads(data.stdout)
    assert [endpoint["base_url"] for endpoint in report["endpoints"]] == [first, second]
    assert {check["endpoint"] for check in report["checks"]} == {first, second}
    assert "on two" not in text.stdout  # the ETA is over both already
