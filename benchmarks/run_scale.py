"""Throughput and peak memory of `pipeline run` over a large source, against the simulator.

    .venv/bin/python benchmarks/run_scale.py --records 100000 --concurrency 256 --latency 0

Builds a DuckDB source of N postings (the real Adzuna ads from ../shared, repeated under new ids),
starts `pipeline sim` on a free port, runs `pipeline run` as a child process and reads its peak RSS and
CPU time from the kernel (wait4). Prints one table row per run; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
from clients.proc import build_source, status_kb
from support import MODEL, PIPELINE, child_env, print_rows, start_simulator, stop, write_job


def sim_args(latency: float) -> tuple[str, ...]:
    """The simulator of these benchmarks: ``latency`` seconds a request, ±50% (none without latency)."""
    return ("--model", MODEL, "--latency", str(latency), "--jitter", "0.5" if latency else "0")


def run_once(folder: Path, url: str, records: int, concurrency: int) -> dict[str, float]:
    job_file = write_job(folder, url, concurrency)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(
        [*PIPELINE, "run", str(job_file), "--progress", "log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    peak_kb = 0
    while child.poll() is None:  # VmHWM: this process image's own peak (ru_maxrss would include the
        peak_kb = max(peak_kb, status_kb(child.pid, "VmHWM:"))  # parent's RSS at fork time on Linux)
        time.sleep(0.05)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child is reaped: its CPU time is in
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    with duckdb.connect(str(folder / "bench.duckdb"), read_only=True) as connection:
        row = connection.execute("SELECT count(*) FROM results").fetchone()
    done = int(row[0]) if row else 0
    return {
        "exit": child.returncode,
        "done": done,
        "wall_s": wall,
        "records_per_s": done / wall,
        "peak_rss_mb": peak_kb / 1024,
        "cpu_s_per_1000": cpu_s / max(done, 1) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--latency", type=float, default=0.0, help="simulated seconds per request")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # In a child process, so this process stays small and its memory cannot blur the measurement.
        build_source(folder / "bench.duckdb", args.records)
        sim, url = start_simulator(*sim_args(args.latency))
        try:
            result = run_once(folder, url, args.records, args.concurrency)
        finally:
            stop(sim)
    header = (
        "records",
        "concurrency",
        "sim latency s",
        "done",
        "exit",
        "wall s",
        "records/s",
        "peak RSS MB",
        "client CPU s / 1000",
    )
    values = (
        args.records,
        args.concurrency,
        args.latency,
        result["done"],
        result["exit"],
        f"{result['wall_s']:.1f}",
        f"{result['records_per_s']:.0f}",
        f"{result['peak_rss_mb']:.0f}",
        f"{result['cpu_s_per_1000']:.2f}",
    )
    print_rows(header, [values])


if __name__ == "__main__":
    main()
