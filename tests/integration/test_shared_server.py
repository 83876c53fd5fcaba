"""Two jobs with `concurrency: auto` on one simulator process whose KV cache holds few of their requests:
on one machine they take their requests from one pool (pipeline.servers.lease): the first hosts it and
searches for both, the second takes its part of the same limit, and both finish."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.logged_run import json_log_lines as events
from tests.support.processes import pipeline_command, sim_process, subprocess_env

pytestmark = pytest.mark.integration

RECORDS = 300  # runs of a few seconds each


def test_two_auto_jobs_on_one_machine_share_one_limit_on_their_server(tmp_path: Path) -> None:
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
    said = [events(stderr) for stderr in outputs]
    hosts = [any(str(e.get("event")).endswith("this job hosts it") for e in job) for job in said]
    assert hosts.count(True) == 1, said
    host, member = (said[0], said[1]) if hosts[0] else (said[1], said[0])
    (joined,) = [e for e in member if "takes its part of the limit" in str(e.get("event"))]
    assert joined["jobs"] == 2 and 0 <= joined["part"] <= joined["limit"]
    # One search: the pool's changes the member heard are the ones the host made
    made = {(e["old"], e["new"], e["reason"]) for e in host if e.get("event") == "concurrency limit changed"}
    heard = [
        (e["old"], e["new"], e["reason"]) for e in member if e.get("event") == "concurrency limit changed"
    ]
    assert made and heard and heard[0][2].split("; ")[0] in {reason for _, _, reason in made}
    assert not any(str(e.get("event", "")).startswith("concurrency auto starts where") for e in member)
    # The host ended first or last: a member left alone hosts the pool on, at the level they held
    took_over = [e for e in member if "its host is gone, this job hosts it now" in str(e.get("event"))]
    assert len(took_over) <= 1
