"""The writer task of a run: batches finished outcomes and commits each batch in one transaction.

A batch is committed every ``FLUSH_INTERVAL_S`` or at ``FLUSH_MAX_ROWS``, in a shielded scope: a
cancelled run (a signal's second stop, or its caller cancelling it) still commits what it finished,
and a crash loses at most what was in flight or not yet committed, which the next run redoes. A
batch that cannot be committed (the disk is full) ends the run with one line naming the database.
"""

from __future__ import annotations

import sys

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from pipeline.errors import DatabaseError, DatabaseFailure, FatalRunError
from pipeline.extraction.outcomes import Stored
from pipeline.run.stats import RunStats
from pipeline.store.writer import StoreWriter

FLUSH_INTERVAL_S = 0.5
FLUSH_MAX_ROWS = 1000


async def commit_outcomes(
    outcomes: MemoryObjectReceiveStream[Stored], writer: StoreWriter, stats: RunStats
) -> None:
    """Receive outcomes until the stream ends, committing them in batches; the last batch too."""
    batch: list[Stored] = []
    deadline = anyio.current_time() + FLUSH_INTERVAL_S
    async with outcomes:
        try:
            while True:
                with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                    try:
                        batch.append(await outcomes.receive())
                    except anyio.EndOfStream:
                        break
                    _drain_ready(outcomes, batch, FLUSH_MAX_ROWS)
                if len(batch) >= FLUSH_MAX_ROWS or anyio.current_time() >= deadline:
                    await _commit(batch, writer, stats)
                    batch = []
                    deadline = anyio.current_time() + FLUSH_INTERVAL_S
        except anyio.get_cancelled_exc_class():
            # Cancelled from outside the run: what finished (in hand, or waiting in the stream) is kept.
            _drain_ready(outcomes, batch, sys.maxsize)
            await _commit(batch, writer, stats)
            raise
    await _commit(batch, writer, stats)


async def _commit(batch: list[Stored], writer: StoreWriter, stats: RunStats) -> None:
    if not batch:
        return
    with anyio.CancelScope(shield=True):
        try:
            # The row says the run's numbers with the batch counted, in the batch's transaction.
            await writer.write(batch, stats.now().plus(batch))
        except DatabaseError as error:
            raise FatalRunError(_cannot_write(writer, error)) from error
    stats.committed(batch)


def _cannot_write(writer: StoreWriter, error: DatabaseError) -> str:
    where = f"{writer.spec.database}: cannot write results"
    if error.kind is DatabaseFailure.DISK_FULL:
        return (
            f"{where}: {error.reason}; free space and run again: the results written so far are kept "
            "and the next run does the rest"
        )
    return f"{where} ({error.reason})"


def _drain_ready(outcomes: MemoryObjectReceiveStream[Stored], batch: list[Stored], limit: int) -> None:
    """Take what is already waiting, without blocking; the next receive() reports the end."""
    while len(batch) < limit:
        try:
            batch.append(outcomes.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            return
