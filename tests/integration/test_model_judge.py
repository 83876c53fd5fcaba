"""The model judge end to end: a real run's results in a real DuckDB file, judged over HTTP by the
simulator (a server process on 127.0.0.1), which answers a valid instance of the JSON schema each request
sends: its verdicts are random, but there is exactly one for every value."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from pipeline.job.commands import command
from pipeline.job.spec import load_job
from pipeline.judging.model import judge_sample_by_model
from pipeline.quality.fields import schema_fields
from pipeline.quality.judgments import values_to_judge
from pipeline.reports.reading import Sample
from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.processes import run_pipeline, sim_metric, sim_server

pytestmark = pytest.mark.integration

RECORDS = 400
EXTRACTED = 300  # the run's sample: the judge's samples of 100 and 300 are inside it
CONCURRENCY = 64


def test_a_sample_of_a_real_runs_results_is_judged_value_by_value(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, RECORDS)
    with sim_server("--model", "test-model", "--latency", "0.2", "--jitter", "0.5", "--seed", "5") as url:
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": url},
            concurrency=CONCURRENCY,
            request_timeout_s=60,
            max_tokens=2048,
            schema="schemas.linkedin:JobPosting",
        )
        run = run_pipeline("run", str(job), "--sample", str(EXTRACTED), timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        spec = load_job(job)
        first = judge_sample_by_model(spec, ["main"], Sample(100))
        requests_before = sim_metric(url, "pipeline_sim:requests_total")
        second = judge_sample_by_model(spec, ["main"], Sample(EXTRACTED))
        requests = sim_metric(url, "pipeline_sim:requests_total") - requests_before
        # the command: everything judged already, so nothing is sent
        again = run_pipeline("judge", str(job), "--by-model", "--sample", str(EXTRACTED))
        assert sim_metric(url, "pipeline_sim:requests_total") - requests_before == requests
    print(
        f"\njudged {second.values} values of {second.judged} records at c={CONCURRENCY} in "
        f"{second.seconds:.1f} s: {second.values_per_s:.0f} values/s"
    )
    assert (first.records, first.judged, first.failed, first.judge) == (100, 100, (), "model:test-model")
    assert (second.records, second.skipped, second.judged, second.failed) == (EXTRACTED, 100, 200, ())
    assert second.requests == requests == 200  # one request per record, none for those judged before
    assert again.returncode == 0, again.stderr[-2000:]
    assert (
        f"model:test-model judged 0 of {EXTRACTED} records (0 values); {EXTRACTED} judged before"
        in again.stdout
    )
    assert f"next:  {command('eval', str(job), '--judged')}" in again.stdout  # pasted anywhere
    assert 0 < second.correct < second.values

    expected: Counter[tuple[str, str, str]] = Counter()
    fields = schema_fields(spec.schema_class)
    for record_id, extracted in table_rows(database, "SELECT record_id, extracted FROM results"):
        for value in values_to_judge(fields, orjson.loads(extracted)):
            expected[(str(record_id), value.field, value.value)] += 1
    judged = Counter(
        (str(record_id), field, value)
        for record_id, field, value in table_rows(database, "SELECT record_id, field, value FROM judgments")
    )
    assert judged == expected  # every value of every result, exactly once
    assert sum(judged.values()) == first.values + second.values
    assert table_rows(database, "SELECT DISTINCT judge, variant FROM judgments") == [
        ("model:test-model", "main")
    ]
    verdicts = dict(table_rows(database, "SELECT verdict, count(*) FROM judgments GROUP BY ALL"))
    assert set(verdicts) == {"correct", "wrong"}
    assert verdicts["correct"] == first.correct + second.correct


def test_judge_model_and_endpoint_send_the_judging_to_another_server_than_the_jobs(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, 60)
    with (
        sim_server("--model", "test-model", "--seed", "5") as job_server,
        sim_server("--model", "judge-model", "--seed", "6") as judge_server,
    ):
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": job_server},
            max_tokens=2048,
            schema="schemas.linkedin:JobPosting",
        )
        run = run_pipeline("run", str(job), "--sample", "20", timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        sent_to_job = sim_metric(job_server, "pipeline_sim:requests_total")
        judged = run_pipeline(
            "judge",
            str(job),
            "--judge-model",
            "judge-model",
            "--endpoint",
            judge_server,
            "--sample",
            "20",
            timeout=300,
        )
        assert judged.returncode == 0, judged.stderr[-2000:]
        assert sim_metric(job_server, "pipeline_sim:requests_total") == sent_to_job  # none to the job's
        assert sim_metric(judge_server, "pipeline_sim:requests_total") == 20  # one a record
    assert judged.stdout.startswith("model:judge-model judged 20 of 20 records (")
    assert table_rows(database, "SELECT DISTINCT judge FROM judgments") == [("model:judge-model",)]
