"""Drift across nightly runs, end to end: six runs of new records over HTTP to the simulator (with
answer noise, as a real server varies), the sixth after the simulator starts leaving a field empty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.datasets import build_postings
from tests.support.jobs import write_job
from tests.support.processes import free_port, run_pipeline, sim_process

pytestmark = pytest.mark.integration

RECORDS_PER_RUN = 120


def nightly(job: Path, url_port: int, *sim_args: str, seed: int) -> str:
    """One night: a simulator (its own seed: other noise), and a run of the next records."""
    with sim_process(
        "--model",
        "test-model",
        "--seed",
        str(seed),
        "--answer-noise",
        "0.05",
        "--latency",
        "0.2",
        *sim_args,
        port=url_port,
    ):
        done = run_pipeline("run", str(job), "--limit", str(RECORDS_PER_RUN), "--progress", "log")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_runs_with_ordinary_noise_flag_nothing_and_an_emptied_field_is_flagged_alone(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, 6 * RECORDS_PER_RUN)
    port = free_port()  # every night's simulator on the same port, as the job's endpoint
    job = write_job(
        tmp_path,
        database="postings.duckdb",
        endpoint={"base_url": f"http://127.0.0.1:{port}/v1"},
        concurrency=24,  # 120 records at 0.2 s: the server sets the pace, so speed holds still
        schema="schemas.linkedin:JobPosting",
        max_tokens=2048,
    )
    for night in range(1, 6):
        out = nightly(job, port, seed=night)
        assert f"run {night} completed: {RECORDS_PER_RUN} done" in out and "drift:" not in out, out
    quiet = run_pipeline("report", str(job), "--json", "--fail-on-drift")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert orjson.loads(quiet.stdout)["drift"] == []

    out = nightly(job, port, "--empty-field", "salary", seed=6)
    (line,) = [line for line in out.splitlines() if line.startswith("drift:")]
    assert line.startswith("drift:    salary fill_rate 1.00 -> 0.00")

    html = tmp_path / "report.html"
    report = run_pipeline("report", str(job), "--json", "--fail-on-drift", "--html", str(html))
    assert report.returncode == 1  # --fail-on-drift: the nightly cron line alerts
    data: dict[str, Any] = orjson.loads(report.stdout)
    assert [run["run_id"] for run in data["runs"]] == [1, 2, 3, 4, 5, 6]  # newest last
    assert {(entry["field"], entry["measure"]) for entry in data["drift"]} == {("salary", "fill_rate")}
    (entry,) = data["drift"]
    assert (entry["before"], entry["now"], entry["run_id"]) == (1.0, 0.0, 6)
    assert data["runs"][-1]["fields"]["salary"]["fill_rate"] == 0.0
    assert data["series"]["run_id"] == 6 and data["series"]["points"][-1]["done"] == RECORDS_PER_RUN
    assert report.stderr.strip().endswith(f"wrote {html} (6 runs)")
    assert 'id="report-data"' in html.read_text()

    text = run_pipeline("report", str(job), "--runs", "3")
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[2].split()[:4] == ["run", "4", "5", "6"]
    assert "drift in run 6:" in lines and any(line.strip().startswith("salary fill_rate") for line in lines)
