"""Exit codes in one place: :func:`pipeline.errors.exit_code_for` gives every code, of a fatal error or
of an :class:`~pipeline.errors.Ending`, and the docs' list (the section "Exit codes" of docs/running.md)
names exactly the codes it gives, each once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.errors import (
    AlreadyRunningError,
    AnswersRejectedError,
    ConfigError,
    DatabaseError,
    DatabaseFailure,
    Ending,
    FatalRunError,
    StalledRunError,
    exit_code_for,
)
from pipeline.run.options import RunStatus, RunSummary
from tests.support.docs import section

#: One error of each kind the mapping tells apart, and a plain fatal one.
ERRORS: tuple[FatalRunError, ...] = (
    ConfigError("bad key"),
    DatabaseError("out of memory", kind=DatabaseFailure.OUT_OF_MEMORY),
    DatabaseError("disk full", kind=DatabaseFailure.DISK_FULL),
    AlreadyRunningError("running", pid=1),
    StalledRunError("stalled"),
    AnswersRejectedError("rejected"),
)


def readme_exit_codes() -> dict[int, str]:
    """The docs' list: each ``**N** meaning`` of the paragraph that starts with "Exit codes:"."""
    paragraph = section("Exit codes").text.split("Exit codes:", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"\*\*(\d+)\*\*\s+([^·(]+)", paragraph)
    codes = [int(code) for code, _ in listed]
    assert len(codes) == len(set(codes)), f"a code listed twice: {codes}"
    return {int(code): " ".join(meaning.split()) for code, meaning in listed}


def test_the_readme_lists_every_code_exit_code_for_gives_and_no_other() -> None:
    given = {exit_code_for(ending) for ending in Ending} | {exit_code_for(error) for error in ERRORS}
    given |= {exit_code_for(error, reading=True) for error in ERRORS}
    assert set(readme_exit_codes()) == given


@pytest.mark.parametrize(
    ("ending", "meaning"),
    [
        (Ending.DONE, "all done"),
        (Ending.FAILURES, "finished with failures"),
        (Ending.CHECK_WARNED, "finished with failures"),  # a run would go, not well: alerted as one
        (Ending.DRIFTED, "finished with failures"),
        (Ending.CHECK_FAILED, "run aborted"),  # what the run it foresees would end with
        (Ending.INTERRUPTED, "interrupted"),
    ],
)
def test_each_ending_gives_the_code_the_readme_lists_for_it(ending: Ending, meaning: str) -> None:
    assert readme_exit_codes()[exit_code_for(ending)].startswith(meaning)


@pytest.mark.parametrize(
    ("error", "reading", "meaning"),
    [
        (ConfigError("bad key"), False, "configuration error"),
        (DatabaseError("oom", kind=DatabaseFailure.OUT_OF_MEMORY), False, "configuration error"),
        (DatabaseError("disk full", kind=DatabaseFailure.DISK_FULL), False, "run aborted"),
        (AlreadyRunningError("running", pid=1), False, "this job is already running"),
        (AlreadyRunningError("running", pid=1), True, "run aborted"),  # a reader is not a second run
        (StalledRunError("stalled"), False, "stalled"),
        (AnswersRejectedError("rejected"), False, "run aborted"),
    ],
)
def test_each_error_gives_the_code_the_readme_lists_for_it(
    error: FatalRunError, reading: bool, meaning: str
) -> None:
    assert readme_exit_codes()[exit_code_for(error, reading=reading)].startswith(meaning)


@pytest.mark.parametrize(
    ("status", "ending"),
    [
        (RunStatus.COMPLETED, Ending.DONE),
        (RunStatus.NOTHING_TO_DO, Ending.DONE),
        (RunStatus.COMPLETED_WITH_FAILURES, Ending.FAILURES),
        (RunStatus.INTERRUPTED, Ending.INTERRUPTED),
    ],
)
def test_a_finished_runs_code_is_its_endings(status: RunStatus, ending: Ending) -> None:
    summary = RunSummary(1, status, Path("x.duckdb"), "results", "failures")
    assert summary.exit_code == exit_code_for(ending)
