"""Jobs to judge: databases made by real runs against scripted servers, for the judging page's tests.

:func:`judging_job` is :func:`tests.support.variants.variants_job`'s source (records ``SOURCE_IDS``,
``Title N`` / ``Posting N needs SQL and Python.``, grounded skills) run by ``main`` alone, except that
record ``HOSTILE_ID``'s text and answer carry markup (``SCRIPT``, ``IMG``) that a page must show as text.
For two variants judged blind, :func:`tests.support.variants.two_variant_job`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx2

from pipeline.job.spec import JobSpec
from pipeline.store.opening import prepare_database
from pipeline.store.read_copy import write_copy
from tests.support.processes import pipeline_command, subprocess_env
from tests.support.variants import SOURCE_IDS, description, extraction, reply, run_variant, variants_job

HOSTILE_ID = 3
SCRIPT = "<script>window.pwned = 1</script>"
IMG = '<img src=x onerror="window.pwned = 2">'
HOSTILE_TEXT = f"Posting {HOSTILE_ID} needs {SCRIPT} and {IMG} and SQL."
#: What main gives for each record: its extraction (record 9 fails schema validation).
EXTRACTED_RECORDS = tuple(number for number in SOURCE_IDS if number != 9)


def main_answer(number: int, attempt: int) -> httpx2.Response:
    if number == 9:
        return reply(extraction(number, low=5, high=1))
    if number == HOSTILE_ID:
        return reply(extraction(number, skills=[IMG, "SQL"], title=f"Title {number} {SCRIPT}"))
    return reply(extraction(number))


def judging_job(folder: Path) -> JobSpec:
    """The job, run once by ``main``: every record extracted but record 9 (a schema failure)."""
    spec = variants_job(folder)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE postings SET description = ? WHERE id = ?", [HOSTILE_TEXT, HOSTILE_ID])
    summary = run_variant(spec, "main", main_answer)
    assert (summary.done, summary.failed) == (len(EXTRACTED_RECORDS), 1), summary
    assert description(HOSTILE_ID) != HOSTILE_TEXT
    return spec


def write_read_copy(spec: JobSpec) -> None:
    """The read copy a run would keep of the database as it is now (for a test that then holds it)."""
    connection = prepare_database(spec)
    try:
        write_copy(connection, spec, 1)
    finally:
        connection.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class JudgeProcess:
    process: subprocess.Popen[str]
    url: str  # the page, e.g. http://127.0.0.1:8780/
    line: str  # what it printed when ready


@contextlib.contextmanager
def judge_process(job: Path, *args: str) -> Iterator[JudgeProcess]:
    """``pipeline judge JOB --port 0 ARGS`` as a real process, until the block ends (then SIGINT, as
    Ctrl-C; killed if it does not stop)."""
    process = subprocess.Popen(
        pipeline_command("judge", str(job), "--port", "0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        start_new_session=True,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        if " at http://" not in line:
            process.kill()
            raise RuntimeError(f"pipeline judge did not start: {line}{process.stderr.read()}")
        url = line.split(" at ", 1)[1].split()[0]
        yield JudgeProcess(process, url, line.strip())
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def judgment_rows(database: Path) -> list[tuple[str, str, str, str, str, str]]:
    """(record, variant, field, value, verdict, judge) of every judgment in the table, oldest first."""
    return [row[:6] for row in blind_judgment_rows(database)]


def blind_judgment_rows(database: Path) -> list[tuple[str, str, str, str, str, str, str]]:
    """:func:`judgment_rows`, each with the pair it was judged blind between ("" when seen)."""
    with duckdb.connect(str(database), read_only=True) as connection:
        rows = connection.execute(
            "SELECT CAST(record_id AS VARCHAR), variant, field, value, verdict, judge, "
            "coalesce(blind_between, '') FROM judgments ORDER BY created_at, rowid"
        ).fetchall()
    return [
        (str(record), str(variant), str(field), str(value), str(verdict), str(judge), str(blind))
        for record, variant, field, value, verdict, judge, blind in rows
    ]
