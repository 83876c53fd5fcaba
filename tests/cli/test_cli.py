"""The command line, as cron or a person runs it: real processes, exit codes, output."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pipeline.job.commands import program
from tests.support.jobs import make_source, table_rows, write_job
from tests.support.logged_run import some_done, wait_for_snapshot
from tests.support.processes import REPO, pipeline_command, run_pipeline, sim_server, subprocess_env

pytestmark = pytest.mark.process  # real `pipeline` processes, most against a simulator process

PROGRAM = shlex.join(program())  # how a hint names the pipeline program


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with sim_server("--model", "test-model") as url:
        yield url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_run_succeeds_prints_a_summary_and_logs_json(tmp_path: Path, sim_url: str) -> None:
    job = write_job(tmp_path, endpoint={"base_url": sim_url})
    make_source(tmp_path / "test.duckdb", 40)
    result = run_pipeline("run", str(job))
    assert result.returncode == 0, result.stderr
    assert "40 done, 0 failed of 40" in result.stdout
    assert f"table results in {tmp_path / 'test.duckdb'}" in result.stdout
    assert "read_only=True" in result.stdout  # a query to look at the results
    events = [json.loads(line) for line in result.stderr.splitlines()]  # JSON lines: no terminal here
    assert {"run started", "run ended", "progress"} <= {event["event"] for event in events}
    assert table_rows(tmp_path / "test.duckdb", "SELECT count(*) FROM results") == [(40,)]


def test_the_look_line_works_when_pasted_into_a_shell(tmp_path: Path, sim_url: str) -> None:
    """Pasted where `python` is not the environment's (or is not there at all), into a folder whose
    name a shell and Python must both be careful with."""
    folder = tmp_path / 'it\'s a "job" $HOME'
    folder.mkdir()
    job = write_job(folder, endpoint={"base_url": sim_url})
    make_source(folder / "test.duckdb", 3)
    result = run_pipeline("run", str(job))
    assert result.returncode == 0, result.stderr
    (look,) = [line.removeprefix("look:") for line in result.stdout.splitlines() if line.startswith("look:")]
    pasted = subprocess.run(
        ["bash", "-c", look], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    assert pasted.returncode == 0, pasted.stderr
    assert "record_id" in pasted.stdout and "extracted" in pasted.stdout
    assert all(f" {record} │" in pasted.stdout for record in range(3))  # the ids, right-aligned


def test_the_hints_after_a_variant_run_read_its_database_and_variant(tmp_path: Path) -> None:
    """A trial (--database elsewhere, a variant): the failures hint and the look line, pasted, read what
    this run wrote, not the job's own database or variant main."""
    job = write_job(tmp_path, endpoint={"base_url": "http://127.0.0.1:1/v1"}, model="test-model")
    trial = tmp_path / "trial"
    trial.mkdir()
    make_source(trial / "trial.duckdb", 20)
    with sim_server("--model", "test-model", "--fault-invalid-json", "0.6", "--seed", "3") as url:
        variant = ["--variant", "quick", "--database", str(trial / "trial.duckdb")]
        result = run_pipeline("run", str(job), "--endpoint", url, *variant)
    assert result.returncode == 1, result.stderr  # some records failed their re-asks too
    (hint,) = [line for line in result.stdout.splitlines() if line.startswith("failures:")]
    command = hint.split("`")[1]
    assert command.startswith(f"{PROGRAM} failures ") and command.endswith(
        f"--database {trial / 'trial.duckdb'} --variant quick"
    )
    shown = run_pipeline(*shlex.split(command)[len(program()) :])
    assert shown.returncode == 0 and "invalid_json" in shown.stdout, shown.stderr
    (look,) = [line.removeprefix("look:") for line in result.stdout.splitlines() if line.startswith("look:")]
    pasted = subprocess.run(["bash", "-c", look], capture_output=True, text=True, timeout=60)
    assert pasted.returncode == 0 and "record_id" in pasted.stdout, pasted.stderr
    assert "WHERE variant = " in look and "quick" in look


def test_run_again_has_nothing_to_do(tmp_path: Path, sim_url: str) -> None:
    job = write_job(tmp_path, endpoint={"base_url": sim_url})
    make_source(tmp_path / "test.duckdb", 5)
    assert run_pipeline("run", str(job)).returncode == 0
    again = run_pipeline("run", str(job))
    assert again.returncode == 0 and "nothing to do" in again.stdout


@pytest.mark.parametrize(("wrong", "code"), [("model", 2), ("endpoint without /v1", 2), ("endpoint down", 3)])
def test_a_run_with_nothing_to_do_fails_as_one_with_work_when_its_server_is_wrong(
    tmp_path: Path, sim_url: str, wrong: str, code: int
) -> None:
    """A nightly job whose model, endpoint or server went wrong said "nothing to do", exit 0, on every
    quiet night; it fails as soon as records come, so it says so now."""
    job = write_job(tmp_path, endpoint={"base_url": sim_url})
    make_source(tmp_path / "test.duckdb", 3)
    assert run_pipeline("run", str(job)).returncode == 0
    make_source(tmp_path / "todo.duckdb", 3)
    option = {
        "model": ["--model", "nosuch/model"],
        "endpoint without /v1": ["--endpoint", sim_url.removesuffix("/v1")],
        "endpoint down": ["--endpoint", f"http://127.0.0.1:{free_port()}/v1"],
    }[wrong]
    quiet = run_pipeline("run", str(job), *option)
    with_work = run_pipeline("run", str(job), "--database", str(tmp_path / "todo.duckdb"), *option)
    assert (quiet.returncode, with_work.returncode) == (code, code), quiet.stdout
    said = quiet.stderr.strip().splitlines()[-1]
    assert said.startswith("error: ") and said == with_work.stderr.strip().splitlines()[-1]
    assert table_rows(tmp_path / "test.duckdb", "SELECT count(*) FROM runs") == [(1,)]  # no quiet night


def test_overrides_limit_and_concurrency(tmp_path: Path, sim_url: str) -> None:
    job = write_job(tmp_path, endpoint={"base_url": "http://127.0.0.1:1/v1"}, model="other")
    make_source(tmp_path / "test.duckdb", 30)
    result = run_pipeline(
        "run", str(job), "--limit", "7", "--concurrency", "3", "--endpoint", sim_url, "--model", "test-model"
    )
    assert result.returncode == 0, result.stderr
    assert table_rows(tmp_path / "test.duckdb", "SELECT count(*), max(concurrency) FROM results, runs") == [
        (7, 3)
    ]


def test_failures_exit_1_and_retry_failed(tmp_path: Path) -> None:
    with sim_server("--model", "test-model", "--fault-invalid-json", "1.0") as bad_url:
        job = write_job(tmp_path, endpoint={"base_url": bad_url}, retry={"reasks": 1})
        make_source(tmp_path / "test.duckdb", 6)
        result = run_pipeline("run", str(job))
    assert result.returncode == 1
    assert (
        "6 failed" in result.stdout and f"`{PROGRAM} run {job} --only-failed` retries them" in result.stdout
    )
    assert table_rows(tmp_path / "test.duckdb", "SELECT DISTINCT failure_class FROM failures") == [
        ("invalid_json",)
    ]
    with sim_server("--model", "test-model") as good_url:
        retried = run_pipeline("run", str(job), "--retry-failed", "--endpoint", good_url)
    assert retried.returncode == 0 and "6 done" in retried.stdout


def test_config_error_exits_2_with_one_line_before_any_request(tmp_path: Path) -> None:
    job = write_job(tmp_path, concurrncy=5)
    result = run_pipeline("run", str(job))
    assert result.returncode == 2
    hint = "(did you mean 'concurrency'?)"
    assert result.stderr.strip() == f"error: {job}: key 'concurrncy': unknown key {hint}"


def test_missing_source_table_exits_2(tmp_path: Path, sim_url: str) -> None:
    job = write_job(tmp_path, endpoint={"base_url": sim_url})
    result = run_pipeline("run", str(job))
    assert result.returncode == 2
    assert "table 'postings' does not exist" in result.stderr and "pipeline load" in result.stderr


def test_server_down_exits_3_with_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    job = write_job(tmp_path, endpoint={"base_url": url})
    make_source(tmp_path / "test.duckdb", 5)
    result = run_pipeline("run", str(job))
    assert result.returncode == 3
    assert f"error: cannot connect to {url}" in result.stderr


def test_wrong_model_exits_2_listing_the_served_models(tmp_path: Path, sim_url: str) -> None:
    job = write_job(tmp_path, endpoint={"base_url": sim_url}, model="gpt-oss-120b")
    make_source(tmp_path / "test.duckdb", 5)
    result = run_pipeline("run", str(job))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {job}: key 'model': {sim_url} does not serve model 'gpt-oss-120b'; it serves: test-model"
    )


def test_sigint_exits_130_and_keeps_what_finished(tmp_path: Path) -> None:
    with sim_server("--model", "test-model", "--latency", "0.2") as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, concurrency=4)
        make_source(tmp_path / "test.duckdb", 400)
        process = subprocess.Popen(
            pipeline_command("run", str(job)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
            cwd=REPO,
        )
        wait_for_snapshot(tmp_path / "test.duckdb", process, some_done)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert "interrupted" in stdout
    done = table_rows(tmp_path / "test.duckdb", "SELECT count(*) FROM results")[0][0]
    assert 0 < done < 400
    assert table_rows(tmp_path / "test.duckdb", "SELECT status, done FROM runs") == [("interrupted", done)]


def test_status_text_and_json(tmp_path: Path, sim_url: str) -> None:
    job = write_job(tmp_path, endpoint={"base_url": sim_url})
    make_source(tmp_path / "test.duckdb", 20)
    assert run_pipeline("run", str(job), "--limit", "15").returncode == 0
    text = run_pipeline("status", str(job))
    assert text.returncode == 0
    assert "records:  20" in text.stdout and "done:     15" in text.stdout and "pending:  5" in text.stdout
    assert "last run: #1 completed" in text.stdout and "records/min" in text.stdout
    report = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
    assert (report["source_records"], report["done"], report["pending"]) == (20, 15, 5)
    assert report["last_run"]["status"] == "completed" and report["eta_s"] is not None
    assert report["stale"] == {
        "total": 0, "prompt": 0, "schema": 0, "model": 0, "settings": 0, "unknown": 0,
    }  # fmt: skip
    assert report["tokens_per_done"]["completion"] > 0 and report["orphaned"] == 0

    edited = write_job(tmp_path, endpoint={"base_url": sim_url}, prompt={"system": "Extract it well."})
    stale_text = run_pipeline("status", str(edited)).stdout
    assert (
        f"stale:    15 (prompt 15; a plain run keeps them, `{PROGRAM} run {edited} --redo-stale` redoes them "
        "and takes the 5 pending too)" in stale_text
    )
    plain = run_pipeline("run", str(edited), "--limit", "1")
    assert plain.returncode == 0
    assert (
        "stale:    15 results made by an older version of the job (prompt 15); kept as they are: "
        f"`{PROGRAM} run {edited} --redo-stale` redoes them"
    ) in plain.stdout
    redo = run_pipeline("run", str(edited), "--redo-stale", "prompt")
    assert redo.returncode == 0 and "19 done, 0 failed of 19" in redo.stdout
    assert orjson.loads(run_pipeline("status", str(edited), "--json").stdout)["stale"]["total"] == 0


def test_status_of_a_database_held_by_a_run_uses_the_snapshot(tmp_path: Path) -> None:
    with sim_server("--model", "test-model", "--latency", "0.3") as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, concurrency=2)
        make_source(tmp_path / "test.duckdb", 200)
        process = subprocess.Popen(
            pipeline_command("run", str(job)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=subprocess_env(),
            cwd=REPO,
        )
        try:
            wait_for_snapshot(tmp_path / "test.duckdb", process)
            status = run_pipeline("status", str(job))
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)
    assert status.returncode == 0, status.stderr
    assert f"pid {process.pid}" in status.stdout and "held by a running `pipeline run`" in status.stdout


def test_load_reports_and_rejects(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": i, "title": "t", "body": "b"}) + "\n" for i in range(3)))
    loaded = run_pipeline("load", str(data), "--job", str(job), "--rename", "body=description")
    assert loaded.returncode == 0
    assert f"loaded 3 records from {data} into table postings" in loaded.stdout
    assert ": 3 new, 0 updated, 0 unchanged" in loaded.stdout
    again = run_pipeline("load", str(data), "--job", str(job), "--rename", "body=description")
    assert ": 0 new, 0 updated, 3 unchanged" in again.stdout
    missing = run_pipeline("load", str(data), "--job", str(job))
    assert missing.returncode == 2 and "no column ['description']" in missing.stderr
    bad_rename = run_pipeline("load", str(data), "--job", str(job), "--rename", "oops")
    assert bad_rename.returncode == 2 and "expected FILE_COLUMN=NAME" in bad_rename.stderr
    trial, fewer = tmp_path / "trial.duckdb", tmp_path / "fewer.jsonl"
    fewer.write_text(data.read_text().split("\n", 1)[1])  # all but the first record
    given = ("--job", str(job), "--rename", "body=description", "--database", str(trial))
    assert run_pipeline("load", str(data), *given).returncode == 0
    replaced = run_pipeline("load", str(fewer), *given, "--replace")
    status = f"{PROGRAM} status {job} --database {trial}"  # the trial's, as given
    assert replaced.stdout.rstrip().endswith(
        f", 1 removed (their results stay; `{status}` counts them as orphaned)"
    )


def test_database_override_keeps_trials_apart(tmp_path: Path, sim_url: str) -> None:
    job = write_job(tmp_path, endpoint={"base_url": sim_url}, source={"seed_file": "seed.jsonl"})
    (tmp_path / "seed.jsonl").write_text(
        "".join(json.dumps({"id": i, "title": "t", "description": "d"}) + "\n" for i in range(4))
    )
    trial = tmp_path / "trial.duckdb"
    assert run_pipeline("run", str(job), "--database", str(trial)).returncode == 0
    assert table_rows(trial, "SELECT count(*) FROM results") == [(4,)]
    assert not (tmp_path / "test.duckdb").exists()
    status = orjson.loads(run_pipeline("status", str(job), "--database", str(trial), "--json").stdout)
    assert status["done"] == 4


def test_local_flag_and_local_endpoint_use_the_local_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import pipeline.cli as cli
    import pipeline.run.runner as runner_module
    from pipeline.job.spec import JobSpec
    from pipeline.run.runner import RunStatus, RunSummary

    calls: list[str | None] = []

    async def fake_local(spec: JobSpec, options: object) -> RunSummary:
        calls.append(spec.endpoint.base_url)
        return RunSummary(None, RunStatus.NOTHING_TO_DO, tmp_path / "x.duckdb", "results", "failures")

    monkeypatch.setattr(runner_module, "run_job_locally", fake_local)  # what runner_for picks
    runner = CliRunner()
    plain = write_job(tmp_path)
    assert runner.invoke(cli.app, ["run", str(plain), "--local", "--log-format", "json"]).exit_code == 0
    (tmp_path / "local").mkdir()
    local_job = write_job(tmp_path / "local", endpoint={"base_url": "local"})
    assert runner.invoke(cli.app, ["run", str(local_job), "--log-format", "json"]).exit_code == 0
    assert calls == ["http://testserver/v1", "local"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redo-stale", "content"], "--redo-stale 'content': not a cause to redo (content changes"),
        (["--redo-stale", "promt"], "--redo-stale 'promt': not a cause to redo; use prompt, schema, model"),
        (["--only-failed", "--redo-stale"], "--only-failed retries failures and nothing else"),
        (["--sample", "0"], "Invalid value for '--sample'"),
        (["--class", "transient"], "--class 'transient': not taken here"),
    ],
)
def test_bad_run_selections_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    job = write_job(tmp_path)
    result = run_pipeline("run", str(job), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
