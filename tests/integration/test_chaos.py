"""kill -9 at 20 random moments of a 2,000-record run, resuming each time.

Some kills land during start-up, most mid-run, and at least six inside a store commit: those runs hold
each batch's transaction open (``PIPELINE_CHAOS_COMMIT_DELAY_S``) and are killed the moment they log
that it is open. At the end every record is exactly once in results or failures, and each result is
the same as an uninterrupted run's (the simulator's answer depends only on its seed and the record).

The plan and the moments come from a seeded generator (``PIPELINE_CHAOS_SEED`` replays a printed
seed); where a moment lands in the run still depends on the machine's speed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.store.writer import CHAOS_COMMIT_DELAY_ENV
from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.logged_run import WAIT_S, Run
from tests.support.processes import sim_metric, sim_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

RECORDS = 2000
CONCURRENCY = 64
COMMIT_HOLD_S = 0.5  # each batch's transaction stays open this long in the runs killed during a commit
SEED = int(os.environ.get("PIPELINE_CHAOS_SEED", "20240917"))
# 3 at random during start-up, 1 the moment the run is recorded, 6 inside a commit, 10 mid-run.
PLAN = ("start-up",) * 3 + ("run-start",) + ("commit",) * 6 + ("mid-run",) * 10
# 0.3 s a request (±50%): the server, not the client's CPU, sets the pace (~170 records/s, ~13 s
# uninterrupted). A few faults, so that retries, re-asks and failures are killed too.
SIM_ARGS = (
    *("--model", "test-model", "--latency", "0.3", "--jitter", "0.5", "--seed", "11"),
    *("--fault-invalid-json", "0.02", "--fault-server-error", "0.02", "--fault-context-length", "0.01"),
)
CHAOS_LINE = "chaos: transaction open before commit"  # logged by the store, transaction open


@dataclass(frozen=True, slots=True)
class Kill:
    kind: str
    after_s: float  # since the process started
    run_id: int | None  # None: killed before it logged "run started"
    start_up_s: float | None  # from the spawn to "run started"
    held_rows: int  # commit kills: the rows of the open transaction the kill interrupted
    committed_rows: int  # commit kills: the rows of the batches this run had committed before
    requests: int  # chat requests the simulator received during this run
    on_disk: int  # records in results or failures after the kill


def sim_requests(url: str) -> int:
    """Every chat request the simulator received, faulted ones included."""
    return int(sim_metric(url, "pipeline_sim:chat_requests_total"))


def on_disk(database: Path) -> int:
    sql = "SELECT (SELECT count(*) FROM results) + (SELECT count(*) FROM failures)"
    tables = table_rows(database, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'failures'")
    return int(table_rows(database, sql)[0][0]) if tables[0][0] else 0


def kill_once(
    job: Path,
    database: Path,
    url: str,
    kind: str,
    rng: random.Random,
    start_up_s: float,
    *args: str,
    progress: Callable[[Path], int] = on_disk,
) -> Kill:
    # Moments scale with what is left, so every killed run still has work when it is killed (it
    # cannot finish 2.5 s x left/2,000 after its start) and the final run some left to do.
    left = RECORDS - progress(database)
    requests_before = sim_requests(url)
    held_rows = committed_rows = 0
    if kind == "commit":
        run = Run(job, *args, **{CHAOS_COMMIT_DELAY_ENV: str(COMMIT_HOLD_S)})
        target = rng.randint(1, min(3, 1 + left // 400))  # the 1st, 2nd or 3rd commit of the run
        deadline = time.perf_counter() + WAIT_S
        for commit in range(1, target + 1):
            while (event := run.next_event(deadline)).get("event") != CHAOS_LINE:
                pass
            if commit < target:
                committed_rows += int(event["rows"])
            else:
                held_rows = int(event["rows"])
    elif kind == "run-start":  # its run row is in, nothing is committed yet
        run = Run(job, *args)
        run.wait_for("run started")
    elif kind == "mid-run":
        run = Run(job, *args)
        run.wait_for("run started")
        time.sleep(rng.uniform(0.1, 2.5) * left / RECORDS)
    else:  # start-up: importing, opening the database, counting, checking the server
        run = Run(job, *args)
        time.sleep(rng.uniform(0.0, start_up_s))
    after_s = run.kill()
    requests = sim_requests(url) - requests_before
    return Kill(
        kind, after_s, run.run_id, run.start_up_s, held_rows, committed_rows, requests, progress(database)
    )


def test_kill_9_at_20_random_moments_then_resume(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"\nchaos seed {SEED} (replay: PIPELINE_CHAOS_SEED={SEED})")
    source = tmp_path / "source.duckdb"
    build_postings(source, RECORDS)
    chaos, reference = tmp_path / "chaos", tmp_path / "reference"
    for folder in (chaos, reference):
        folder.mkdir()
        shutil.copy(source, folder / "postings.duckdb")
    database, reference_database = chaos / "postings.duckdb", reference / "postings.duckdb"
    plan = list(PLAN)
    rng.shuffle(plan)

    with sim_server(*SIM_ARGS) as url:
        options: dict[str, Any] = {
            "database": "postings.duckdb",
            "endpoint": {"base_url": url},
            "concurrency": CONCURRENCY,
            "retry": {"backoff_initial_s": 0.05, "backoff_max_s": 0.2},
        }
        job, reference_job = write_job(chaos, **options), write_job(reference, **options)
        started = time.perf_counter()
        kills: list[Kill] = []
        start_ups: list[float] = []  # how long the runs took to start here and now
        for kind in plan:
            start_up_s = sorted(start_ups)[len(start_ups) // 2] if start_ups else 1.5
            kills.append(kill_once(job, database, url, kind, rng, start_up_s))
            start_ups += [kills[-1].start_up_s] if kills[-1].start_up_s is not None else []
        final = Run(job)
        final_code = final.finish()
        chaos_s = time.perf_counter() - started
        requests = sim_requests(url)
        # The same job, uninterrupted, from a fresh copy of the source, on the same simulator.
        uninterrupted = Run(reference_job)
        reference_code = uninterrupted.finish()
        reference_requests = sim_requests(url) - requests
    assert final_code in (0, 1), final.tail()
    assert reference_code in (0, 1), uninterrupted.tail()

    # Every record exactly once across results and failures: none lost, none twice.
    ids = [row[0] for row in table_rows(source, "SELECT id FROM postings ORDER BY id")]
    done = [row[0] for row in table_rows(database, "SELECT record_id FROM results")]
    failed = [row[0] for row in table_rows(database, "SELECT record_id FROM failures")]
    assert len(done) == len(set(done)) and len(failed) == len(set(failed))
    assert not set(done) & set(failed)
    assert sorted(done + failed) == ids

    # Each kill kept everything committed before it, and a kill inside a commit lost that whole
    # batch but nothing else: the run's counters (same transaction) show exactly the earlier batches.
    progress = [kill.on_disk for kill in kills]
    assert progress == sorted(progress) and progress[-1] > 0, progress
    runs = {
        row[0]: row[1:]
        for row in table_rows(database, "SELECT run_id, status, done, failed FROM runs ORDER BY run_id")
    }
    for kill in kills:
        if kill.kind == "commit":
            assert kill.run_id is not None
            _, run_done, run_failed = runs[kill.run_id]
            assert run_done + run_failed == kill.committed_rows, (kill, runs[kill.run_id])
    assert sum(run_done for _, run_done, _ in runs.values()) == len(done)  # counters match the rows

    # The killed runs are abandoned; the last one completed.
    statuses = [status for status, _, _ in runs.values()]
    assert statuses[-1] in ("completed", "completed_with_failures"), runs
    assert all(status == "abandoned" for status in statuses[:-1]), runs
    assert {kill.run_id for kill in kills if kill.run_id is not None} <= set(list(runs)[:-1])

    # The same content as an uninterrupted run, for every record both extracted.
    ours = dict(table_rows(database, "SELECT record_id, extracted FROM results"))
    theirs = dict(table_rows(reference_database, "SELECT record_id, extracted FROM results"))
    both = ours.keys() & theirs.keys()
    assert len(both) >= RECORDS * 0.9
    differing = [key for key in sorted(both) if json.loads(ours[key]) != json.loads(theirs[key])]
    assert not differing, f"{len(differing)} records differ, e.g. {differing[:5]}"

    # Resuming redid only what was in flight or not yet committed at each kill: what can finish
    # between two commits, and the batch a kill inside a commit threw away.
    lost_bound = sum(CONCURRENCY + 300 + kill.held_rows for kill in kills)
    assert requests <= RECORDS * 1.2 + lost_bound, (requests, reference_requests)
    attempts = int(table_rows(database, "SELECT sum(attempts) FROM runs")[0][0])
    reference_attempts = int(table_rows(reference_database, "SELECT sum(attempts) FROM runs")[0][0])

    during_commit = sum(kill.kind == "commit" for kill in kills)
    before_run = sum(kill.run_id is None for kill in kills)
    missing = len(set(ids) - set(done + failed))
    duplicates = len(done + failed) - len(set(done + failed))
    rows = [
        ("kills", len(kills)),
        ("  before the run was recorded (start-up)", before_run),
        ("  inside a commit (transaction held open)", during_commit),
        ("  other, after the run started", len(kills) - before_run - during_commit),
        ("records", RECORDS),
        ("results + failures", f"{len(done)} + {len(failed)}"),
        ("duplicates / missing / in both", f"{duplicates} / {missing} / {len(set(done) & set(failed))}"),
        ("records done by the killed runs", kills[-1].on_disk),
        ("chat requests, chaos run", requests),
        ("  sent but never committed (redone after kills)", requests - attempts),
        ("chat requests, uninterrupted run", f"{reference_requests} ({reference_attempts} committed)"),
        ("results identical to the uninterrupted run", f"{len(both)} of {len(both)}"),
        ("seconds, chaos / uninterrupted", f"{chaos_s:.1f} / {uninterrupted.elapsed_s:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"  {name:<{width}}  {value}" for name, value in rows))
    print("  kill  kind       at (s)  started (s)  requests  held rows  on disk")
    for number, kill in enumerate(kills, 1):
        started_s = f"{kill.start_up_s:.2f}" if kill.start_up_s is not None else "-"
        print(
            f"  {number:>4}  {kill.kind:<9}  {kill.after_s:>6.2f}  {started_s:>11}  {kill.requests:>8}  "
            f"{kill.held_rows or '-':>9}  {kill.on_disk:>7}"
        )


# The redo: 4 kills inside a commit (history insert and new result in one transaction), 4 mid-run.
REDO_PLAN = ("commit",) * 4 + ("mid-run",) * 4
NEW_SYSTEM_PROMPT = "Extract the posting. Quote skills exactly as the posting writes them."


def redone(database: Path) -> int:
    """Records whose current result or failure was made by the edited prompt."""
    sql = (
        "SELECT (SELECT count(*) FROM results WHERE run_id > 1) "
        "+ (SELECT count(*) FROM failures WHERE run_id > 1)"
    )
    return int(table_rows(database, sql)[0][0])


def test_kill_9_in_the_middle_of_a_redo_loses_and_doubles_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    database = tmp_path / "postings.duckdb"
    build_postings(database, RECORDS)
    with sim_server(*SIM_ARGS) as url:
        options: dict[str, Any] = {
            "database": "postings.duckdb",
            "endpoint": {"base_url": url},
            "concurrency": CONCURRENCY,
            "retry": {"backoff_initial_s": 0.05, "backoff_max_s": 0.2},
        }
        job = write_job(tmp_path, **options)
        assert Run(job).finish() in (0, 1)
        before = dict(table_rows(database, "SELECT record_id, extracted FROM results"))
        first_failures = {row[0] for row in table_rows(database, "SELECT record_id FROM failures")}
        write_job(tmp_path, **options, prompt={"system": NEW_SYSTEM_PROMPT})  # the prompt edit
        plan = list(REDO_PLAN)
        rng.shuffle(plan)
        kills = [
            kill_once(job, database, url, kind, rng, 1.5, "--redo-stale", progress=redone) for kind in plan
        ]
        final = Run(job, "--redo-stale")
        assert final.finish() in (0, 1), final.tail()
    assert sum(kill.kind == "commit" for kill in kills) == 4

    ids = {row[0] for row in table_rows(database, "SELECT id FROM postings")}
    results = table_rows(database, "SELECT record_id, run_id FROM results")
    failures = {row[0]: row[1] for row in table_rows(database, "SELECT record_id, run_id FROM failures")}
    # every record has exactly one result row (or only a failure), none twice
    assert len(results) == len({record_id for record_id, _ in results})
    assert {record_id for record_id, _ in results} | set(failures) == ids
    # each is current: made by the edited prompt, or kept because its redo failed under it
    stale = [record_id for record_id, run_id in results if run_id == 1 and failures.get(record_id, 1) == 1]
    assert not stale, f"{len(stale)} results were neither redone nor failed under the new prompt"
    # every replaced result is in the history exactly once, with its old content
    history = table_rows(database, "SELECT record_id, extracted, run_id FROM results_history")
    replaced = [record_id for record_id, run_id in results if run_id > 1 and record_id in before]
    assert len(history) == len({row[0] for row in history}), "a history row was doubled"
    assert sorted(row[0] for row in history) == sorted(replaced), "a history row was lost"
    assert all(row[1] == before[row[0]] and row[2] == 1 for row in history)
    print(
        f"\nredo with {len(kills)} kills: {len(results)} results, {len(history)} in the history "
        f"({len(before)} before the edit, {len(first_failures)} failures), "
        f"{sum(1 for _, run_id in results if run_id == 1)} kept after a failed redo"
    )
