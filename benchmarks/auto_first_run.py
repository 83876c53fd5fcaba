"""`concurrency: auto` on a first, short run and on the next one, against the best fixed concurrency, with
the real client (`pipeline run`) against `pipeline sim` processes on 127.0.0.1.

    .venv/bin/python benchmarks/auto_first_run.py                        # the default cases, ~17 minutes
    .venv/bin/python benchmarks/auto_first_run.py --cases kv64,nano --latency 5 --length 60
    .venv/bin/python benchmarks/auto_first_run.py --closed-loop          # virtual clock, ~2 minutes

Per case (a simulator profile, one of them the server of issue 18 whose KV cache holds 64 requests
under --max-num-seqs 512), the simulator runs fast enough that a reply at the expected best level takes
``--latency`` seconds of the client's (by default as short as keeps the client under ~128 records/s on
two cores, and at least 1 s), and each run sends ``--length`` times that level in records, so a run
lasts about ``--length`` request latencies. Then, each on the same number of fresh records:

1. a fixed sweep (`concurrency: N`, one fresh database each) finds the best fixed level;
2. a first run with `concurrency: auto` (max 512) on a fresh database: nothing known, it starts where
   this job's requests fit in the simulator's KV cache (its vllm:cache_config_info) when that is below
   the maximum, else with the ramp from 8;
3. a second run with `concurrency: auto` on as many new records in that database: it starts from what
   the first run learned (runs.knees).

A run's time is its row's ended_at - started_at (the process's start-up is not the server's); the
ratios are the best fixed level's time over auto's, the best being the lowest level within 1% of the
fastest (as much for less). "length" is the best fixed run's time over its replies' mean latency.
Prints a Markdown table; nothing here is a pass/fail test.

``--closed-loop`` runs the same cases in pipeline/bench/closed_loop.py instead (the simulator's engine
in process on a virtual clock, with the collapse past the KV cache a real server shows, which the
simulator process does not), each run ``--length`` latencies of the best fixed level long, and adds the
first run as it was before it started at the fit (the ramp from 8) for comparison. Throughput is over
whole runs, as a run's time counts its start.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import yaml
from support import MODEL, PIPELINE, REPO, child_env, print_rows, simulator, write_job

from pipeline.bench.closed_loop import LoadResult, Scenario, Workload, run_load
from pipeline.bench.datasets import build_postings
from pipeline.sim.profiles import PROFILES

# What one request of the job below holds in the KV cache when done, and the answer's tokens (measured:
# a 1,965-token prompt with the schema, 327 completion tokens with low reasoning).
REQUEST_TOKENS = 2300
ANSWER_TOKENS = 327
CLIENT_RECORDS_PER_S = 128  # what the client and the simulator sustain together on two cores, with room
# The benchmarks' job (support.write_job) as a first auto run is given it: up to 512, low reasoning.
JOB: dict[str, Any] = {"name": "auto_first_run", "max_concurrency": 512, "reasoning_effort": "low"}


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    profile: str
    levels: tuple[int, ...]  # the fixed sweep
    expected: int  # the level the run's size and the simulator's speed are set from
    kv_cache_tokens: int | None = None
    max_num_seqs: int | None = None

    @property
    def label(self) -> str:
        extra = [f"KV room for {self.kv_cache_tokens // REQUEST_TOKENS}"] if self.kv_cache_tokens else []
        extra += [f"--max-num-seqs {self.max_num_seqs}"] if self.max_num_seqs else []
        return self.profile + (f" ({', '.join(extra)})" if extra else "")

    def model_latency_s(self) -> float:
        """A reply's seconds at ``expected`` in flight, by the profile's curve (within its KV cache)."""
        running = self.expected
        if self.kv_cache_tokens:
            running = min(running, self.kv_cache_tokens // REQUEST_TOKENS)
        return self.expected * ANSWER_TOKENS / PROFILES[self.profile].measured_at(running)

    def sim_args(self, speed: float) -> list[str]:
        args = ["--profile", self.profile, "--speed", f"{speed:.3f}", "--model", MODEL]
        args += ["--kv-cache-tokens", str(self.kv_cache_tokens)] if self.kv_cache_tokens else []
        return args + (["--max-num-seqs", str(self.max_num_seqs)] if self.max_num_seqs else [])


CASES = (
    Case("gpt-oss", "gpt-oss-120b", levels=(128, 256, 384), expected=256),
    Case("49b", "nemotron-super-49b", levels=(192, 256, 320), expected=256),
    Case("nano", "nemotron-nano-9b", levels=(4, 8, 16), expected=8),
    # Issue 18's server: past 64 in flight its KV cache is full; --max-num-seqs lets 512 in.
    Case(
        "kv64",
        "gpt-oss-120b",
        levels=(48, 64, 96),
        expected=64,
        kv_cache_tokens=64 * REQUEST_TOKENS,
        max_num_seqs=512,
    ),
    Case("49b-kv", "nemotron-super-49b", levels=(64, 88, 128), expected=88, kv_cache_tokens=150_000),
)
DEFAULT_CASES = ("gpt-oss", "49b", "nano", "kv64")


@dataclass(frozen=True, slots=True)
class Run:
    concurrency: str
    done: int
    seconds: float
    latency_s: float  # the replies' mean, in the client's seconds
    knee: str | None  # what runs.knees kept for the server

    @property
    def records_per_s(self) -> float:
        return self.done / self.seconds


def new_records(database: Path, count: int, start: int) -> None:
    """Replace the source with ``count`` postings of new ids: the next night's records."""
    with duckdb.connect(str(database)) as connection:
        connection.execute(
            "CREATE OR REPLACE TABLE postings AS SELECT i AS id, 'Engineer ' || i AS title, "
            "repeat('We need SQL and Python. ', 60) AS description FROM range(?, ?) t(i)",
            [start, start + count],
        )


def run(folder: Path, url: str, concurrency: int | str) -> Run:
    """`pipeline run` in a child process; its numbers from the job's database."""
    job = write_job(folder, url, concurrency, stem="job", **JOB)
    child = subprocess.run(
        [*PIPELINE, "run", str(job), "--progress", "log"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
    )
    if child.returncode != 0:
        raise RuntimeError(f"pipeline run exited {child.returncode}: {child.stderr[-2000:]}")
    with duckdb.connect(str(folder / "job.duckdb"), read_only=True) as connection:
        row = connection.execute(
            "SELECT run_id, done, epoch(ended_at) - epoch(started_at), knees FROM runs "
            "ORDER BY run_id DESC LIMIT 1"
        ).fetchone()
        assert row is not None
        run_id, done, seconds, knees = row
        latency = connection.execute(
            "SELECT avg(latency_s) FROM results WHERE run_id = ?", [run_id]
        ).fetchone()
    kept = next(iter(yaml.safe_load(knees).values()), None) if knees else None
    return Run(
        str(concurrency), int(done), float(seconds), float(latency[0] if latency else 0.0), _words(kept)
    )


def _words(kept: dict[str, object] | None) -> str | None:
    """A stored knee as the table shows it: ``256 (bracketed, 246-267)``."""
    if kept is None:
        return None
    bounds = f"{kept.get('worse_below', '-')}-{kept.get('worse_above', '-')}"
    return f"{kept['level']} ({'bracketed' if kept['bracketed'] else 'not bracketed'}, {bounds})"


def measure(
    case: Case, latency_s: float | None, length: float, folder: Path
) -> tuple[list[Run], Run, Run, float]:
    """The fixed sweep, the first auto run and the second, for one case; and the simulator's speed."""
    latency_s = latency_s or max(1.0, case.expected / CLIENT_RECORDS_PER_S)
    speed = case.model_latency_s() / latency_s
    records = round(length * case.expected)
    fresh = folder / "fresh.duckdb"
    build_postings(fresh, records)
    with simulator(*case.sim_args(speed)) as url:
        sweep = []
        for level in case.levels:
            place = folder / f"c{level}"
            place.mkdir()
            shutil.copy(fresh, place / "job.duckdb")
            sweep.append(run(place, url, level))
            print(f"  {case.name} c={level}: {sweep[-1].records_per_s:.1f} records/s", file=sys.stderr)
        place = folder / "auto"
        place.mkdir()
        shutil.copy(fresh, place / "job.duckdb")
        first = run(place, url, "auto")
        print(f"  {case.name} auto, first: {first.records_per_s:.1f} records/s", file=sys.stderr)
        new_records(place / "job.duckdb", records, start=records)
        second = run(place, url, "auto")
        print(f"  {case.name} auto, second: {second.records_per_s:.1f} records/s", file=sys.stderr)
    return sweep, first, second, speed


def row(case: Case, sweep: list[Run], first: Run, second: Run, speed: float) -> tuple[object, ...]:
    fastest = max(fixed.records_per_s for fixed in sweep)
    best = next(fixed for fixed in sweep if fixed.records_per_s >= 0.99 * fastest)
    return (
        case.label,
        f"{speed:.0f}x",
        ", ".join(f"{fixed.concurrency}: {fixed.records_per_s:.1f}" for fixed in sweep),
        best.concurrency,
        f"{best.latency_s:.1f}",
        f"{best.seconds / best.latency_s:.0f}",
        f"{first.records_per_s / best.records_per_s:.3f}",
        f"{second.records_per_s / best.records_per_s:.3f}",
        first.knee or "-",
    )


def closed_loop_scenario(case: Case, length: float) -> Scenario:
    """The case in the closed-loop harness: this job's requests (a 1,965-token prompt, answers of 327
    tokens, max_tokens 2048), runs of ``length`` latencies of a reply at the expected level."""
    workload = Workload(prompt_tokens=REQUEST_TOKENS - ANSWER_TOKENS, output_tokens=ANSWER_TOKENS)
    return Scenario(
        case.profile,
        length * case.model_latency_s(),
        max_num_seqs=case.max_num_seqs,
        kv_cache_tokens=case.kv_cache_tokens,
        workload=workload,
        max_tokens=2048,
        fit_start=True,
    )


def closed_loop_row(case: Case, length: float) -> tuple[object, ...]:
    """The fixed sweep, the first auto run before (the ramp) and now (from the fit), and the second."""
    scenario = closed_loop_scenario(case, length)
    sweep = {level: run_load(scenario, level).throughput() for level in case.levels}
    best_level = max(sweep, key=lambda level: sweep[level])
    best = sweep[best_level]
    ramp = run_load(replace(scenario, fit_start=False))
    first = run_load(scenario)
    second = run_load(replace(scenario, known_knee=first.learned))
    return (
        case.label,
        ", ".join(f"{level}: {tps:.0f}" for level, tps in sweep.items()),
        best_level,
        f"{ramp.throughput() / best:.3f}",
        f"{first.throughput() / best:.3f}",
        f"{second.throughput() / best:.3f}",
        _start(first),
        first.learned.level if first.learned else "-",
    )


def _start(result: LoadResult) -> str:
    """Where a run started and its first moves: ``41, 58, 64``."""
    return ", ".join(str(limit) for _, limit in result.trace[:4])


def main_closed_loop(cases: list[Case], length: float) -> None:
    started = time.perf_counter()
    rows = [closed_loop_row(case, length) for case in cases]
    header = (
        "server",
        "fixed sweep (tok/s)",
        "best fixed c",
        "first auto run before (the ramp) / best fixed",
        "first auto run now (from the fit) / best fixed",
        "second auto run / best fixed",
        "first run's start and first moves",
        "what the first run kept",
    )
    print_rows(header, rows)
    print(
        f"\nclosed loop, virtual clock, runs of ~{length:g} latencies, "
        f"{time.perf_counter() - started:.0f} s wall"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", default=",".join(DEFAULT_CASES), help=f"of {', '.join(c.name for c in CASES)}"
    )
    parser.add_argument(
        "--latency", type=float, default=None, help="client seconds of a reply at the best level"
    )
    parser.add_argument("--length", type=float, default=30.0, help="run length in request latencies")
    parser.add_argument("--closed-loop", action="store_true", help="in process, on a virtual clock")
    args = parser.parse_args()
    chosen = args.cases.split(",")
    cases = [case for case in CASES if case.name in chosen]
    if not cases or len(cases) != len(chosen):
        parser.error(f"--cases {args.cases!r}: choose from {', '.join(case.name for case in CASES)}")
    if args.closed_loop:
        main_closed_loop(cases, args.length)
        return
    started = time.perf_counter()
    rows = []
    for case in cases:
        with tempfile.TemporaryDirectory() as folder:
            rows.append(row(case, *measure(case, args.latency, args.length, Path(folder))))
    header = (
        "server",
        "sim speed",
        "fixed sweep (records/s)",
        "best fixed c",
        "reply latency at best (s)",
        "run length (latencies)",
        "first auto run / best fixed",
        "second auto run / best fixed",
        "what the first run kept",
    )
    print_rows(header, rows)
    wall = time.perf_counter() - started
    replies = f"replies of ~{args.latency:g} s" if args.latency else "replies of 1-2 s"
    print(f"\n{replies}, runs of ~{args.length:g} latencies, {wall:.0f} s wall")


if __name__ == "__main__":
    main()
