"""The writer task: batches committed as they come, and what it holds when the run is cancelled."""

from __future__ import annotations

from pathlib import Path

import anyio
import orjson
import pytest

from pipeline.extraction.context import RunContext
from pipeline.extraction.outcomes import Extracted, Stored, Usage
from pipeline.run.committer import commit_outcomes
from pipeline.run.stats import RunStats
from pipeline.servers.replies import Reply
from pipeline.store.opening import prepare_database
from pipeline.store.writer import StoreWriter
from tests.support.jobs import make_job, table_rows
from tests.support.runs import WriterRun

pytestmark = pytest.mark.anyio

REPLY = Reply('{"a": 1}', None, "stop", 100, 40, None, 0.1)


def extracted(record_id: int) -> Extracted:
    return Extracted(record_id, orjson.dumps({"id": record_id}).decode(), 1, REPLY, Usage(1), 256, record_id)


async def test_a_cancelled_run_commits_what_finished_before_its_next_flush(tmp_path: Path) -> None:
    """Cancelled from outside (``asyncio.wait_for`` on ``run_job``), the writer used to drop the batch in
    its hands and what waited in the stream: up to half a second of finished records."""
    spec = make_job(tmp_path, records=10)
    writer = StoreWriter(prepare_database(spec), RunContext.of(spec))
    await WriterRun(writer).begin()
    stats = RunStats(pending_at_start=10, concurrency=8)
    send, receive = anyio.create_memory_object_stream[Stored](100)
    async with anyio.create_task_group() as run:
        run.start_soon(commit_outcomes, receive, writer, stats)
        for record_id in range(4):
            await send.send(extracted(record_id))
        await anyio.wait_all_tasks_blocked()  # the writer holds them, its flush is 0.5 s away
        for record_id in range(4, 7):
            send.send_nowait(extracted(record_id))  # and these wait in the stream
        run.cancel_scope.cancel()
    writer.connection.close()
    assert table_rows(spec.database, "SELECT count(*) FROM results") == [(7,)]
    assert stats.now().done == 7
    assert table_rows(spec.database, "SELECT done FROM runs") == [(7,)]  # counted with what it committed
