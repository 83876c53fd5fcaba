"""`pipeline run --local`, killed with kill -9 once the server is up, leaves no server process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.jobs import linkedin_job
from tests.support.local_vllm import group_members, require_local_vllm, wait_gone
from tests.support.processes import REPO, pipeline_command, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.local_vllm]


def test_kill_9_of_run_local_leaves_no_server(tmp_path: Path) -> None:
    require_local_vllm()
    spec = linkedin_job(tmp_path / "sample.duckdb")
    spec["schema"] = "schemas.linkedin:JobPosting"
    job = tmp_path / "sample.yaml"
    job.write_text(yaml.safe_dump(spec))
    run = subprocess.Popen(
        pipeline_command("run", str(job), "--local", "--log-format", "json"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=REPO,
    )
    assert run.stderr is not None
    server_pid = None
    for line in run.stderr:
        event = json.loads(line)
        if event["event"] == "starting local server":
            server_pid = int(event["pid"])
        if event["event"] == "local server ready":
            break
    else:
        pytest.fail(f"the local server never became ready (exit code {run.wait()})")
    assert server_pid is not None and len(group_members(server_pid)) >= 3  # API server, engine core, worker
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    wait_gone(server_pid)
