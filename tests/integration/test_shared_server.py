"""Two jobs with `concurrency: auto` on one simulator process whose KV cache holds few of their requests:
each starts where its requests fit, takes the other's requests on the server as taken, and both finish
without their limits together overshooting the fit; the one left alone takes the server back."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.logged_run import json_log_lines as events
from tests.support.processes import pipeline_command, sim_process, subprocess_env

pytestmark = pytest.mark.integration

RECORDS = 300  # runs of a few seconds each: a share takes two scrapes (2 s)


def test_two_auto_jobs_share_one_server_and_neither_overshoots_the_fit(tmp_path: Path) -> None:
    # 40,000 KV tokens: ~40 of these requests at max_tokens 512, more once their answers are measured
    args = ("--model", "test-model", "--profile", "gpt-oss-120b", "--speed", "20", "--kv-tokens", "40000")
    with sim_process(*args) as sim:
        children = []
        for name in ("first", "second"):
            folder = tmp_path / name
            folder.mkdir()
            build_postings(folder / "postings.duckdb", RECORDS)
            job = write_job(
                folder,
                name=name,
                database="postings.duckdb",
                endpoint={"base_url": sim.url},
                concurrency="auto",
                max_concurrency=256,
                max_tokens=512,
                request_timeout_s=120,
            )
            command = pipeline_command("run", str(job), "--log-format", "json")
            child = subprocess.Popen(
                command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=subprocess_env()
            )
            children.append(child)
        outputs = [child.communicate(timeout=60)[1] for child in children]
    for child, stderr in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr[-2000:]
    for name in ("first", "second"):
        assert table_rows(tmp_path / name / "postings.duckdb", "SELECT count(*) FROM results") == [(RECORDS,)]
    fits, timelines, ends = [], [], []
    for stderr in outputs:
        said = events(stderr)
        started = [e for e in said if str(e.get("event", "")).startswith("concurrency auto starts where")]
        assert len(started) == 1, said[-5:]
        fit = int(started[0]["fit"])  # a job starting beside the other starts at its part of it
        changes = [e for e in said if e.get("event") == "concurrency limit changed"]
        # A job that joins the other starts at its share, below the fit its share reasons name.
        reasons = " ".join(e["reason"] for e in changes)
        measured = re.findall(r"(\d+) requests of this job fit|on a server where (\d+) fit", reasons)
        fits.append(max([fit, *(int(number) for pair in measured for number in pair if number)]))
        start = (moment(started[0]), int(started[0]["event"].rsplit(" ", 1)[1]))
        timelines.append([start, *((moment(e), int(e["new"])) for e in changes)])
        ends.append(max(moment(e) for e in said if "timestamp" in e))
    # One search for both: the one that came second holds what the first holds (pipeline.servers.peers)
    said_by = [" ".join(str(e.get("reason", "")) for e in events(stderr)) for stderr in outputs]
    assert [("came to the server first holds" in said) for said in said_by].count(True) == 1, said_by
    # One fit on one server: the job that follows the other's level (it came second) counts none itself
    for timeline in timelines:
        assert all(level <= max(fits) * 1.1 for _, level in timeline), (fits, timeline)
    # Both started at the fit, or at their part of it when each saw the other start; three scrapes after
    # both started (a share takes two), while both still run, they hold what the server holds, not each
    # the fit (twice it). Each share is reckoned from a scrape that lags the other job's count by the
    # replies between them, so the two may hold a little more than the fit (45 + 45 of 80 on a loaded
    # machine). Later the one that sends on takes what the other's last requests leave as they drain.
    settled = max(timeline[0][0] for timeline in timelines) + 3.0
    assert settled < min(ends), (settled, ends)
    held = [max((at, level) for at, level in timeline if at <= settled)[1] for timeline in timelines]
    assert max(fits) / 4 <= sum(held) <= 1.2 * max(fits), (fits, held)


def moment(event: dict[str, object]) -> float:
    """When a JSON log line was written, in seconds."""
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()
