"""The judging page's response per key: the HTTP round trip of one judgment, on a job of 10^5 results.

    .venv/bin/python benchmarks/judging_page.py                        # 10^5 results, 200 keys each way
    .venv/bin/python benchmarks/judging_page.py --results 20000 --keys 50

Builds the benchmarks' source of N postings (the Adzuna ads from ../shared repeated under new ids) and N
results of the LinkedIn schema built in SQL from each ad's text, as benchmarks/read_copy.py does; starts
`pipeline judge` as a real process (a seeded sample, as a person judges it), and times, from this
process, each request a key press makes: ``a``/``x`` (POST /api/judge: the database opened, the judgment
written in one transaction, closed), ``m`` (POST /api/missing), Backspace (POST /api/undo), the next
record (GET /api/records/N), and the same judgment while another process holds the database as a run
does (journaled, fsync'd), then the first one after it lets go (the journal written too). Prints a
Markdown table; nothing here is a pass/fail test. The target is under 100 ms a key.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clients.proc import build_source
from read_copy import EXTRACTED_SQL, GROUNDING_SQL
from support import REPO, write_job

from pipeline.job.spec import load_job
from pipeline.source.db import open_database
from pipeline.source.versions import content_hash_sql, version_of
from pipeline.store.opening import prepare_database

Timings = dict[str, list[float]]
JUDGE = ("--judge", "bench")


def fill_results(job: Path, rows: int) -> None:
    """``rows`` current results of variant main, as a run leaves them (read_copy.py's extractions)."""
    spec = load_job(job)
    prepare_database(spec).close()  # the output tables, as a run makes them
    connection = open_database(spec.database, memory_limit="2GB")
    try:
        connection.execute(
            "INSERT INTO results (variant, record_id, run_id, extracted, grounding, model, attempts, "
            "prompt_tokens, completion_tokens, reasoning_tokens, latency_s, finish_reason, content_hash, "
            "content_fields, prompt_hash, schema_hash, settings_hash) "
            f"SELECT 'main', id, 1, {EXTRACTED_SQL}, {GROUNDING_SQL}, 'bench-model', 1, 900, 300, 96, 240.0, "
            f"'stop', {content_hash_sql(spec.content_fields())}, $content_fields, $prompt_hash, "
            f"$schema_hash, $settings_hash FROM postings s WHERE id < {rows}",
            version_of(spec).parameters(),
        )
        connection.execute(
            "INSERT INTO runs (run_id, variant, status, done) VALUES (1, 'main', 'completed', $n)",
            {"n": rows},
        )
        connection.execute("CHECKPOINT")
    finally:
        connection.close()


def start_judge(job: Path, sample: int) -> tuple[subprocess.Popen[str], str, float]:
    started = time.perf_counter()
    judge = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "judge", str(job), "--port", "0", "--sample", str(sample), *JUDGE],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    assert judge.stdout is not None
    line = judge.stdout.readline()
    if " at http://" not in line:
        raise RuntimeError(f"pipeline judge did not start: {line!r}")
    return judge, line.split(" at ", 1)[1].split()[0], time.perf_counter() - started


@contextmanager
def held_as_a_run(database: Path) -> Iterator[None]:
    """Another process holds the database and the job's run lock, as a running `pipeline run` does."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\nfrom pipeline.source.lock import RunLock\n"
            "from pipeline.source.db import open_database\n"
            "RunLock(Path(sys.argv[1])).acquire()\nconnection = open_database(Path(sys.argv[1]))\n"
            "print('holding', flush=True)\ntime.sleep(600)\n",
            str(database),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        yield
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


class Keys:
    """Presses keys through the page's API, timing each round trip."""

    def __init__(self, client: httpx2.Client, url: str) -> None:
        self.client, self.url = client, url
        self.timings: Timings = {}

    def timed(self, name: str, request: Callable[[], httpx2.Response]) -> dict[str, Any]:
        started = time.perf_counter()
        response = request()
        self.timings.setdefault(name, []).append(time.perf_counter() - started)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def post(self, name: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.timed(name, lambda: self.client.post(self.url + path, json=body))

    def record(self, index: int) -> dict[str, Any]:
        return self.timed(
            "next record (GET /api/records/N)", lambda: self.client.get(f"{self.url}api/records/{index}")
        )


def judge_values(keys: Keys, count: int, label: str, start: int = 0) -> int:
    """Judge ``count`` values record by record from record ``start``; every 10th key marks a value missing
    and every 25th undoes. Returns the record it stopped in."""
    index, record, number = start, keys.record(start), 0
    for pressed in range(count):
        while number >= len(record["items"]):
            index, number = index + 1, 0
            record = keys.record(index)
        if pressed % 25 == 24:
            keys.post(f"Backspace: undo{label}", "api/undo", {})
        elif pressed % 10 == 9:
            text = record["texts"][-1][1].split()[pressed % 7]
            keys.post(
                f"m: missing{label}",
                "api/missing",
                {"record": index, "field": "benefits", "text": text + " plan"},
            )
        else:
            verdict = "correct" if pressed % 3 else "wrong"
            keys.post(
                f"a / x: judge{label}", "api/judge", {"record": index, "item": number, "verdict": verdict}
            )
            number += 1
    return index + 1


def print_table(timings: Timings) -> None:
    print("| key (request) | n | median ms | p95 ms | max ms |")
    print("|---|---|---|---|---|")
    for name, values in timings.items():
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        print(
            f"| {name} | {len(values)} | {statistics.median(values) * 1000:.1f} | {p95 * 1000:.1f} "
            f"| {ordered[-1] * 1000:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=int, default=100_000)
    parser.add_argument("--sample", type=int, default=200, help="records on the page (--sample of judge)")
    parser.add_argument("--keys", type=int, default=200, help="keys pressed, free and with the database held")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_source(folder / "bench.duckdb", args.results)
        job = write_job(folder, "http://127.0.0.1:9/v1", 1)
        fill_results(job, args.results)
        size_mb = (folder / "bench.duckdb").stat().st_size / 1e6
        judge, url, startup_s = start_judge(job, args.sample)
        try:
            with httpx2.Client(timeout=30) as client:
                keys = Keys(client, url)
                stopped = judge_values(keys, args.keys, "")
                with held_as_a_run(folder / "bench.duckdb"):
                    stopped = judge_values(keys, args.keys, ", database held (journaled)", stopped)
                keys.post(
                    "a: the first judgment after the run (journal written too)",
                    "api/judge",
                    {"record": stopped, "item": 0, "verdict": "correct"},
                )
        finally:
            os.killpg(judge.pid, signal.SIGINT)
            judge.wait(timeout=30)
    print(
        f"{args.results:,} results ({size_mb:,.0f} MB database), a sample of {args.sample} records; "
        f"`pipeline judge` ready in {startup_s:.1f} s"
    )
    print_table(keys.timings)


if __name__ == "__main__":
    main()
