"""`pipeline failures`: counts per class, a few one-line examples each, and how to retry them."""

from __future__ import annotations

import shlex
from pathlib import Path

import duckdb
import orjson
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.errors import PERMANENT_FAILURE_CLASSES, ConfigError, DatabaseLockedError, FailureClass
from pipeline.job.commands import command, program
from pipeline.reports.failures import (
    ADVICE,
    MESSAGE_CHARS,
    RAW_OUTPUT_CHARS,
    failure_report,
    parse_failure_classes,
)
from tests.support.fakes import ScriptedServer, completion, respond
from tests.support.jobs import make_job
from tests.support.outputs import (
    database_held_by_another_process,
    job_with_outputs,
    run_scripted,
)
from tests.support.runs import run_served

EXPECTED_COUNTS = [("invalid_json", 3), ("schema_invalid", 2), ("permanent", 1), ("truncated", 1)]


def failures_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["failures", *args])
    return result.exit_code, result.stdout, result.stderr


def test_report_counts_every_class_largest_first_with_one_line_examples(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    report = failure_report(spec)
    assert [(summary.failure_class, summary.count) for summary in report.classes] == EXPECTED_COUNTS
    assert report.total == 7 and report.table == "failures" and report.database == str(spec.database)
    by_class = {summary.failure_class: summary.examples for summary in report.classes}
    assert sorted(example.record_id for example in by_class["invalid_json"]) == [1, 2, 3]
    invalid = by_class["invalid_json"][0]
    assert invalid.attempts == 1 and invalid.message.startswith("not valid JSON")
    # The raw reply had blank lines and 500 more characters: one line, cut, marked as cut.
    assert invalid.raw_output is not None and invalid.raw_output.startswith("first line not JSON at all xxx")
    assert len(invalid.raw_output) == RAW_OUTPUT_CHARS and invalid.raw_output.endswith("…")
    (permanent,) = by_class["permanent"]
    assert permanent.record_id == 7 and permanent.raw_output is None
    assert permanent.message == "HTTP 400: the prompt is longer than the context window"
    (truncated,) = by_class["truncated"]
    assert truncated.raw_output == '{"title": "Da'
    assert len(truncated.message) <= MESSAGE_CHARS and "\n" not in truncated.message


def test_report_filters_classes_and_limits_examples(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    report = failure_report(spec, [FailureClass.TRUNCATED, FailureClass.SCHEMA_INVALID], examples=1)
    assert [(summary.failure_class, summary.count) for summary in report.classes] == [
        ("schema_invalid", 2),
        ("truncated", 1),
    ]
    assert [len(summary.examples) for summary in report.classes] == [1, 1]
    assert report.classes[0].examples[0].record_id in (5, 6)
    assert all(not summary.examples for summary in failure_report(spec, examples=0).classes)
    assert failure_report(spec, [FailureClass.EMPTY]).classes == ()


def test_unknown_class_names_the_valid_ones() -> None:
    assert parse_failure_classes(["truncated", "empty"]) == [FailureClass.TRUNCATED, FailureClass.EMPTY]
    with pytest.raises(ConfigError, match="--class 'nope': unknown failure class; use one of invalid_json"):
        parse_failure_classes(["truncated", "nope"])
    only_permanent = PERMANENT_FAILURE_CLASSES  # what `run --retry-failed --class` takes
    with pytest.raises(
        ConfigError,
        match="^--class 'transient': not taken here; "
        "use one of invalid_json, schema_invalid, truncated, too_long, empty, permanent$",
    ):
        parse_failure_classes(["transient"], allowed=only_permanent)


def test_cli_prints_classes_examples_and_the_retry_command(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    job = str(spec.source_file)
    code, out, _ = failures_cli(job, "--examples", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"7 failures in {spec.database} (table failures)"
    assert [line for line in lines if line and not line.startswith(" ")][1:-1] == [
        "invalid_json: 3",
        "schema_invalid: 2",
        "permanent: 1",
        "truncated: 1",
    ]
    assert "  id 7 (1 attempt): HTTP 400: the prompt is longer than the context window" in lines
    assert "  … and 1 more" in lines  # invalid_json: 3, two shown
    assert sum(line.startswith("  id ") for line in lines) == 2 + 2 + 1 + 1
    assert all(len(line) < 260 for line in lines)
    # --only-failed: retrying the failures takes no new record (--retry-failed also starts the backlog)
    assert (
        lines[-1] == f"retry them (no new record is taken): {shlex.join(program())} run {job} --only-failed"
    )


def test_too_long_failures_say_what_to_do(tmp_path: Path) -> None:
    """Records whose prompt alone is past a context of 300 tokens (the job's max_model_len; the server
    cannot count), by their floor of one token a word: never sent, and `failures` says how to make
    them fit, then how to retry them."""
    spec = make_job(tmp_path, records=0, max_model_len=300)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            "CREATE TABLE postings AS SELECT i AS id, 'Title ' || i AS title, "
            "repeat('word ', 400) AS description FROM range(2) t(i)"
        )
    summary = run_scripted(spec)
    assert summary.failed == 2 and summary.numbers.attempts == 0
    code, out, _ = failures_cli(str(spec.source_file), "--class", "too_long")
    assert code == 0
    lines = out.splitlines()
    assert lines[2:4] == [
        "too_long: 2",
        f"  what to do: {ADVICE[FailureClass.TOO_LONG]}",
    ]
    assert ADVICE[FailureClass.TOO_LONG].startswith(
        "the prompt does not fit the model's context, or leaves too little of it for an answer (not sent, "
    )
    assert "against a context of 300 tokens (the server's max_model_len); most of it is field " in out
    code, out, _ = failures_cli(str(spec.source_file), "--json")
    assert orjson.loads(out)["classes"][0]["advice"] == ADVICE[FailureClass.TOO_LONG]


@pytest.mark.anyio
async def test_too_long_failures_of_answers_cut_off_at_the_context_are_not_said_unsent(
    tmp_path: Path,
) -> None:
    """The server counted the prompt (700 of a context of 1,000): it went with the 300 tokens left, below
    the job's max_tokens, and its answer was cut off there. It was sent; the advice said "not sent"."""
    spec = make_job(tmp_path, records=2, max_tokens=4096)
    cut = completion(
        '{"title": "Data Engin', finish_reason="length", completion_tokens=300, prompt_tokens=700
    )
    server = ScriptedServer([respond(cut)], max_model_len=1000, count_tokens=lambda messages: 700)
    summary = await run_served(spec, server)
    assert (summary.failed, summary.numbers.attempts) == (2, 2)  # sent, each once
    code, out, _ = failures_cli(str(spec.source_file), "--class", "too_long")
    lines = out.splitlines()
    assert code == 0 and lines[3] == f"  what to do: {ADVICE[FailureClass.TOO_LONG]}"
    assert "sent and its answer cut off where the context ends" in lines[3] and "not sent:" not in out
    message = orjson.loads(failures_cli(str(spec.source_file), "--json")[1])["classes"][0]["examples"][0]
    assert message["message"].startswith(
        "the prompt leaves too little of the context for an answer: 700 tokens of a context of 1000 tokens "
        "(the server's max_model_len) leaves 300 tokens for the answer, and the answer was cut off there "
        "(300 completion tokens, 10 of them reasoning, finish_reason=length), short of the job's max_tokens "
        "4,096"
    )


def test_too_long_failures_of_a_fixed_part_that_leaves_no_room_say_chunking_cannot_help(
    tmp_path: Path,
) -> None:
    """A context of 20 tokens: the system prompt alone fills it, so no chunk of a record would fit."""
    spec = make_job(tmp_path, records=2, max_model_len=20)
    summary = run_scripted(spec)
    assert summary.failed == 2 and summary.numbers.attempts == 0
    code, out, _ = failures_cli(str(spec.source_file), "--class", "too_long")
    assert code == 0
    assert out.splitlines()[3] == (
        "  what to do: the fixed part of the prompt (system prompt, examples, template), sent with every "
        "record, leaves no room for one and its answer, so chunking cannot help: shorten the system prompt "
        "or the examples, or use a larger context (the server's --max-model-len); then retry them "
        "(`--only-failed --class too_long`)"
    )
    assert "against a context of 20 tokens (the server's max_model_len), and chunking cannot help" in out


def test_cli_retry_command_keeps_the_database_override(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    trial = tmp_path / "trial copy.duckdb"
    trial.write_bytes(spec.database.read_bytes())
    code, out, _ = failures_cli(str(spec.source_file), "--class", "truncated", "--database", str(trial))
    assert code == 0 and out.startswith(f"1 failure in {trial}")
    assert out.splitlines()[-1].endswith(f"--only-failed --class truncated --database '{trial}'")


def test_cli_a_variant_the_job_does_not_know_is_one_line_naming_those_it_does(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    code, out, err = failures_cli(str(spec.source_file), "--variant", "nosuch")
    assert code == 2 and not out
    assert err == (
        f"error: --variant 'nosuch': {spec.source_file} declares no such variant and {spec.database} holds "
        "nothing of it; known variants: main\n"
    )


def test_cli_json_is_one_object(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    code, out, _ = failures_cli(
        str(spec.source_file), "--json", "--class", "permanent", "--class", "truncated"
    )
    assert code == 0 and len(out.splitlines()) == 1
    report = orjson.loads(out)
    assert report["total"] == 2 and report["database"] == str(spec.database)
    assert [(c["failure_class"], c["count"]) for c in report["classes"]] == [
        ("permanent", 1),
        ("truncated", 1),
    ]
    assert report["classes"][0]["examples"] == [
        {
            "record_id": 7,
            "attempts": 1,
            "message": "HTTP 400: the prompt is longer than the context window",
            "raw_output": None,
        }
    ]


def test_cli_unknown_class_is_a_one_line_error(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    code, out, err = failures_cli(str(spec.source_file), "--class", "timeout")
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "error: --class 'timeout': unknown failure class; use one of "
        "invalid_json, schema_invalid, truncated, too_long, empty, transient, permanent"
    ]


def test_cli_says_when_there_are_no_failures(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=1)  # record 0 gets a good answer
    assert run_scripted(spec).done == 1
    code, out, _ = failures_cli(str(spec.source_file))
    assert (code, out) == (0, f"no failures in {spec.database} (table failures)\n")
    code, out, _ = failures_cli(str(spec.source_file), "--class", "empty", "--json")
    assert code == 0 and orjson.loads(out)["classes"] == []


def test_cli_filtered_to_a_class_that_did_not_fail(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    code, out, _ = failures_cli(str(spec.source_file), "--class", "empty", "--class", "transient")
    assert (code, out) == (0, f"no failures of class empty, transient in {spec.database} (table failures)\n")


def test_missing_database_or_tables_exit_2(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    code, _, err = failures_cli(str(spec.source_file))
    assert code == 2 and len(err.splitlines()) == 1 and "does not exist yet" in err
    make_job(tmp_path, records=3)  # the source is loaded, but nothing has run
    code, _, err = failures_cli(str(spec.source_file))
    assert code == 2 and err.splitlines() == [
        f"error: {spec.database}: no table 'failures' yet; nothing has been extracted "
        f"(run `{command('run', str(spec.source_file))}` first)"
    ]


@pytest.mark.process
def test_a_database_held_by_another_process_exits_3(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    with database_held_by_another_process(spec.database):
        with pytest.raises(DatabaseLockedError):
            failure_report(spec)
        code, out, err = failures_cli(str(spec.source_file))
    assert code == 3 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {spec.database}: ")
    assert failure_report(spec).total == 7  # once the run has ended


def test_json_gives_whole_messages_the_text_one_line_each(tmp_path: Path) -> None:
    """A script reads the message a failure was stored with, not the text's 200-character line."""
    spec = job_with_outputs(tmp_path)
    message = "HTTP 400: This model's maximum context length is 2048 tokens.\n" + "However, " * 60
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE failures SET message = ? WHERE record_id = 7", [message])
    (permanent,) = failure_report(spec, [FailureClass.PERMANENT]).to_json()["classes"]
    assert permanent["examples"][0]["message"] == message
    code, out, _ = failures_cli(str(spec.source_file), "--json", "--class", "permanent")
    assert code == 0 and orjson.loads(out)["classes"][0]["examples"][0]["message"] == message
    code, out, _ = failures_cli(str(spec.source_file), "--class", "permanent")
    (line,) = [line for line in out.splitlines() if line.startswith("  id 7 ")]
    assert line.endswith("…") and len(line) < MESSAGE_CHARS + 30
