"""gpt-oss under structured output may answer in the reasoning field with content null (vLLM issue
23694): against a real simulator process that does so, every record is done at its first request,
marked, counted at the run's end and in ``pipeline status``."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.support.jobs import make_source, table_rows, write_job
from tests.support.processes import run_pipeline, sim_metric, sim_server

pytestmark = pytest.mark.integration

RECORDS = 30


def test_answers_in_the_reasoning_are_recovered_not_failed_nor_asked_again(tmp_path: Path) -> None:
    make_source(tmp_path / "test.duckdb", RECORDS)
    with sim_server("--model", "test-model", "--answer-in-reasoning", "--seed", "5") as url:
        job = write_job(tmp_path, endpoint={"base_url": url}, max_tokens=1024)
        run = run_pipeline("run", str(job))
        requests = sim_metric(url, "pipeline_sim:requests_total")
    assert run.returncode == 0, run.stderr[-3000:]
    assert requests == RECORDS  # each answer taken as it came: none re-asked, none retried
    assert f"{RECORDS} answers recovered from reasoning" in run.stderr
    database = tmp_path / "test.duckdb"
    marked = table_rows(database, "SELECT answer_from_reasoning, count(*) FROM results GROUP BY ALL")
    assert marked == [(True, RECORDS)]
    assert table_rows(database, "SELECT count(*) FROM failures") == [(0,)]
    status = run_pipeline("status", str(job))
    assert f"note:     {RECORDS} answers recovered from reasoning (" in status.stdout, status.stdout
    report = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
    assert report["answers_from_reasoning"] == RECORDS and report["done"] == RECORDS
    # and the run's own count, in its row and its line
    assert table_rows(database, "SELECT answers_from_reasoning FROM runs") == [(RECORDS,)]
    assert report["last_run"]["answers_from_reasoning"] == RECORDS
    assert f", {RECORDS} answers from reasoning" in status.stdout, status.stdout
