"""The commands hints print: the program by its path (the script beside the interpreter, or the
interpreter with -m), the job, --database, --variant and --endpoint as given where the command takes
them, quoted for a shell."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.job.commands import Asked, command, program
from tests.support.jobs import make_job


def test_the_program_is_the_script_beside_the_interpreter_or_the_interpreter_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_folder = tmp_path / "env with space" / "bin"
    bin_folder.mkdir(parents=True)
    python = bin_folder / "python"
    monkeypatch.setattr(sys, "executable", str(python))
    assert program() == [str(python), "-m", "pipeline"]  # run from a checkout: no script
    script = bin_folder / "pipeline"
    script.write_text("#!/bin/sh\n")
    assert program() == [str(python), "-m", "pipeline"]  # not executable: not a program
    script.chmod(0o755)
    assert program() == [str(script)]


def test_each_command_repeats_the_options_as_given_that_it_takes() -> None:
    asked = Asked(Path("jobs/x.yaml"), Path("trial.duckdb"), "v2", ("http://gpu:8000/v1",))
    run = shlex.split(asked.command("run", "--only-failed"))
    assert run[: len(program())] == program()
    assert run[len(program()) :] == [
        *("run", "jobs/x.yaml", "--only-failed", "--database", "trial.duckdb"),
        *("--variant", "v2", "--endpoint", "http://gpu:8000/v1"),
    ]
    said = {
        verb: shlex.split(asked.command(verb))[len(program()) :] for verb in ("status", "check", "compare")
    }
    assert said["status"] == ["status", "jobs/x.yaml", "--database", "trial.duckdb", "--variant", "v2"]
    assert said["check"] == [
        "check",
        "jobs/x.yaml",
        "--database",
        "trial.duckdb",
        "--endpoint",
        "http://gpu:8000/v1",
    ]
    assert said["compare"] == ["compare", "jobs/x.yaml", "--database", "trial.duckdb"]
    load = shlex.split(Asked(Path("jobs/x.yaml")).command("load"))[len(program()) :]
    assert load == ["load", "FILE", "--job", "jobs/x.yaml"]


def test_a_path_a_shell_must_be_careful_with_comes_back_whole() -> None:
    job = Path('it\'s a "job" $HOME/x.yaml')
    words = shlex.split(Asked(job, variant="a b").command("status"))
    assert words[-4:] == ["status", str(job), "--variant", "a b"]


@pytest.mark.process  # the program, pasted into bash
def test_the_program_runs_from_a_shell_without_the_environment_on_its_path(tmp_path: Path) -> None:
    pasted = subprocess.run(
        ["bash", "-c", f"{shlex.join(program())} --help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert pasted.returncode == 0, pasted.stderr
    assert "Usage:" in pasted.stdout and "run" in pasted.stdout


def test_a_spec_names_the_command_it_was_loaded_by(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    assert Asked.of(spec) == Asked(spec.source_file)  # the job's own database, main: neither named
    trial = spec.with_overrides(database=tmp_path / "trial.duckdb").for_variant("v2")
    assert Asked.of(trial, endpoints=["http://gpu:8000/v1"]) == Asked(
        spec.source_file, tmp_path / "trial.duckdb", "v2", ("http://gpu:8000/v1",)
    )
    assert Asked.of(trial).of_variant("main") == Asked(spec.source_file, tmp_path / "trial.duckdb")
    assert Asked.of(spec).of_variant("b").variant == "b"


def test_a_command_without_a_job_is_the_program_and_its_words() -> None:
    assert shlex.split(command("serve-local", "--port", "8 000")) == [
        *program(),
        "serve-local",
        "--port",
        "8 000",
    ]
