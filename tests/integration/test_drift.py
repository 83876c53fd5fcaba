"""Drift across nightly runs, end to end: runs of new records over HTTP to the simulator (with answer
noise, as a real server varies); then a field left empty, a server three times slower below one second,
or a one-record retry of a failure (not judged: no alert); a quiet night after a drift (kept as a run,
the metrics textfile written, the drift not mailed again); a server that got faster, or whose bad
answers were fixed (better: no alert)."""

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


def nightly(
    job: Path,
    url_port: int,
    *sim_args: str,
    seed: int,
    latency: float = 0.2,
    run_args: tuple[str, ...] = ("--limit", str(RECORDS_PER_RUN)),
) -> str:
    """One night: a simulator (its own seed: other noise), and a run of the next records."""
    with sim_process(
        "--model",
        "test-model",
        "--seed",
        str(seed),
        "--answer-noise",
        "0.05",
        "--latency",
        str(latency),
        *sim_args,
        port=url_port,
    ):
        done = run_pipeline("run", str(job), *run_args, "--progress", "log")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.stdout


SPEEDS = ("records_per_min", "latency_p50", "latency_p90")


def worse_but_speed(out: str) -> list[str]:
    """The alerting drifts a night's run printed, its speed aside: a run of seconds on a faulty server
    lasts as long as its last record's retries wait, which a random backoff draws anew each night."""
    lines = [line.removeprefix("drift:").strip() for line in out.splitlines() if line.startswith("drift:")]
    entries = [entry for line in lines for entry in line.split("; ") if not entry.startswith("beyond ")]
    return [entry for entry in entries if not entry.endswith("(better)") and not entry.startswith(SPEEDS)]


def postings_job(tmp_path: Path, records: int) -> tuple[Path, int]:
    """A job on ``records`` postings whose endpoint is a port every night's simulator listens on."""
    build_postings(tmp_path / "postings.duckdb", records)
    port = free_port()
    job = write_job(
        tmp_path,
        database="postings.duckdb",
        endpoint={"base_url": f"http://127.0.0.1:{port}/v1"},
        concurrency=24,  # 120 records at 0.2 s: the server sets the pace, so speed holds still
        schema="schemas.linkedin:JobPosting",
        max_tokens=2048,
    )
    return job, port


def test_runs_with_ordinary_noise_flag_nothing_and_an_emptied_field_is_flagged_alone(tmp_path: Path) -> None:
    job, port = postings_job(tmp_path, 7 * RECORDS_PER_RUN)
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
    (heading,) = [line for line in lines if line.startswith("drift in run 6 ")]
    assert heading.endswith(" UTC):") and " against runs 1-5 (" in heading, heading
    assert any(line.strip().startswith("salary fill_rate 1.00 -> 0.00 (down; allowed ±") for line in lines)

    # Night 7: the server answers in 0.7 s instead of 0.2 (issue 22: 0.30 -> 1.00 s went unseen). The run
    # names its database: the report it suggests must read the same one.
    database = str(tmp_path / "postings.duckdb")
    limit = ("--limit", str(RECORDS_PER_RUN), "--database", database)
    out = nightly(job, port, seed=7, latency=0.7, run_args=limit)
    (line,) = [line for line in out.splitlines() if line.startswith("drift:")]
    assert "latency_p50 0.2" in line and "latency_p90" in line and "(worse)" in line, line
    assert "beyond the usual run-to-run variation of runs 1-6 (" in line, line
    assert f"report {job} --database {database}`)" in line, line
    slower = orjson.loads(run_pipeline("report", str(job), "--json").stdout)["drift"]
    assert {entry["field"] for entry in slower} == {"(run)"}
    assert {"latency_p50", "latency_p90"} <= {entry["measure"] for entry in slower}


def test_a_one_record_retry_after_ordinary_nights_is_not_judged(tmp_path: Path) -> None:
    """Issue 22: `--only-failed` of one record flagged `benefits mean_length 2.42 -> 4.00`, and the
    cron line of docs/running.md (`report --fail-on-drift`) mailed after every small retry."""
    job, port = postings_job(tmp_path, 4 * RECORDS_PER_RUN)
    broken = nightly(job, port, "--fault-schema-invalid", "1", seed=0, run_args=("--limit", "1"))
    assert "run 1 completed_with_failures: 0 done, 1 failed of 1" in broken
    for night in range(2, 5):
        out = nightly(job, port, seed=night)
        assert f"run {night} completed: {RECORDS_PER_RUN} done" in out and "drift:" not in out, out
    retry = nightly(job, port, seed=5, run_args=("--only-failed",))
    assert "run 5 completed: 1 done, 0 failed of 1" in retry and "drift:" not in retry, retry
    report = run_pipeline("report", str(job), "--fail-on-drift")
    assert report.returncode == 0, report.stdout + report.stderr
    assert (
        f"not judged: run 5 retried earlier failures (1 of its 1 record, against the usual {RECORDS_PER_RUN} "
        "new ones); a retry is not a sample of the usual input"
    ) in report.stdout.splitlines()
    data = orjson.loads(run_pipeline("report", str(job), "--json").stdout)
    assert data["drift"] == [] and data["not_judged"]["reason"] == "retried"
    # Run 1, whose one record failed, keeps a profile too (its failure rate is judged).
    assert [(run["run_id"], run["retried"]) for run in data["runs"]] == [
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (5, 1),
    ]


def test_a_quiet_night_after_a_drift_writes_the_metrics_and_does_not_alert_again(tmp_path: Path) -> None:
    """Issue 29: a night with nothing to do wrote no `--metrics-textfile` (the staleness alert of
    docs/running.md fired) and `report --fail-on-drift` mailed the last drift again."""
    job, port = postings_job(tmp_path, 5 * RECORDS_PER_RUN)
    for night in range(1, 5):
        assert "drift:" not in nightly(job, port, seed=night)
    drifted = nightly(job, port, "--empty-field", "salary", seed=5)
    assert any(
        line.startswith("drift:    salary fill_rate 1.00 -> 0.00 (down)") for line in drifted.splitlines()
    )
    assert run_pipeline("report", str(job), "--fail-on-drift").returncode == 1  # mailed once

    textfile = tmp_path / "pipeline.prom"
    with sim_process("--model", "test-model", port=port):  # the night's server, asked its model list only
        quiet = run_pipeline("run", str(job), "--metrics-textfile", str(textfile), "--progress", "log")
    assert quiet.returncode == 0 and quiet.stdout.startswith("nothing to do: every record is done"), (
        quiet.stdout + quiet.stderr
    )
    metrics = textfile.read_text()
    assert (
        'pipeline_run_active{job="test"} 0.0' in metrics
        and 'pipeline_records_pending{job="test"} 0.0' in metrics
    )
    report = run_pipeline("report", str(job), "--fail-on-drift")
    assert report.returncode == 0, report.stdout + report.stderr
    (line,) = [line for line in report.stdout.splitlines() if line.startswith("not judged: run 6 (")]
    assert line.endswith(
        "had nothing to do; only the newest run is judged, so what the runs before it drifted is not "
        "said again"
    )
    data = orjson.loads(run_pipeline("report", str(job), "--json").stdout)
    assert (data["not_judged"]["reason"], data["drift"], data["fails"]) == ("nothing_to_do", [], False)
    assert [run["run_id"] for run in data["runs"]] == [1, 2, 3, 4, 5]
    status = orjson.loads(run_pipeline("status", str(job), "--json").stdout)
    assert (status["last_run"]["run_id"], status["last_run"]["status"]) == (5, "completed")


def test_a_faster_server_is_reported_better_and_does_not_alert(tmp_path: Path) -> None:
    """Issue 29: records/min up 9x was a drift that `--fail-on-drift` mailed."""
    job, port = postings_job(tmp_path, 5 * RECORDS_PER_RUN)
    for night in range(1, 5):
        assert "drift:" not in nightly(job, port, seed=night, latency=0.5)
    faster = nightly(job, port, seed=5, latency=0.05)
    (line,) = [line for line in faster.splitlines() if line.startswith("better:")]
    assert "latency_p50 0.5" in line and "(better)" in line and "(worse)" not in line, line
    report = run_pipeline("report", str(job), "--fail-on-drift", "--json")
    assert report.returncode == 0, report.stdout + report.stderr
    data = orjson.loads(report.stdout)
    assert data["drift"] and {entry["change"] for entry in data["drift"]} == {"better"}
    assert data["fails"] is False and data["against"].startswith("runs 1-4 (")


def test_a_server_whose_bad_answers_were_fixed_is_reported_better_and_does_not_alert(tmp_path: Path) -> None:
    """Four nights of a server answering half its requests with invalid JSON (and some with a 500),
    then one without: `--fail-on-drift` exited 1 on `tokens_prompt 5,332 -> 3,150 (down; allowed
    ±2,011)`, the fall of the re-asks' prompt tokens per done record read as a changed input."""
    job, port = postings_job(tmp_path, 5 * RECORDS_PER_RUN)
    faults = ("--fault-invalid-json", "0.5", "--fault-server-error", "0.05")
    for night in range(1, 5):
        assert worse_but_speed(out := nightly(job, port, *faults, seed=night)) == [], out
    fixed = nightly(job, port, seed=5)
    assert "drift:" not in fixed, fixed
    report = run_pipeline("report", str(job), "--fail-on-drift", "--json")
    assert report.returncode == 0, report.stdout + report.stderr
    data = orjson.loads(report.stdout)
    changes = {entry["measure"]: entry["change"] for entry in data["drift"]}
    # Tokens fell beyond the noise on most seeds (prompt and output): whatever moved moved for the better.
    assert set(changes.values()) <= {"better"} and data["fails"] is False, changes
