"""Two jobs with `concurrency: auto` on one server against one job of as many records alone, in the
closed-loop harness (pipeline/bench/closed_loop.py: the simulator's engine in process on a virtual
clock, collapsing past its KV cache as a real server does).

    .venv/bin/python benchmarks/two_jobs.py                   # 3,000 records each, ~10 s
    .venv/bin/python benchmarks/two_jobs.py --records 1000 --kv-requests 128

The server: gpt-oss-120b's curve with a KV cache that holds ``--kv-requests`` (64) of the job's
requests (1,500-token prompts, answers of ~400 of max_tokens 2048) and --max-num-seqs 512, so its
throughput collapses past 64 in flight (``--queued``: its /metrics show 64 running and the rest waiting,
as vLLM's do when it preempts). The jobs on one machine take their requests from one pool of slots
(pipeline/servers/slot_pool.py), started where the requests fit (the server's vllm:cache_config_info).
Rows: one auto job of 2 x records alone; two auto jobs of records each started together; the same two
each on its own machine (each its own limit, the other seen in the server's counts:
pipeline/servers/sharing.py); for contrast two jobs at a fixed c=256 each. A job's time is to its last
reply (a timed-out request is sent again); the pair's throughput is both jobs' records over the later one's
time, against the job alone. Runs stop at ``--cap`` times the lone job's time. Prints a Markdown table;
nothing here is a pass/fail test.

``--processes`` measures from outside instead: `pipeline run` processes (each its own database) against
one `pipeline sim` process with that KV cache, one auto job of 2 x records alone, then two of records
at once, then two with the second started a quarter of the lone job's time later, then three of two
thirds of records at once (on one machine: one pool, hosted by the first job, pipeline/servers/lease.py),
then (``--fixed``, 0 for none) two at a fixed concurrency; a job's start and end are its runs row's
started_at and ended_at, in seconds from its setup's start. ``--logs DIR`` keeps each job's log (its
limit's changes and their reasons).

    .venv/bin/python benchmarks/two_jobs.py --processes --records 3000 --fixed 0     # ~5 minutes
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

import duckdb
from support import MODEL, PIPELINE, REPO, child_env, print_rows, simulator, write_job

from pipeline.bench.closed_loop import Scenario, Workload
from pipeline.bench.datasets import build_postings
from pipeline.bench.shared_server import Job, JobResult, run_jobs
from pipeline.sim.profiles import REFERENCE_OUTPUT_TOKENS, REFERENCE_PROMPT_TOKENS


def scenario(kv_requests: int, queued: bool = False) -> Scenario:
    request = REFERENCE_PROMPT_TOKENS + REFERENCE_OUTPUT_TOKENS
    return Scenario(
        "gpt-oss-120b",
        duration_s=10**7,
        kv_cache_tokens=kv_requests * request,
        max_num_seqs=512,
        workload=Workload(),
        timeout_s=3600.0,
        fit_start=True,
        speed=10.0,  # replies 10x faster to the client (its scrapes stay 1 s apart): fewer ticks to run
        queued_past_cache=queued,
    )


def row(label: str, jobs: list[JobResult], alone: float) -> tuple[object, ...]:
    times = [job.duration_s for job in jobs]
    answered = sum(job.answered for job in jobs)
    pair = answered / max(times)
    unfinished = [job for job in jobs if not job.finished]
    words = f" ({sum(j.answered for j in unfinished)} answered, stopped)" if unfinished else ""
    return (
        label,
        ", ".join(f"{seconds:,.0f}" for seconds in times) + words,
        f"{max(times) / min(times):.2f}",
        f"{pair:.3f}",
        f"{pair / alone:.3f}",
        ", ".join(str(job.peak_limit) for job in jobs),
    )


REQUEST_TOKENS = 2300  # the postings job's prompt with its schema and a low-reasoning answer (measured)


def kv_simulator(kv_requests: int, speed: float) -> AbstractContextManager[str]:
    """One `pipeline sim` whose KV cache holds ``kv_requests`` of the job's requests; its base URL."""
    args = ["--profile", "gpt-oss-120b", "--model", MODEL, "--max-num-seqs", "512"]
    return simulator(*args, "--kv-tokens", str(kv_requests * REQUEST_TOKENS), "--speed", f"{speed:g}")


def start_job(folder: Path, url: str, records: int, concurrency: int | str) -> subprocess.Popen[str]:
    """`pipeline run` of the job on a fresh database of ``records`` in ``folder``; its log in run.log."""
    folder.mkdir()
    build_postings(folder / "job.duckdb", records)
    job = write_job(
        folder, url, concurrency, stem="job", name=folder.name, max_concurrency=512, reasoning_effort="low"
    )
    with (folder / "run.log").open("w") as log:
        return subprocess.Popen(
            [*PIPELINE, "run", str(job), "--progress", "log"],
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
            env=child_env(),
            cwd=REPO,
        )


def finished(
    children: list[tuple[Path, subprocess.Popen[str]]], origin: float
) -> list[tuple[int, float, float]]:
    """Each job's records done, and when it started and ended (its runs row, in seconds from
    ``origin``, an epoch), once its process ended."""
    found = []
    for folder, child in children:
        child.wait()
        if child.returncode != 0:
            tail = (folder / "run.log").read_text()[-2000:]
            raise RuntimeError(f"pipeline run exited {child.returncode}: {tail}")
        with duckdb.connect(str(folder / "job.duckdb"), read_only=True) as connection:
            row = connection.execute(
                "SELECT done, epoch(started_at), epoch(ended_at) FROM runs ORDER BY run_id DESC LIMIT 1"
            ).fetchone()
        assert row is not None
        found.append((int(row[0]), float(row[1]) - origin, float(row[2]) - origin))
    return found


Jobs = list[tuple[str, int, int | str, float]]  # each job: its name, records, concurrency, start delay (s)


def run_setup(folder: Path, url: str, jobs: Jobs) -> list[tuple[int, float, float]]:
    """Start the jobs, each after its delay; what each did once all ended."""
    origin = time.time()
    children = []
    for name, count, concurrency, delay in sorted(jobs, key=lambda job: job[3]):
        time.sleep(max(0.0, origin + delay - time.time()))
        children.append((folder / name, start_job(folder / name, url, count, concurrency)))
    return finished(children, origin)


def main_processes(records: int, kv_requests: int, speed: float, fixed: int, logs: Path | None) -> None:
    """One auto job of 2 x records alone, then two of records together, then the second a quarter of the
    lone job's time later, then (``fixed``) two at a fixed concurrency: each setup timed by its runs rows."""
    started = time.perf_counter()
    rows: list[tuple[object, ...]] = []
    with tempfile.TemporaryDirectory() as place, kv_simulator(kv_requests, speed) as url:
        folder = Path(place)
        alone = run_setup(folder, url, [("alone", 2 * records, "auto", 0.0)])
        rate = alone[0][0] / (alone[0][2] - alone[0][1])
        late = (alone[0][2] - alone[0][1]) / 4
        setups: list[tuple[str, Jobs]] = [
            (f"one auto job of {2 * records:,}", []),
            (f"two auto jobs of {records:,}", [("a", records, "auto", 0.0), ("b", records, "auto", 0.0)]),
            (
                f"two auto jobs of {records:,}, the second {late:.0f} s later",
                [("first", records, "auto", 0.0), ("second", records, "auto", late)],
            ),
        ]
        third = 2 * records // 3
        setups.append((f"three auto jobs of {third:,}", [(name, third, "auto", 0.0) for name in "xyz"]))
        if fixed:
            pair: Jobs = [("fa", records, fixed, 0.0), ("fb", records, fixed, 0.0)]
            setups.append((f"two jobs of {records:,} at c={fixed}", pair))
        for label, jobs in setups:
            done = run_setup(folder, url, jobs) if jobs else alone
            end = max(ended for _, _, ended in done) - min(begun for _, begun, _ in done)
            together = sum(count for count, _, _ in done) / end  # from the first start to the last end
            times = ", ".join(f"{begun:.0f}-{ended:.0f}" for _, begun, ended in done)
            lengths = [ended - begun for _, begun, ended in done]
            ratio = f"{max(lengths) / min(lengths):.2f}"
            rows.append((label, times, ratio, f"{together:.1f}", f"{together / rate:.3f}"))
            print(f"  {label}: {times} s", file=sys.stderr)
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                for name in [job[0] for job in jobs] or ["alone"]:
                    (logs / f"{name}.log").write_text((folder / name / "run.log").read_text())
    header = (
        "jobs",
        "each job's start-end (s)",
        "longer / shorter",
        "records/s (all)",
        "against one job alone",
    )
    print_rows(header, rows)
    print(
        f"\npipeline sim --speed {speed:g}, KV cache for {kv_requests}, "
        f"{time.perf_counter() - started:.0f} s wall"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=3000, help="records per job of the pair")
    parser.add_argument("--kv-requests", type=int, default=64, help="requests the KV cache holds")
    parser.add_argument("--fixed", type=int, default=256, help="the contrast's fixed concurrency")
    parser.add_argument("--cap", type=float, default=10.0, help="stop runs at this x the lone job's time")
    parser.add_argument("--processes", action="store_true", help="pipeline run against pipeline sim")
    parser.add_argument("--queued", action="store_true", help="/metrics: past the cache, the rest wait")
    parser.add_argument("--speed", type=float, default=60.0, help="--processes: the simulator's speed")
    parser.add_argument("--logs", type=Path, default=None, help="--processes: keep each job's log here")
    args = parser.parse_args()
    if args.processes:
        main_processes(args.records, args.kv_requests, args.speed, args.fixed, args.logs)
        return
    started = time.perf_counter()
    server = scenario(args.kv_requests, args.queued)
    (one,) = run_jobs(server, [Job(2 * args.records)])
    capped = replace(server, duration_s=args.cap * one.duration_s)
    pair = run_jobs(capped, [Job(args.records), Job(args.records)])
    apart = run_jobs(capped, [Job(args.records), Job(args.records)], one_machine=False)
    fixed = run_jobs(capped, [Job(args.records, args.fixed), Job(args.records, args.fixed)])
    alone = one.records_per_s
    rows = [
        row(f"one auto job of {2 * args.records:,}", [one], alone),
        row(f"two auto jobs of {args.records:,}", pair, alone),
        row(f"two auto jobs of {args.records:,}, each on its own machine", apart, alone),
        row(f"two jobs of {args.records:,} at c={args.fixed}", fixed, alone),
    ]
    header = (
        "jobs",
        "each job's time (model s)",
        "slower / faster",
        "records/s (both)",
        "against one job alone",
        "peak limit",
    )
    print_rows(header, rows)
    print(
        f"\nKV cache for {args.kv_requests} requests, closed loop on a virtual clock, "
        f"{time.perf_counter() - started:.0f} s wall"
    )


if __name__ == "__main__":
    main()
