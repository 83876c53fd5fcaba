"""Exit codes decided once: :func:`run_or_exit` and :func:`fail` take every code from
:func:`pipeline.errors.exit_code_for`, and each command, given a bad job or a bad option, says so in
one line and exits 2 before anything is sent (in process: no server, no subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from pipeline.cli.common import read_or_exit, run_or_exit
from pipeline.errors import (
    EXIT_ABORTED,
    EXIT_ALREADY_RUNNING,
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_STALLED,
    AlreadyRunningError,
    ConfigError,
    DatabaseError,
    DatabaseFailure,
    DatabaseLockedError,
    FatalRunError,
    LocalNotInstalledError,
    ModelNotServedError,
    StalledRunError,
)
from tests.support.cli import cli_run, error_line
from tests.support.jobs import write_job


def raising(error: BaseException) -> object:
    raise error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("bad key"), EXIT_CONFIG),
        (ModelNotServedError("not served"), EXIT_CONFIG),
        (LocalNotInstalledError("no extra"), EXIT_CONFIG),
        (DatabaseError("out of memory", kind=DatabaseFailure.OUT_OF_MEMORY), EXIT_CONFIG),
        (DatabaseError("disk full", kind=DatabaseFailure.DISK_FULL), EXIT_ABORTED),
        (DatabaseLockedError("held"), EXIT_ABORTED),
        (AlreadyRunningError("running", pid=1), EXIT_ALREADY_RUNNING),
        (StalledRunError("stalled"), EXIT_STALLED),
        (FatalRunError("refused"), EXIT_ABORTED),
    ],
)
def test_a_fatal_error_is_one_line_and_the_code_of_exit_code_for(
    error: FatalRunError, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as raised:
        run_or_exit(lambda: raising(error))
    assert raised.value.exit_code == code
    assert capsys.readouterr().err == f"error: {error}\n"


def test_a_reader_finding_a_run_is_aborted_not_already_running() -> None:
    with pytest.raises(typer.Exit) as raised:
        read_or_exit(lambda: raising(AlreadyRunningError("running", pid=1)))
    assert raised.value.exit_code == EXIT_ABORTED


def test_ctrl_c_is_130_and_a_result_passes_through() -> None:
    with pytest.raises(typer.Exit) as raised:
        run_or_exit(lambda: raising(KeyboardInterrupt()))
    assert raised.value.exit_code == EXIT_INTERRUPTED
    assert run_or_exit(lambda: 42) == 42


def test_other_errors_are_not_swallowed() -> None:
    with pytest.raises(ValueError, match="a bug"):
        run_or_exit(lambda: raising(ValueError("a bug")))


JOB_COMMANDS = [
    ["run", "{job}"],
    ["check", "{job}"],
    ["status", "{job}"],
    ["failures", "{job}"],
    ["export", "{job}", "--out", "{folder}/out.jsonl"],
    ["report", "{job}"],
    ["eval", "{job}", "--gold", "{folder}/gold.jsonl"],
    ["compare", "{job}", "--variants", "main,other"],
    ["review", "{job}", "--html", "{folder}/review.html"],
    ["judge", "{job}", "--export-gold", "{folder}/gold.jsonl"],
    ["load", "{folder}/records.jsonl", "--job", "{job}"],
    ["bench", "--job", "{job}"],
]


@pytest.mark.parametrize("command", JOB_COMMANDS, ids=lambda command: command[0])
def test_every_command_exits_2_on_a_bad_job_with_one_line(tmp_path: Path, command: list[str]) -> None:
    job = write_job(tmp_path, concurrncy=5)
    args = [arg.format(job=job, folder=tmp_path) for arg in command]
    result = cli_run(*args)
    assert result.exit_code == EXIT_CONFIG, result.output
    assert error_line(result) == f"error: {job}: key 'concurrncy': unknown key (did you mean 'concurrency'?)"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]  # nothing written


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "{job}", "--class", "bogus"], "--class 'bogus'"),
        (["load", "{job}", "--job", "{job}", "--rename", "x"], "--rename 'x': expected FILE_COLUMN=NAME"),
        (["eval", "{job}", "--gold", "{job}", "--judged"], "--judged measures against judgments"),
        (["judge", "{job}", "--endpoint", "http://127.0.0.1:9/v1"], "--endpoint is the judge model's server"),
        (["review", "{job}", "--html", "x.html", "--variant", "a", "--variants", "a,b"], "not both"),
        (["status", "{job}", "--database", "{folder}/missing/x.duckdb"], "does not exist"),
        (["check", "{local}"], "the job's endpoint is local"),
        (["bench", "--concurrency", "1,x", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"], "1,x"),
        (["bench", "--job", "{job}", "--seed-knee", "--local"], "--seed-knee and --local"),
        (["sim", "--profile", "nope"], "--profile 'nope': one of"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else None,
)
def test_a_bad_option_is_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    job = write_job(tmp_path)
    (tmp_path / "local").mkdir()
    local = write_job(tmp_path / "local", endpoint={"base_url": "local"})
    result = cli_run(*[arg.format(job=job, local=local, folder=tmp_path) for arg in args])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert said in error_line(result)


@pytest.mark.parametrize("command", ["run", "bench"])
def test_bench_exits_2_for_a_configuration_error_as_run_does(tmp_path: Path, command: str) -> None:
    """The job's source is not loaded: nothing to send, for a run as for a sweep of its requests."""
    job = write_job(tmp_path)
    result = cli_run(*(["run", str(job)] if command == "run" else ["bench", "--job", str(job)]))
    assert result.exit_code == EXIT_CONFIG, result.output
    assert "test.duckdb" in error_line(result)


def test_bench_of_a_job_on_the_local_server_asks_for_local_instead_of_connecting(tmp_path: Path) -> None:
    job = write_job(tmp_path, endpoint={"base_url": "local"})
    result = cli_run("bench", "--job", str(job))
    assert result.exit_code == EXIT_CONFIG, result.output
    assert error_line(result) == (
        f"error: {job}: the job's endpoint is local: give --local to sweep the bundled server, "
        "or --endpoint URL"
    )


def test_version_names_the_installed_package_and_the_python_it_runs_on() -> None:
    from importlib.metadata import version

    result = cli_run("--version")
    assert result.exit_code == 0, result.output
    python = ".".join(str(part) for part in sys.version_info[:3])
    assert result.output.strip() == f"pipeline {version('pipeline')} (Python {python}, {sys.executable})"


VERSION_IN_A_FRESH_INTERPRETER = """
import sys
from pipeline.cli import main
sys.argv = ["pipeline", "--version"]
try:
    main()
except SystemExit as ended:
    print("exit", ended.code)
print(*sorted(name for name in ("duckdb", "openai", "httpx2", "rapidfuzz") if name in sys.modules))
"""


@pytest.mark.process
def test_version_in_a_fresh_interpreter_loads_nothing_a_command_needs() -> None:
    """`pipeline --version` in a cron line or a bug report: the version at once, and exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", VERSION_IN_A_FRESH_INTERPRETER], capture_output=True, text=True, timeout=60
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("pipeline ") and "(Python " in lines[0], done.stderr
    assert lines[1:] == ["exit 0", ""]
