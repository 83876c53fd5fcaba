"""``pipeline status`` as a person or a script reads it: a real process, its text and its JSON."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import duckdb
import orjson
import pytest

from pipeline.job.commands import program
from pipeline.servers.config import LOCAL_MODEL
from pipeline.store.opening import prepare_database
from pipeline.store.read_copy import write_copy
from pipeline.store.snapshot import write_snapshot
from tests.support.jobs import make_source, write_job
from tests.support.outputs import database_held_by_another_process, job_with_outputs
from tests.support.processes import run_pipeline, sim_server

pytestmark = pytest.mark.process  # `pipeline status` in a child process

PROGRAM = shlex.join(program())  # how a hint names the pipeline program


def test_a_missing_source_table_is_one_plain_line_and_no_nulls(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("DROP TABLE postings")
    text = run_pipeline("status", str(spec.source_file))
    assert text.returncode == 0, text.stderr
    assert "None" not in text.stdout and "ETA" not in text.stdout
    lines = text.stdout.splitlines()
    assert lines[1] == (
        f"source:   {spec.source_file}: source in {spec.database}: table 'postings' does not exist "
        f"(key source.table); load records with `{PROGRAM} load FILE --job {spec.source_file}`"
    )
    assert lines[2].startswith("results:  5 stored")
    assert lines[3] == "failed:   7 (invalid_json 3, permanent 1, schema_invalid 2, truncated 1)"
    report = orjson.loads(run_pipeline("status", str(spec.source_file), "--json").stdout)
    assert "table 'postings' does not exist" in report["source_problem"]
    assert report["results"] == 5 and sum(report["failed"].values()) == 7
    assert not {"source_records", "done", "pending", "stale", "eta_s"} & set(report)


def test_results_of_the_bundled_model_say_so_and_the_same_override_counts_them_current(
    tmp_path: Path,
) -> None:
    job = write_job(tmp_path, model="openai/gpt-oss-120b")
    make_source(tmp_path / "test.duckdb", 12)
    with sim_server("--model", LOCAL_MODEL) as url:
        made = run_pipeline("run", str(job), "--endpoint", url, "--model", LOCAL_MODEL)
    assert made.returncode == 0, made.stderr
    plain = run_pipeline("status", str(job))
    assert plain.returncode == 0, plain.stderr
    assert (
        f"stale:    12 (model 12; a plain run keeps them, `{PROGRAM} run {job} --redo-stale` redoes them)\n"
        f"model:    12 results made by {LOCAL_MODEL} (the bundled model of --local), "
        "not by openai/gpt-oss-120b (the job's model)\n"
        f"          `{PROGRAM} status {job} --local` counts them as current; "
        f"`{PROGRAM} run {job} --redo-stale model` redoes them with openai/gpt-oss-120b\n"
    ) in plain.stdout
    for same in (["--local"], ["--model", LOCAL_MODEL]):
        judged = run_pipeline("status", str(job), *same)
        assert judged.returncode == 0 and "stale" not in judged.stdout and "model:" not in judged.stdout
        assert orjson.loads(run_pipeline("status", str(job), *same, "--json").stdout)["stale"]["total"] == 0
    report = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
    assert (report["models"], report["stale_models"]) == (["openai/gpt-oss-120b"], {LOCAL_MODEL: 12})
    with sim_server("--model", "openai/gpt-oss-120b") as url:  # nothing to do: its model list only
        kept = run_pipeline("run", str(job), "--endpoint", url)
    assert f"`{PROGRAM} status {job}` says which model made them" in kept.stdout


def test_a_bad_model_override_is_one_line_and_exit_2(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    result = run_pipeline("status", str(job), "--model", "")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "key 'model'" in result.stderr


def test_each_record_is_counted_once_and_the_json_holds_numbers(tmp_path: Path) -> None:
    """A transient failure is pending (a plain run retries it), not failed too: the lines add up to the
    records. The last run's profile and series are JSON values, not JSON in a string."""
    spec = job_with_outputs(tmp_path)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE failures SET failure_class = 'transient' WHERE record_id = 1")
    text = run_pipeline("status", str(spec.source_file))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1:5] == [
        "records:  12",
        "done:     5",
        "failed:   6 (invalid_json 2, permanent 1, schema_invalid 2, truncated 1)",
        "pending:  1 (1 failure to retry: transient 1)",
    ]
    report = orjson.loads(run_pipeline("status", str(spec.source_file), "--json").stdout)
    assert report["done"] + sum(report["failed"].values()) + report["pending"] == report["source_records"]
    assert report["pending_retried"] == {"transient": 1} and report["pending_new"] == 0
    assert report["last_run"]["profile"]["records"] == 5 and report["last_run"]["series"][-1]["done"] == 5


def test_during_a_run_the_counts_are_the_copys_and_say_as_of_when(tmp_path: Path) -> None:
    """Before, the run's live done (11) stood beside the copy's (5) and the last run's: three numbers
    for one thing, taken at different moments."""
    spec = job_with_outputs(tmp_path)
    connection = prepare_database(spec)
    try:
        connection.execute("UPDATE runs SET status = 'running', ended_at = NULL")
        write_copy(connection, spec, 1)
    finally:
        connection.close()
    live: dict[str, float] = {"done": 11, "failed": 9, "in_flight": 4, "remaining": 1, "eta_s": 90}
    rates = {"records_per_min": 60.0, "output_tokens_per_s": 21.5}
    write_snapshot(spec.database, 1, live | rates, "running")
    with database_held_by_another_process(spec.database, as_run=True):
        text = run_pipeline("status", str(spec.source_file))
        report = orjson.loads(run_pipeline("status", str(spec.source_file), "--json").stdout)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1].startswith("copy:     as of ") and "run #1 in progress" in lines[1]
    assert lines[2:4] == ["records:  12", "done:     5"]
    assert lines[-2].startswith("last run: #1 running") and "5 done, 7 failed" in lines[-2]
    assert "ETA" not in lines[-2]  # one ETA: the run's own
    assert re.fullmatch(
        r"now:      held by a running `pipeline run` \(pid \d+, run 1\), as of \d\d:\d\d:\d\d: "
        r"in flight 4, 60.0 records/min, 22 output tok/s, ETA 1:30",
        lines[-1],
    ), lines[-1]
    assert not re.search(r"\b(done|failed|remaining) (11|9|1)\b|\b(11|9) (done|failed)\b", text.stdout)
    assert report["done"] == 5 and report["read_copy"]["run_id"] == 1
    assert not {"done", "failed", "remaining"} & set(report["live"]) and report["eta_s"] == 90


def test_counts_are_said_with_their_thousands_separated(tmp_path: Path) -> None:
    """As every command says a count: `records: 2,499`, where status printed `records: 2499`."""
    job = write_job(tmp_path)
    make_source(tmp_path / "test.duckdb", 2499)
    text = run_pipeline("status", str(job))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1:5] == ["records:  2,499", "done:     0", "failed:   0", "pending:  2,499"]
    assert orjson.loads(run_pipeline("status", str(job), "--json").stdout)["pending"] == 2499  # a number
