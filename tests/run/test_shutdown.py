"""Graceful stop: the first signal lets requests in flight finish, a second one (or the end of the grace
period) cancels them; finished records are saved either way and the rest stay pending."""

from __future__ import annotations

import os
import signal
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import pytest
from structlog.testing import capture_logs

from pipeline.run.runner import RunStatus
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.jobs import make_job, table_rows
from tests.support.runs import run_served
from tests.support.waiting import until

pytestmark = pytest.mark.anyio

RECORDS = 60
CONCURRENCY = 4
SIGNAL_AT_REQUEST = 10


class SignalServer:
    """Answers chat requests; at request ``signal_at`` it signals this process. Requests that arrive
    after ``hold_from`` wait for ``release`` (a test event) instead of answering."""

    def __init__(self, *, signal_at: int, hold_from: int | None = None) -> None:
        self.signal_at = signal_at
        self.hold_from = hold_from
        self.release = anyio.Event()
        self.signalled = anyio.Event()
        self.received = 0
        self.answered = 0

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        self.received += 1
        number = self.received
        if number == self.signal_at:
            os.kill(os.getpid(), signal.SIGINT)
            self.signalled.set()
        await anyio.lowlevel.checkpoint()
        if self.hold_from is not None and number >= self.hold_from:
            await self.release.wait()
        self.answered += 1
        return respond(good_completion())


def saved(database: Path) -> int:
    return int(table_rows(database, "SELECT count(*) FROM results")[0][0])


async def stopping(logs: list[MutableMapping[str, Any]]) -> None:
    """Until the run has taken the first signal: it takes no new record from then on."""
    await until(lambda: any(str(entry["event"]).startswith("stopping:") for entry in logs))


async def test_first_signal_takes_no_new_records_and_lets_requests_in_flight_finish(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=RECORDS, concurrency=CONCURRENCY)
    server = SignalServer(signal_at=SIGNAL_AT_REQUEST, hold_from=SIGNAL_AT_REQUEST)

    async def release_once_stopping() -> None:
        await stopping(logs)  # no new record may start from here
        server.release.set()

    with capture_logs() as logs:
        async with anyio.create_task_group() as group:
            group.start_soon(release_once_stopping)
            summary = await run_served(spec, server, handle_signals=True)
    assert summary.status is RunStatus.INTERRUPTED and summary.exit_code == 130
    assert server.received < SIGNAL_AT_REQUEST + CONCURRENCY  # nothing taken after the signal
    assert summary.done == server.answered == server.received == saved(spec.database)  # none cancelled
    assert table_rows(spec.database, "SELECT status FROM runs") == [("interrupted",)]


async def test_second_signal_cancels_requests_in_flight_at_once(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=RECORDS, concurrency=CONCURRENCY)
    server = SignalServer(signal_at=SIGNAL_AT_REQUEST, hold_from=SIGNAL_AT_REQUEST)

    async def signal_again() -> None:
        await stopping(logs)  # the first signal taken: this one is the second
        os.kill(os.getpid(), signal.SIGTERM)

    # The grace period is 60 s: only the second signal ends this quickly.
    with anyio.fail_after(10), capture_logs() as logs:
        async with anyio.create_task_group() as group:
            group.start_soon(signal_again)
            summary = await run_served(spec, server, handle_signals=True)
    assert summary.status is RunStatus.INTERRUPTED
    assert summary.done == server.answered == SIGNAL_AT_REQUEST - 1 == saved(spec.database)
    resumed = await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert resumed.done == RECORDS - summary.done
    assert table_rows(spec.database, "SELECT count(*), count(DISTINCT record_id) FROM results") == [
        (RECORDS, RECORDS)
    ]


async def test_the_grace_period_ends_requests_that_do_not_finish(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=RECORDS, concurrency=CONCURRENCY, operations={"shutdown_grace_s": 0.3})
    server = SignalServer(signal_at=SIGNAL_AT_REQUEST, hold_from=SIGNAL_AT_REQUEST)  # never released
    with anyio.fail_after(10):
        summary = await run_served(spec, server, handle_signals=True)
    assert summary.status is RunStatus.INTERRUPTED
    assert summary.done == SIGNAL_AT_REQUEST - 1 == saved(spec.database)
    pending = RECORDS - summary.done
    assert table_rows(spec.database, "SELECT count(*) FROM failures") == [(0,)]  # cancelled ≠ failed
    resumed = await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert resumed.pending_at_start == pending and resumed.done == pending
