"""Job databases with results and every kind of failure, made by real runs against a scripted server."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import orjson

from pipeline.job.spec import JobSpec
from pipeline.run.runner import RunSummary
from tests.support.fakes import completion, error, good_completion, respond
from tests.support.jobs import make_job
from tests.support.runs import run_served

#: Record number -> how the scripted server answers it; every other record gets a good answer.
INVALID_JSON_RECORDS = (1, 2, 3)
SCHEMA_INVALID_RECORDS = (5, 6)
TRUNCATED_RECORDS = (4,)
PERMANENT_RECORDS = (7,)
LONG_RAW_OUTPUT = "first line\n\n   not JSON at all " + "x" * 500


def record_number(request: httpx2.Request) -> int:
    """The record a request is about: its user message starts ``Title: Title N``."""
    first_line = str(orjson.loads(request.content)["messages"][1]["content"]).split("\n")[0]
    return int(first_line.rsplit(" ", 1)[1])


def scripted_answer(request: httpx2.Request) -> httpx2.Response:
    if request.url.path.endswith("/models"):
        return respond({"data": [{"id": "test-model"}]})
    number = record_number(request)
    if number in INVALID_JSON_RECORDS:
        return respond(completion(LONG_RAW_OUTPUT))
    if number in TRUNCATED_RECORDS:
        return respond(completion('{"title": "Da', finish_reason="length"))
    if number in SCHEMA_INVALID_RECORDS:
        return respond(good_completion(low=5, high=1))
    if number in PERMANENT_RECORDS:
        return error(400, "the prompt is longer than\nthe context window")
    return respond(good_completion(title=f"Title {number}", years=number))


def run_scripted(spec: JobSpec, **options: Any) -> RunSummary:
    return anyio.run(functools.partial(run_served, spec, scripted_answer, **options))


def job_with_outputs(folder: Path, records: int = 12, **overrides: Any) -> JobSpec:
    """A job over ``records`` postings, run once: 7 failures of 4 classes, the rest extracted."""
    spec = make_job(folder, records=records, retry={"reasks": 0, "truncation_retries": 0}, **overrides)
    summary = run_scripted(spec)
    assert summary.failed == 7, summary
    return spec


@contextmanager
def database_held_by_another_process(database: Path, *, as_run: bool = False) -> Iterator[int]:
    """Another process holds ``database`` open for writing: a `load` or a DuckDB shell, or with
    ``as_run`` a running `pipeline run` (which also holds the job's run lock, so readers wait for its
    read copy)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, duckdb\n"
            "from pipeline.source.lock import RunLock\n"
            "from pathlib import Path\n"
            "lock = RunLock(Path(sys.argv[1])) if sys.argv[2] == 'run' else None\n"
            "lock and lock.acquire()\n"
            "connection = duckdb.connect(sys.argv[1])\n"
            "print('holding', flush=True)\n"
            "time.sleep(120)\n",
            str(database),
            "run" if as_run else "other",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        yield holder.pid
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
