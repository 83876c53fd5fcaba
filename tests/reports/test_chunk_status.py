"""What `status` says about long records: results merged from chunks, what each pass added, and the
chunks kept for records not finished yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.extraction.context import RunContext
from pipeline.extraction.outcomes import Extracted, Usage
from pipeline.reports.chunk_status import ChunkingStatus, chunking_status
from pipeline.servers.replies import Reply
from pipeline.source.db import open_database
from pipeline.store.opening import prepare_database
from pipeline.store.writer import StoreWriter
from tests.store.test_chunks import chunk
from tests.support.jobs import make_job
from tests.support.runs import WriterRun

pytestmark = pytest.mark.anyio

REPLY = Reply("{}", None, "stop", 100, 10, 0, 0.1)


def merged(record_id: int, chunks: int, added: dict[str, int]) -> Extracted:
    summary = f'{{"field": "description", "chunks": {chunks}, "passes": 2, "added": {added}}}'
    return Extracted(record_id, "{}", 1, REPLY, Usage(1), 256, 9, None, None, summary.replace("'", '"'))


async def test_status_counts_merged_records_passes_and_unfinished_chunks(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5, chunking={"field": "description"})
    run = WriterRun(StoreWriter(prepare_database(spec), RunContext.of(spec)), pending=5)
    await run.begin()
    writer = run.writer
    assert chunking_status(writer.connection, spec) is None  # nothing chunked yet
    await run.write([merged(1, 3, {"1": 40, "2": 4}), merged(2, 5, {"1": 60})])
    await run.write([chunk(3, 1, 1), chunk(3, 1, 2), chunk(1, 1, 1)])  # record 3 is not finished
    writer.connection.close()
    connection = open_database(spec.database, read_only=True)
    try:
        status = chunking_status(connection, spec)
        other = chunking_status(connection, spec.for_variant("other"))
    finally:
        connection.close()
    assert status == ChunkingStatus(2, 8, {1: 100, 2: 4}, unfinished=1, kept=2, passes=2)
    assert other is None
    assert status.describe() == (
        "2 records from 8 chunks; values found by pass 1: 100, pass 2: +4 (+4.0%); "
        "2 chunks kept for 1 record not finished yet"
    )
    assert status.to_json()["added_by_pass"] == {"1": 100, "2": 4}


async def test_a_pass_that_added_nothing_says_so_and_no_split_record_is_said(tmp_path: Path) -> None:
    """With `passes: 2`, a second pass that found nothing new is `pass 2: +0`, not left out (which read
    as if no second pass had run); records that all fit whole say that the passes had nothing to do."""
    spec = make_job(tmp_path, records=5, chunking={"field": "description", "passes": 2})
    run = WriterRun(StoreWriter(prepare_database(spec), RunContext.of(spec)), pending=5)
    await run.begin()
    writer = run.writer
    await run.write([Extracted(4, "{}", 1, REPLY, Usage(1), 256, 9)])  # sent whole
    assert chunking_status(writer.connection, spec) == ChunkingStatus(0, 0, {}, whole=1, passes=2)
    assert chunking_status(writer.connection, spec.for_variant("other")) is None  # no result at all
    await run.write([merged(1, 3, {"1": 40}), merged(2, 5, {"1": 60})])
    status = chunking_status(writer.connection, spec)
    writer.connection.close()
    assert status == ChunkingStatus(2, 8, {1: 100, 2: 0}, whole=1, passes=2)
    assert status.describe() == (
        "2 records from 8 chunks (1 sent whole); values found by pass 1: 100, pass 2: +0 (+0.0%)"
    )
    assert status.to_json()["added_by_pass"] == {"1": 100, "2": 0}
    assert ChunkingStatus(0, 0, {}, whole=1, passes=2).describe() == (
        "no record was split: the 1 done fit whole (passes: 2 applies to split records only)"
    )
