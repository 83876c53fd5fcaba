"""One `pipeline run` over one simulator, then over two equal ones (`endpoints:`): records/s, how the
requests split, and the client's CPU per record.

    .venv/bin/python benchmarks/endpoints.py                       # 3,000 records, 2 s a request, c=64 each
    .venv/bin/python benchmarks/endpoints.py --records 6000 --latency 1 --concurrency 128

Each simulator answers every request in ``--latency`` seconds (±50%), so one endpoint at concurrency c
does about c / latency records/s and two should do twice that. Both runs extract the same source into
fresh databases; the client's CPU time comes from the kernel (wait4). Prints a table; nothing here is a
pass/fail test.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
from clients.proc import build_source, server_metrics
from run_scale import sim_args
from support import PIPELINE, child_env, start_simulator, stop, write_job

SIM_REQUESTS = "pipeline_sim:chat_requests"


def run(folder: Path, urls: list[str], concurrency: int) -> dict[str, float]:
    job = write_job(folder, urls, concurrency)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    requests_before = [server_metrics(url)[SIM_REQUESTS] for url in urls]
    started = time.perf_counter()
    subprocess.run(
        [*PIPELINE, "run", str(job), "--progress", "log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
        check=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    with duckdb.connect(str(folder / "bench.duckdb"), read_only=True) as connection:
        row = connection.execute("SELECT count(*) FROM results").fetchone()
    done = int(row[0]) if row else 0
    split = [
        server_metrics(url)[SIM_REQUESTS] - base for url, base in zip(urls, requests_before, strict=True)
    ]
    return {"done": done, "wall_s": wall, "records_per_s": done / wall, "cpu_ms": cpu_s / done * 1000} | {
        f"requests_{index}": value for index, value in enumerate(split)
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64, help="per endpoint")
    parser.add_argument("--latency", type=float, default=2.0, help="simulated seconds per request")
    args = parser.parse_args()
    sims = [start_simulator(*sim_args(args.latency)) for _ in range(2)]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "source.duckdb"
            build_source(source, args.records)
            for count in (1, 2):
                folder = Path(tmp) / f"endpoints-{count}"
                folder.mkdir()
                shutil.copy(source, folder / "bench.duckdb")
                rows.append((count, run(folder, [url for _, url in sims[:count]], args.concurrency)))
    finally:
        for process, _ in sims:
            stop(process)
    one = rows[0][1]["records_per_s"]
    print(
        "| endpoints | records | wall s | records/s | vs one | requests per endpoint | client CPU ms/record |"
    )
    print("|---|---|---|---|---|---|---|")
    for count, result in rows:
        split = " / ".join(f"{result[f'requests_{index}']:.0f}" for index in range(count))
        print(
            f"| {count} | {result['done']:.0f} | {result['wall_s']:.1f} | {result['records_per_s']:.1f} | "
            f"{result['records_per_s'] / one:.2f}x | {split} | {result['cpu_ms']:.2f} |"
        )
    print(f"(each simulator: {args.latency:g} s a request ±50%, concurrency {args.concurrency} per endpoint)")


if __name__ == "__main__":
    main()
