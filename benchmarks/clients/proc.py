"""Reading a process (CPU, memory, children) from /proc and the simulator's /metrics; building the
benchmarks' source."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path


def server_metrics(base_url: str) -> dict[str, float]:
    """The simulator's Prometheus text, one value per metric name (labels dropped)."""
    root = base_url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name.split("{", 1)[0].removesuffix("_total")] = float(value)
    return values


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith(key)), 0)


def descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(children)
            stack.extend(children)
    return found


ADZUNA = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"


def build_source(database: Path, rows: int) -> None:
    """The benchmarks' source: ``rows`` postings, the real Adzuna ads from ../shared repeated under new
    ids (synthetic ones without them), built in a child process so this one stays small."""
    ads = ["--ads", str(ADZUNA)] if ADZUNA.is_file() else []
    command = [sys.executable, "-m", "pipeline.bench.datasets", str(database), str(rows), *ads]
    subprocess.run(command, check=True)
