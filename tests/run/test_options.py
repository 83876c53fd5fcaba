"""The options that make a variant: kept with its runs as words, read back, and taken again by a later
command on the variant that gives none (never for main, never over options given)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError, FailureClass
from pipeline.job.commands import command
from pipeline.run.options import RunCommands, RunOptions, VariantOptions, options_of_variant
from pipeline.source.lock import RunLock
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.jobs import make_job
from tests.support.runs import run_served

pytestmark = pytest.mark.anyio


def good() -> ScriptedServer:
    return ScriptedServer([respond(good_completion())])


def prompt_file(folder: Path, text: str = "Extract the posting carefully.") -> Path:
    path = folder / "careful prompt.yaml"
    path.write_text(f"system: {text}\n")
    return path


def test_the_words_kept_read_back_as_the_same_options() -> None:
    made = VariantOptions("http://gpu:8000/v1", "other-model", Path("/p/prompt.yaml"), local=True)
    assert made.words() == (
        *("--endpoint", "http://gpu:8000/v1", "--model", "other-model"),
        *("--prompt-file", "/p/prompt.yaml", "--local"),
    )
    assert VariantOptions.of_words(made.words()) == made
    assert made.words_of_making() == made.words()[2:] and made.making().endpoint is None
    later = VariantOptions.of_words(
        ["--temperature-file", "x", "--model", "m", "--model"]
    )  # a later version's
    assert later == VariantOptions(model="m") and later.make_results
    assert not VariantOptions(endpoint="http://gpu:8000/v1").make_results


def test_a_runs_own_lines_name_its_command_with_the_options_that_made_its_variant(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    trial = spec.with_overrides(database=tmp_path / "trial.duckdb").for_variant("v2")
    made = VariantOptions("http://gpu:8000/v1", "other-model", prompt_file(tmp_path))
    commands = RunCommands.of(trial, RunOptions(variant_options=made.words()))
    job, given = str(spec.source_file), ("--database", str(trial.database))
    assert commands.run("--retry-failed") == command(
        "run", job, "--retry-failed", *made.words_of_making(), *given, "--variant", "v2",
        "--endpoint", "http://gpu:8000/v1",
    )  # fmt: skip
    # check takes no variant and no prompt file: the servers and the model it checks
    assert commands.check() == command(
        "check", job, "--model", "other-model", *given, "--endpoint", "http://gpu:8000/v1"
    )
    assert RunCommands.of(spec, RunOptions()).run() == command("run", job)  # main, the job's database


async def test_a_variant_given_no_options_takes_those_of_its_last_run(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3).for_variant("v2")
    made = VariantOptions(model="test-model", prompt_file=prompt_file(tmp_path))
    summary = await run_served(made.applied(spec), good(), variant_options=made.words())
    assert summary.done == 3
    given = VariantOptions(endpoint="http://elsewhere:8000/v1")
    kept = options_of_variant(spec, given)
    assert kept.kept and kept.words() == ("--endpoint", "http://elsewhere:8000/v1", *made.words())
    assert options_of_variant(spec.for_variant("v2~rerun"), VariantOptions()).words() == made.words()
    assert kept.applied(spec).prompt.system == "Extract the posting carefully."
    other = VariantOptions(model="other-model")
    assert options_of_variant(spec, other) == other  # given: those, and only those
    assert options_of_variant(spec.for_variant("main"), VariantOptions()) == VariantOptions()
    assert options_of_variant(spec.for_variant("v3"), VariantOptions()) == VariantOptions()


async def test_a_run_holding_the_database_is_not_waited_for_by_the_next_run(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=1).for_variant("v2")
    made = VariantOptions(model="test-model")
    await run_served(spec, good(), variant_options=made.words())
    with RunLock(spec.database):
        assert options_of_variant(spec, VariantOptions(), for_run=True) == VariantOptions()


async def test_kept_options_that_no_longer_apply_say_where_they_came_from(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=1).for_variant("v2")
    path = prompt_file(tmp_path)
    made = VariantOptions(prompt_file=path)
    await run_served(made.applied(spec), good(), variant_options=made.words())
    path.unlink()
    kept = options_of_variant(spec, VariantOptions())
    with pytest.raises(ConfigError) as raised:
        kept.applied(spec)
    said = str(raised.value)
    assert said.startswith(
        f"variant v2 was made with --prompt-file '{tmp_path / 'careful prompt.yaml'}' (kept"
    )
    assert "cannot read it" in said and said.endswith("give --model or --prompt-file to run it with others")


def test_failure_classes_alone_are_retried_with_the_backlog_as_with_retry_failed() -> None:
    """``RunOptions(retry_classes=...)`` without ``retry_failed`` was a plain run: the classes named
    were never retried."""
    truncated = frozenset({FailureClass.TRUNCATED})
    alone = RunOptions(retry_classes=truncated)
    assert alone.selection == RunOptions(retry_failed=True, retry_classes=truncated).selection
    assert alone.retry == {FailureClass.TRANSIENT, FailureClass.TRUNCATED} and not alone.only_failed
