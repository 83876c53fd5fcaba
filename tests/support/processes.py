"""Real server processes on 127.0.0.1 for CLI and integration tests; they always stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parents[2]


def pipeline_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("PIPELINE_BASE_URL", None)
    env.pop("PIPELINE_MODEL", None)
    return env


@contextmanager
def sim_server(*args: str) -> Iterator[str]:
    """Start `pipeline sim --port 0 ARGS` and yield its base URL (…/v1)."""
    process = subprocess.Popen(
        pipeline_command("sim", "--port", "0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if " at http://" not in line:
            raise RuntimeError(f"the simulator did not start: {line}{process.stdout.read()}")
        yield line.rsplit(" at ", 1)[1].strip()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def sim_metric(url: str, name: str) -> float:
    """One value from the simulator's /metrics (Prometheus text), e.g. ``pipeline_sim:requests_total``."""
    text = httpx2.get(url.removesuffix("/v1") + "/metrics").text
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.]+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))
