"""Six nights of the LinkedIn job against the simulator, the sixth with a planted drift: what
`pipeline report` says, and the report page (optionally its screenshot).

    .venv/bin/python benchmarks/nightly_drift.py                           # 6 nights of 400 ads, ~4 min
    .venv/bin/python benchmarks/nightly_drift.py --screenshot docs/report-page.png

Each night is what a nightly job does, with the user's own commands: the real Adzuna ads of ../shared
loaded with `pipeline load` into a fresh database, then one `pipeline run jobs/linkedin.yaml --limit N`
of the next ads against a `pipeline sim` started for the night with its own seed and answer noise (a
real model's answers vary from run to run). Before the last night the simulator starts leaving
`salary` empty, as a site change or a model update would. Prints each night's summary line, then
`pipeline report`'s text; writes the report page. Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parent.parent
ADZUNA = REPO.parent / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"
PIPELINE = str(REPO / ".venv" / "bin" / "pipeline")
JOB = str(REPO / "jobs" / "linkedin.yaml")
MODEL = "openai/gpt-oss-120b"
RENAMES = ("Id=id", "Title=title", "FullDescription=description", "LocationRaw=location", "Company=company")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pipeline(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([PIPELINE, *args], capture_output=True, text=True, env=env, cwd=REPO)
    if check and done.returncode not in (0, 1):
        sys.exit(f"pipeline {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def night(number: int, args: argparse.Namespace, database: Path, env: dict[str, str]) -> str:
    """One night: a simulator with the night's seed (and the planted drift on the last), one run."""
    port = free_port()
    planted = ["--empty-field", args.drift_field] if number == args.nights else []
    sim = subprocess.Popen(
        [PIPELINE, "sim", "--port", str(port), "--model", MODEL, "--seed", str(number), "--latency",
         str(args.latency), "--jitter", "0.5", "--answer-noise", str(args.answer_noise), *planted],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health")
        night_env = {**env, "PIPELINE_BASE_URL": f"http://127.0.0.1:{port}/v1", "PIPELINE_MODEL": MODEL}
        run = pipeline(
            "run", JOB, "--database", str(database), "--limit", str(args.records), "--progress", "log",
            "--concurrency", args.concurrency, env=night_env,
        )  # fmt: skip
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    return "\n".join(line for line in run.stdout.splitlines() if line.startswith(("run ", "drift:")))


def wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx2.get(url, timeout=1).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"the simulator at {url} did not start")


def screenshot(page: Path, out: Path) -> None:
    """The page as Chromium shows it after its scripts ran (headless, no network)."""
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=5000", "--window-size=1280,1700", f"--screenshot={out.resolve()}",
         page.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nights", type=int, default=6)
    parser.add_argument("--records", type=int, default=400, help="new ads per night")
    parser.add_argument("--latency", type=float, default=1.0, help="the simulator's seconds per request")
    parser.add_argument(
        "--concurrency", default="auto", help="the run's --concurrency (auto: its limit is plotted)"
    )
    parser.add_argument("--answer-noise", type=float, default=0.05)
    parser.add_argument("--drift-field", default="salary", help="left empty on the last night")
    parser.add_argument("--html", type=Path, default=None, help="the report page (default: a temp file)")
    parser.add_argument("--screenshot", type=Path, default=None, help="a PNG of the report page")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as folder:
        database = Path(folder) / "linkedin.duckdb"
        renames = [item for rename in RENAMES for item in ("--rename", rename)]
        pipeline("load", str(ADZUNA), "--job", JOB, "--database", str(database), *renames, env=env)
        for number in range(1, args.nights + 1):
            print(f"night {number}: {night(number, args, database, env)}", flush=True)
        html = args.html or Path(folder) / "report.html"
        report = pipeline("report", JOB, "--database", str(database), "--html", str(html), env=env)
        print(report.stdout)
        if args.screenshot is not None:
            screenshot(html, args.screenshot)
            print(f"wrote {args.screenshot}")


if __name__ == "__main__":
    main()
