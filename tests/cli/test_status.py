"""``pipeline status`` as a person or a script reads it: a real process, its text and its JSON."""

from __future__ import annotations

from pathlib import Path

import duckdb
import orjson

from pipeline.servers.config import LOCAL_MODEL
from tests.support.jobs import make_source, write_job
from tests.support.outputs import job_with_outputs
from tests.support.processes import run_pipeline, sim_server


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
        f"(key source.table); load records with `pipeline load FILE --job {spec.source_file}`"
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
        f"stale:    12 (model 12; `pipeline run {job} --redo-stale` redoes them)\n"
        f"model:    12 results made by {LOCAL_MODEL} (the bundled model of --local), "
        "not by openai/gpt-oss-120b (the job's model)\n"
        f"          `pipeline status {job} --local` counts them as current; "
        f"`pipeline run {job} --redo-stale model` redoes them with openai/gpt-oss-120b\n"
    ) in plain.stdout
    for same in (["--local"], ["--model", LOCAL_MODEL]):
        judged = run_pipeline("status", str(job), *same)
        assert judged.returncode == 0 and "stale" not in judged.stdout and "model:" not in judged.stdout
        assert orjson.loads(run_pipeline("status", str(job), *same, "--json").stdout)["stale"]["total"] == 0
    report = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
    assert (report["models"], report["stale_models"]) == (["openai/gpt-oss-120b"], {LOCAL_MODEL: 12})
    kept = run_pipeline("run", str(job), "--endpoint", url)  # nothing to do: no request is sent
    assert f"`pipeline status {job}` says which model made them" in kept.stdout


def test_a_bad_model_override_is_one_line_and_exit_2(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    result = run_pipeline("status", str(job), "--model", "")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "key 'model'" in result.stderr
