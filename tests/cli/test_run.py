"""``pipeline run``'s options, in process (typer's CliRunner): what each turns into, and what --help
says of it. The runs themselves, as cron starts them, are tests/cli/test_cli.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pipeline.cli as cli
import pipeline.run.runner as runner_module
from pipeline.errors import FailureClass
from pipeline.job.spec import JobSpec
from pipeline.run.runner import Runner, RunOptions, RunStatus, RunSummary
from tests.support.jobs import write_job


def options_given(monkeypatch: pytest.MonkeyPatch, job: Path, *args: str) -> RunOptions:
    """The options ``pipeline run JOB ARGS`` hands its run (the run itself is not started)."""
    given: list[RunOptions] = []

    async def noted(spec: JobSpec, options: RunOptions | None) -> RunSummary:
        assert options is not None
        given.append(options)
        return RunSummary(None, RunStatus.NOTHING_TO_DO, spec.database, "results", "failures")

    def runner_for(spec: JobSpec, *, local: bool = False) -> Runner:
        return noted

    monkeypatch.setattr(runner_module, "runner_for", runner_for)
    result = CliRunner().invoke(cli.app, ["run", str(job), *args, "--log-format", "json"])
    assert result.exit_code == 0, result.output
    (options,) = given
    return options


def test_class_alone_retries_that_class_with_the_backlog_as_retry_failed_class_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --class truncated` alone: --help said it needed --retry-failed or --only-failed, so it read
    as a plain run; it is --retry-failed --class truncated, and says so."""
    job = write_job(tmp_path)
    alone = options_given(monkeypatch, job, "--class", "truncated")
    with_flag = options_given(monkeypatch, job, "--retry-failed", "--class", "truncated")
    assert alone.selection == with_flag.selection
    assert alone.retry == {FailureClass.TRANSIENT, FailureClass.TRUNCATED} and not alone.only_failed
    only = options_given(monkeypatch, job, "--only-failed", "--class", "truncated")
    assert only.retry == {FailureClass.TRUNCATED} and only.only_failed  # nothing new


def test_run_help_says_what_class_alone_does() -> None:
    result = CliRunner().invoke(cli.app, ["run", "--help"], env={"COLUMNS": "200"})
    said = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
    assert "Alone it is --retry-failed --class (new records too); with --only-failed, nothing new." in said
