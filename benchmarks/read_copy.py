"""What the read copy (readers while a run holds the database) costs: its write time and size at 10^6
results, and a run's throughput at c=256 with copies against without.

    .venv/bin/python benchmarks/read_copy.py                       # both parts (about 10 minutes)
    .venv/bin/python benchmarks/read_copy.py --size-only --rows 200000
    .venv/bin/python benchmarks/read_copy.py --throughput-only --records 6000 --pairs 3

Size: a source of N real Adzuna ads (from ../shared, repeated under new ids) and N results whose
extraction and grounding are built in SQL from each ad's own text (~1.2 KB and ~0.4 KB a result: as
varied as real ones, so DuckDB's compression gets no easier job), then the read copy written twice
from the job's database, as a run writes it: the first copy also copies the source, later ones only
the output tables.

Throughput: the same job at c=256 against `pipeline sim` (a fixed 2 s a request, ±50%: the server
sets the pace, as a model server does), once without copies (an interval no run reaches) and once with
a copy every 5 s and a reader asking for one every 3 s, alternating, ``--pairs`` times each. Prints
tables; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import duckdb
from clients.proc import build_source
from support import MODEL, PIPELINE, REPO, print_rows, simulator
from support import write_job as write_bench_job

from pipeline.job.spec import load_job
from pipeline.source.db import bind
from pipeline.source.versions import content_hash_sql, version_of
from pipeline.store.opening import prepare_database
from pipeline.store.read_copy import copy_path, request_copy, source_copy_path, write_copy

EXTRACTED_SQL = """to_json({
    'title': title, 'company': substr(description, 1, 30), 'recruiter': NULL,
    'location': substr(description, 31, 24), 'remote_policy': 'hybrid', 'employment_type': 'permanent',
    'working_time': 'full-time', 'seniority': 'Senior', 'manages_people': id % 3 = 0,
    'explicit_skills': [substr(description, 60, 18), substr(description, 120, 22),
                        substr(description, 200, 15)],
    'inferred_capabilities': [substr(description, 260, 30), substr(description, 320, 26)],
    'requirements': [{'text': substr(description, 400, 60), 'kind': 'skill', 'mandatory': true},
                     {'text': substr(description, 480, 50), 'kind': 'experience', 'mandatory': false}],
    'experience_years': {'minimum': id % 7, 'maximum': NULL}, 'education': NULL,
    'salary': {'minimum': 30000 + id % 20000, 'maximum': 45000 + id % 20000, 'currency': 'GBP',
               'period': 'year', 'text': substr(description, 560, 30)},
    'benefits': [substr(description, 600, 20)], 'culture_signals': [substr(description, 640, 25)]})"""
GROUNDING_SQL = """to_json([
    {'path': 'company', 'value': substr(description, 1, 30), 'source_field': 'description', 'start': 0,
     'end': 30, 'match': 'exact', 'score': 100.0},
    {'path': 'explicit_skills', 'value': substr(description, 60, 18), 'source_field': 'description',
     'start': 59, 'end': 77, 'match': 'exact', 'score': 100.0},
    {'path': 'explicit_skills', 'value': substr(description, 120, 22), 'source_field': 'description',
     'start': 119, 'end': 141, 'match': 'normalised', 'score': 100.0}])"""


def write_job(folder: Path, url: str, interval_s: float) -> Path:
    return write_bench_job(folder, url, 256, operations={"snapshot_interval_s": interval_s})


def fill_results(job: Path, rows: int) -> None:
    spec = load_job(job)
    prepare_database(spec).close()  # the output tables, as a run makes them
    version = version_of(spec)
    with duckdb.connect(str(spec.database)) as connection:
        insert = (
            "INSERT INTO results (variant, record_id, run_id, extracted, grounding, model, attempts, "
            "prompt_tokens, completion_tokens, reasoning_tokens, latency_s, finish_reason, content_hash, "
            "content_fields, prompt_hash, schema_hash, settings_hash) "
            f"SELECT 'main', id, 1, {EXTRACTED_SQL}, {GROUNDING_SQL}, $models[1], 1, 900, 300, 96, 240.0, "
            f"'stop', {content_hash_sql(spec.content_fields())}, $content_fields, $prompt_hash, "
            f"$schema_hash, $settings_hash FROM postings s WHERE id < {rows}"
        )
        connection.execute(insert, bind(insert, version.parameters()))  # the parameters it uses
        connection.execute(
            "INSERT INTO runs (run_id, variant, status, done) VALUES (1, 'main', 'running', ?)", [rows]
        )
        connection.execute("CHECKPOINT")


def measure_size(rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_source(folder / "bench.duckdb", rows)
        job = write_job(folder, "http://127.0.0.1:9/v1", 60)
        fill_results(job, rows)
        spec = load_job(job)
        connection = prepare_database(spec)
        try:
            first = write_copy(connection, spec, 1)
            again = write_copy(connection, spec, 1)
        finally:
            connection.close()
        mb = 1 / 1e6
        header = ("results", "database MB", "copy MB", "source copy MB", "first copy s", "later copy s")
        row = (
            f"{rows:,}",
            f"{spec.database.stat().st_size * mb:,.0f}",
            f"{copy_path(spec.database).stat().st_size * mb:,.0f}",
            f"{source_copy_path(spec.database).stat().st_size * mb:,.0f}",
            f"{first:.1f}",
            f"{again:.1f}",
        )
        print_rows(header, [row])


def timed_run(folder: Path, url: str, records: int, copies: bool) -> float:
    """records/s of one run over ``records`` new postings; with ``copies``, a reader asks every 3 s."""
    database = folder / "bench.duckdb"
    database.unlink(missing_ok=True)
    build_source(database, records)
    job = write_job(folder, url, 5.0 if copies else 1e9)
    stop = threading.Event()

    def reader() -> None:
        while not stop.wait(3.0):
            request_copy(database)

    asker = threading.Thread(target=reader, daemon=True)
    if copies:
        asker.start()
    started = time.perf_counter()
    subprocess.run(
        [*PIPELINE, "run", str(job), "--progress", "log"],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    stop.set()
    return records / (time.perf_counter() - started)


def measure_throughput(records: int, pairs: int) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        simulator("--model", MODEL, "--latency", "2", "--jitter", "0.5") as url,
    ):
        without, with_copies = [], []
        for _ in range(pairs):
            without.append(timed_run(Path(tmp), url, records, copies=False))
            with_copies.append(timed_run(Path(tmp), url, records, copies=True))
    ratio = statistics.median(b / a for a, b in zip(without, with_copies, strict=True))
    header = ("records", "runs each", "without copies rec/s", "with copies rec/s", "median ratio")
    row = (
        f"{records:,}",
        pairs,
        " ".join(f"{value:.1f}" for value in without),
        " ".join(f"{value:.1f}" for value in with_copies),
        f"{ratio:.3f}",
    )
    print_rows(header, [row])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="results for the size part")
    parser.add_argument("--records", type=int, default=8000, help="records per run, throughput part")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--size-only", action="store_true")
    parser.add_argument("--throughput-only", action="store_true")
    arguments = parser.parse_args()
    if not arguments.throughput_only:
        measure_size(arguments.rows)
    if not arguments.size_only:
        measure_throughput(arguments.records, arguments.pairs)


if __name__ == "__main__":
    main()
