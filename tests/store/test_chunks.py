"""The chunks of long records: kept by the writer as each finishes, read back only for the same text and
the same job, and counted in the run's totals once (as chunks, not again in the merged result)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeline.extraction.context import RunContext
from pipeline.extraction.outcomes import ChunkDone, Extracted, Usage
from pipeline.job.spec import JobSpec
from pipeline.servers.replies import Reply
from pipeline.source.versions import version_of
from pipeline.store.chunks import ChunkStore
from pipeline.store.opening import prepare_database
from pipeline.store.writer import StoreWriter
from tests.support.jobs import make_job, table_rows
from tests.support.runs import WriterRun

pytestmark = pytest.mark.anyio

REPLY = Reply('{"skills": []}', None, "stop", 300, 40, 0, 0.5)
GROUNDING = [{"path": "skills", "value": "SQL", "source_field": "description", "start": 1200, "end": 1203}]


def chunk(record_id: int, pass_: int, number: int, content_hash: int = 9, start: int = 0) -> ChunkDone:
    result = Extracted(
        record_id,
        orjson.dumps({"skills": [f"skill {number}"]}).decode(),
        2,
        REPLY,
        Usage(2, 600, 80, 0, 1.0),
        512,
        content_hash,
        orjson.dumps(GROUNDING).decode(),
        "test-model",
    )
    return ChunkDone(record_id, pass_, number, 3, start + 1000 * (number - 1), start + 1000 * number, result)


def job(folder: Path, **overrides: object) -> JobSpec:
    return make_job(folder, records=5, chunking={"field": "description"}, **overrides)


async def started(spec: JobSpec) -> WriterRun:
    run = WriterRun(StoreWriter(prepare_database(spec), RunContext.of(spec)), pending=5)
    await run.begin()
    return run


async def test_kept_chunks_are_read_back_as_they_were_written(tmp_path: Path) -> None:
    spec = job(tmp_path)
    run = await started(spec)
    writer = run.writer
    written = [chunk(1, 1, 1), chunk(1, 1, 2), chunk(1, 2, 1), chunk(2, 1, 1)]
    await run.write(written)
    await run.write([chunk(1, 1, 2)])  # done again (a redo): replaced, not doubled
    store = await ChunkStore.open(writer.connection, RunContext.of(spec))
    try:
        read = await store.finished(1, 9)
    finally:
        await store.aclose()
    assert [(done.pass_, done.chunk) for done in read] == [(1, 1), (1, 2), (2, 1)]
    first = read[0]
    assert (first.record_id, first.chunks, first.start, first.end) == (1, 3, 0, 1000)
    assert first.result.data_json == '{"skills":["skill 1"]}'
    assert orjson.loads(first.result.grounding_json or "") == GROUNDING
    assert (first.result.attempts, first.result.max_tokens, first.result.model) == (2, 512, "test-model")
    assert first.result.usage == Usage(2, 600, 80, 0, 1.0)
    assert (first.result.reply.prompt_tokens, first.result.reply.finish_reason) == (300, "stop")
    writer.connection.close()
    rows = table_rows(
        spec.database, "SELECT count(*), min(run_id), any_value(settings_hash) FROM results_chunks"
    )
    assert rows == [(4, 1, version_of(spec).chunked_settings_hash)]


async def test_only_chunks_of_the_same_text_and_the_same_job_are_taken(tmp_path: Path) -> None:
    spec = job(tmp_path)
    run = await started(spec)
    writer = run.writer
    await run.write([chunk(1, 1, 1), chunk(1, 1, 2, content_hash=8)])
    edited = spec.with_overrides(prompt={"system": "Extract it all."})
    assert spec.chunking is not None
    rechunked = spec.model_copy(update={"chunking": spec.chunking.model_copy(update={"passes": 2})})
    for other, content_hash, expected in [
        (spec, 9, [1]),  # the text chunk 2 came from has changed since
        (spec, 8, [2]),
        (edited, 9, []),  # another prompt
        (rechunked, 9, []),  # other chunking settings
        (spec.for_variant("other"), 9, []),  # another variant's
    ]:
        store = await ChunkStore.open(writer.connection, RunContext.of(other))
        try:
            assert [done.chunk for done in await store.finished(1, content_hash)] == expected
        finally:
            await store.aclose()
    writer.connection.close()


async def test_the_runs_numbers_count_a_long_record_once_and_its_chunks_apart(tmp_path: Path) -> None:
    """Each chunk counts as a chunk done as it is kept, the merged result as one done record; the
    requests and tokens are the run's as it sent them, not added up from the outcomes again."""
    spec = job(tmp_path)
    run = await started(spec)
    writer = run.writer
    chunks = [chunk(1, 1, 1), chunk(1, 1, 2)]
    await run.write(chunks)
    merged = Extracted(
        1,
        '{"skills": []}',
        4,
        REPLY,
        Usage(4, 1200, 160, 0, 2.0),
        512,
        9,
        None,
        "test-model",
        '{"chunks": 2}',
    )
    await run.write([merged])
    assert (run.numbers.done, run.numbers.chunks_done, run.numbers.attempts) == (1, 2, 0)
    writer.connection.close()
    assert table_rows(spec.database, "SELECT done, chunks_done, attempts FROM runs") == [(1, 2, 0)]
    stored = table_rows(spec.database, "SELECT chunks, total_prompt_tokens, settings_hash FROM results")
    assert stored == [('{"chunks": 2}', 1200, version_of(spec).chunked_settings_hash)]
