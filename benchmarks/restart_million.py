"""A 1,000,000-row job restarted with 900,000 records done: time to the first request, peak RSS.

    .venv/bin/python benchmarks/restart_million.py                      # 10^6 rows, 9x10^5 done
    .venv/bin/python benchmarks/restart_million.py --rows 200000 --done 180000   # a quick look

Builds the source in DuckDB (the real Adzuna ads from ../shared repeated under new ids), creates the
job's output tables with a one-record run against an instant `pipeline sim`, marks ``--done`` records
as done with one SQL insert (current results: each with the version key and content hash a real run
would have written, so the restart compares every record's text hash, as a nightly run does), then
starts `pipeline run` and measures, from the moment the process is spawned: when the simulator sees
the first request (its /metrics, polled every 5 ms), when the run ends, and the process's peak RSS
(VmHWM). Prints one table row; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
from clients.proc import build_source, server_metrics, status_kb
from run_scale import sim_args
from support import PIPELINE, REPO, print_rows, simulator, write_job

from pipeline.job.spec import load_job
from pipeline.source.db import bind
from pipeline.source.versions import content_hash_sql, version_of


def prepare(folder: Path, url: str, rows: int, done: int) -> Path:
    database = folder / "bench.duckdb"
    build_source(database, rows)
    job = write_job(folder, url, concurrency=256)
    subprocess.run(  # creates runs/results/failures exactly as a real run does
        [*PIPELINE, "run", str(job), "--limit", "1", "--progress", "log"],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    spec = load_job(job)
    version = version_of(spec)
    insert = (
        "INSERT INTO results (variant, record_id, run_id, extracted, model, attempts, prompt_tokens, "
        "completion_tokens, reasoning_tokens, latency_s, finish_reason, content_hash, content_fields, "
        "prompt_hash, schema_hash, settings_hash) "
        f"SELECT 'main', id, 1, '{{}}', $models[1], 1, 900, 300, 96, 240.0, 'stop', "
        f"{content_hash_sql(spec.content_fields())}, $content_fields, $prompt_hash, $schema_hash, "
        f"$settings_hash FROM postings s WHERE id < {done} AND id NOT IN (SELECT record_id FROM results)"
    )
    with duckdb.connect(str(database)) as connection:
        connection.execute(insert, bind(insert, version.parameters()))  # the parameters it uses
        connection.execute("CHECKPOINT")
    return job


def measure_restart(job: Path, url: str) -> dict[str, float]:
    before = server_metrics(url)["pipeline_sim:requests"]
    started = time.perf_counter()
    child = subprocess.Popen(
        [*PIPELINE, "run", str(job), "--progress", "log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    first = None
    peak_kb = 0
    while child.poll() is None:
        peak_kb = max(peak_kb, status_kb(child.pid, "VmHWM:"))
        if first is None and server_metrics(url)["pipeline_sim:requests"] > before:
            first = time.perf_counter() - started
        time.sleep(0.005 if first is None else 0.05)
    return {
        "exit": float(child.returncode),
        "first_request_s": first if first is not None else float("nan"),
        "wall_s": time.perf_counter() - started,
        "peak_rss_mb": peak_kb / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--done", type=int, default=900_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, simulator(*sim_args(0.0)) as url:
        folder = Path(tmp)
        job = prepare(folder, url, args.rows, args.done)
        result = measure_restart(job, url)
        with duckdb.connect(str(folder / "bench.duckdb"), read_only=True) as connection:
            row = connection.execute("SELECT count(*) FROM results").fetchone()
        results = int(row[0]) if row else 0
    header = ("source rows", "done before", "exit", "first request s", "wall s", "results", "peak RSS MB")
    values = (
        args.rows,
        args.done,
        int(result["exit"]),
        f"{result['first_request_s']:.2f}",
        f"{result['wall_s']:.1f}",
        results,
        f"{result['peak_rss_mb']:.0f}",
    )
    print_rows(header, [values])


if __name__ == "__main__":
    main()
