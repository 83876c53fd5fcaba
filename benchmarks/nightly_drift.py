"""Nights of the LinkedIn job against the simulator, the last one changed: what `pipeline report` says,
whether `report --fail-on-drift` would alert, and the report page (optionally its screenshot).

    .venv/bin/python benchmarks/nightly_drift.py                           # 6 nights of 400 ads, ~3 min
    .venv/bin/python benchmarks/nightly_drift.py --screenshot docs/report-page.png
    .venv/bin/python benchmarks/nightly_drift.py --plant latency --latency 0.3 --slow-latency 1.0 \
        --records 120 --concurrency 24                                    # a slower server, short runs
    .venv/bin/python benchmarks/nightly_drift.py --plant retry             # then a one-record retry
    .venv/bin/python benchmarks/nightly_drift.py --plant faster --quiet    # faster, then a quiet night

Each night is what a nightly job does, with the user's own commands: the real Adzuna ads of ../shared
loaded with `pipeline load` into a fresh database, then one `pipeline run jobs/linkedin.yaml --limit N`
of the next ads against a `pipeline sim` started for the night with its own seed and answer noise (a
real model's answers vary from run to run). What changes on the last night (``--plant``):

* ``field``: the simulator leaves ``salary`` empty, as a site change or a model update would (drift);
* ``latency``: the simulator answers in ``--slow-latency`` seconds instead of ``--latency`` (drift);
* ``retry``: before the first night one record fails for good (a simulator that answers only
  schema-invalid JSON; a run of one record is too small to be anyone's baseline); the last run is
  `pipeline run --only-failed` retrying it, one record, against a healthy simulator (no drift: a
  retry is not the usual input);
* ``faster``: the simulator answers in a ninth of ``--latency`` (an improvement: reported as better,
  no alert).

``--quiet`` adds a night with nothing to do after the last (`pipeline run --only-failed --class
too_long`: no ad is too long for the simulator): it is kept as a run and writes the metrics textfile,
and the drift of the night before is not reported again.

Prints each night's summary line, then `pipeline report`'s text and `--fail-on-drift`'s exit code;
writes the report page. Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from support import PIPELINE, REPO, simulator

ADZUNA = REPO.parent / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"
JOB = str(REPO / "jobs" / "linkedin.yaml")
MODEL = "openai/gpt-oss-120b"
RENAMES = ("Id=id", "Title=title", "FullDescription=description", "LocationRaw=location", "Company=company")
PLANTS = ("field", "latency", "retry", "faster")


def pipeline(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*PIPELINE, *args], capture_output=True, text=True, env=env, cwd=REPO)
    if check and done.returncode not in (0, 1):
        sys.exit(f"pipeline {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


@contextlib.contextmanager
def night_server(
    seed: int, latency: float, args: argparse.Namespace, *extra: str
) -> Iterator[dict[str, str]]:
    """A simulator for one night; yields the environment that points `pipeline run` at it."""
    with simulator(
        "--model", MODEL, "--seed", str(seed), "--latency", str(latency), "--jitter", "0.5",
        "--answer-noise", str(args.answer_noise), *extra,
    ) as url:  # fmt: skip
        yield {"PIPELINE_BASE_URL": url, "PIPELINE_MODEL": MODEL}


def night(number: int, args: argparse.Namespace, database: Path, env: dict[str, str]) -> str:
    """One night: a simulator with the night's seed (and the plant on the last), one run."""
    last = number == args.nights
    latency = args.slow_latency if last and args.plant == "latency" else args.latency
    latency = latency / 9 if last and args.plant == "faster" else latency
    planted = ["--empty-field", args.drift_field] if last and args.plant == "field" else []
    selection = ["--limit", str(args.records)]
    if last and args.plant == "retry":
        selection = ["--only-failed"]
    with night_server(number, latency, args, *planted) as sim_env:
        run = pipeline(
            "run", JOB, "--database", str(database), *selection, "--progress", "log",
            "--concurrency", args.concurrency, env={**env, **sim_env},
        )  # fmt: skip
    return summary_lines(run.stdout)


def fail_one_record(args: argparse.Namespace, database: Path, env: dict[str, str]) -> str:
    """One record that failed for good, for the last night's `--only-failed` to retry."""
    with night_server(0, args.latency, args, "--fault-schema-invalid", "1") as sim_env:
        run = pipeline("run", JOB, "--database", str(database), "--limit", "1", env={**env, **sim_env})
    return summary_lines(run.stdout)


def quiet_night(args: argparse.Namespace, database: Path, env: dict[str, str], textfile: Path) -> str:
    """A night with nothing to do: `--only-failed --class too_long` (no ad is too long for the
    simulator's context), with the metrics textfile a nightly unit keeps."""
    with night_server(args.nights + 1, args.latency, args) as sim_env:
        run = pipeline(
            "run", JOB, "--database", str(database), "--only-failed", "--class", "too_long",
            "--metrics-textfile", str(textfile), "--progress", "log", env={**env, **sim_env},
        )  # fmt: skip
    return summary_lines(run.stdout)


def alerts(database: Path, env: dict[str, str]) -> int:
    return pipeline("report", JOB, "--database", str(database), "--fail-on-drift", env=env).returncode


def summary_lines(stdout: str) -> str:
    said = ("run ", "drift:", "better:", "nothing to do")
    return "\n".join(line for line in stdout.splitlines() if line.startswith(said))


def screenshot(page: Path, out: Path) -> None:
    """The page as Chromium shows it after its scripts ran (headless, no network)."""
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=5000", "--window-size=1280,2200", f"--screenshot={out.resolve()}",
         page.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nights", type=int, default=6)
    parser.add_argument("--records", type=int, default=400, help="new ads per night")
    parser.add_argument("--latency", type=float, default=1.0, help="the simulator's seconds per request")
    parser.add_argument("--plant", choices=PLANTS, default="field", help="what changes on the last night")
    parser.add_argument("--slow-latency", type=float, default=None, help="--plant latency (default 3.3x)")
    parser.add_argument(
        "--concurrency",
        default="32",
        help="the run's --concurrency (fixed: the noise is the server's and the machine's alone; auto: "
        "its limit is plotted, and a night it holds at a low level is a slower night)",
    )
    parser.add_argument("--answer-noise", type=float, default=0.05)
    parser.add_argument("--drift-field", default="salary", help="--plant field: left empty")
    parser.add_argument("--html", type=Path, default=None, help="the report page (default: a temp file)")
    parser.add_argument("--screenshot", type=Path, default=None, help="a PNG of the report page")
    parser.add_argument("--quiet", action="store_true", help="then a night with nothing to do")
    args = parser.parse_args()
    if args.slow_latency is None:
        args.slow_latency = 3.3 * args.latency
    return args


def main() -> None:
    args = arguments()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as folder:
        database = Path(folder) / "linkedin.duckdb"
        renames = [item for rename in RENAMES for item in ("--rename", rename)]
        pipeline("load", str(ADZUNA), "--job", JOB, "--database", str(database), *renames, env=env)
        if args.plant == "retry":
            print(f"before: {fail_one_record(args, database, env)}", flush=True)
        for number in range(1, args.nights + 1):
            print(f"night {number}: {night(number, args, database, env)}", flush=True)
        if args.quiet:
            print(f"report --fail-on-drift after night {args.nights} exits {alerts(database, env)}")
            textfile = Path(folder) / "pipeline.prom"
            print(f"night {args.nights + 1}: {quiet_night(args, database, env, textfile)}", flush=True)
            metrics = [line for line in textfile.read_text().splitlines() if "pipeline_run_active" in line]
            print(f"metrics textfile written ({textfile.stat().st_size:,} bytes): {metrics[-1]}")
        html = args.html or Path(folder) / "report.html"
        report = pipeline("report", JOB, "--database", str(database), "--html", str(html), env=env)
        print(report.stdout)
        print(f"report --fail-on-drift exits {alerts(database, env)}")
        if args.screenshot is not None:
            screenshot(html, args.screenshot)
            print(f"wrote {args.screenshot}")


if __name__ == "__main__":
    main()
