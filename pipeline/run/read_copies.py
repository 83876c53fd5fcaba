"""Keeping the read copy of a running job fresh (:mod:`pipeline.store.read_copy`): on a timer
(``operations.snapshot_interval_s``), and within a second or two of a reader asking for one.

A copy costs the run little: it is written from a cursor of its own in a worker thread while the
writer goes on committing, and never more often than :data:`COST_SHARE` of the time allows (a copy
that took 5 s waits 100 s before the next one), so a 10^6-result job is not copied every minute.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import structlog

from pipeline.errors import DatabaseError
from pipeline.extraction.context import RunContext
from pipeline.source.db import Database
from pipeline.store.read_copy import clear_request, copy_requested, write_copy

log = structlog.get_logger("pipeline.run.read_copies")

COST_SHARE = 0.05  # of the run's time, at most, spent writing copies
MIN_GAP_S = 2.0
POLL_S = 1.0


class ReadCopies:
    def __init__(
        self,
        cursor: Database,
        context: RunContext,
        run_id: int,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cursor = cursor
        self._spec = context.spec
        self._run_id = run_id
        self._sleep = sleep
        self._clock = clock
        self._interval_s = context.spec.operations.snapshot_interval_s
        self._gap_s = 0.0  # a reader's first request is answered at once
        self._last = clock()  # the run's start: the first copy is due one interval in, or when asked
        self.written = 0

    def due(self) -> bool:
        """A copy now? On the timer or a reader's request, never sooner than the copies' cost allows
        (a run shorter than the interval that nobody reads makes none)."""
        since = self._clock() - self._last
        if since < self._gap_s:
            return False
        return since >= self._interval_s or copy_requested(self._spec.database)

    async def write(self) -> None:
        clear_request(self._spec.database)  # a request made while this copy is written needs the next
        started = self._clock()
        try:
            seconds = await anyio.to_thread.run_sync(write_copy, self._cursor, self._spec, self._run_id)
        except DatabaseError as error:  # e.g. the disk is full: readers keep the last copy, the run goes on
            log.warning("the read copy was not written", error=str(error))
            seconds = self._clock() - started
        self._last = self._clock()
        self._gap_s = max(MIN_GAP_S, seconds / COST_SHARE)
        self.written += 1

    async def run(self) -> None:
        """Until cancelled. The cursor is the caller's to close."""
        while True:
            if self.due():
                await self.write()
            await self._sleep(POLL_S)
