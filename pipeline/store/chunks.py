"""The chunks of long records in the chunks table (:func:`~pipeline.store.tables.chunks_table`): the row
the writer keeps for each finished chunk, and reading back those a record already has, so a run that
stopped mid-document asks only for the chunks it did not finish.

A kept chunk is taken again only when it was made from the same text by the same job: the record's
content hash and the whole version key (prompt, schema, a model of the job, the settings with the
chunking settings) must be today's, and the chunk must be the same span of the field (the caller
compares spans, which depend on the context and the tokenizer).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio

from pipeline.errors import DatabaseError, FatalRunError
from pipeline.extraction.context import RunContext
from pipeline.extraction.outcomes import ChunkDone, Extracted, Usage
from pipeline.job.spec import JobSpec
from pipeline.servers.replies import Reply
from pipeline.source.db import Database, quote
from pipeline.source.reader import RecordId
from pipeline.source.versions import JobVersion
from pipeline.store.tables import chunks_table


def chunk_row(
    done: ChunkDone, spec: JobSpec, version: JobVersion, run_id: int, now: dt.datetime
) -> list[Any]:
    """A finished chunk as a row of :data:`~pipeline.store.tables.CHUNK_COLUMNS`, then ``created_at``."""
    result, reply, usage = done.result, done.result.reply, done.result.usage
    return [
        spec.variant,
        done.record_id,
        done.pass_,
        done.chunk,
        done.chunks,
        done.start,
        done.end,
        run_id,
        result.data_json,
        result.attempts,
        reply.prompt_tokens,
        reply.completion_tokens,
        reply.reasoning_tokens,
        reply.latency_s,
        reply.finish_reason,
        result.max_tokens,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.reasoning_tokens,
        usage.latency_s,
        result.grounding_json,
        *version.key_values(result.content_hash, result.model, chunked=True),
        now,
    ]


_STORED = (
    "pass, chunk, chunk_count, chunk_start, chunk_end, extracted, attempts, prompt_tokens, "
    "completion_tokens, reasoning_tokens, latency_s, finish_reason, max_tokens, total_prompt_tokens, "
    "total_completion_tokens, total_reasoning_tokens, total_latency_s, grounding, content_hash, model"
)


def _as_done(record_id: RecordId, row: tuple[Any, ...]) -> ChunkDone:
    (pass_, chunk, chunks, start, end, extracted, attempts, prompt, completion, reasoning, latency) = row[:11]
    finish_reason, max_tokens, total_prompt, total_completion, total_reasoning, total_latency = row[11:17]
    grounding, content_hash, model = row[17:]
    usage = Usage(
        attempts, total_prompt or 0, total_completion or 0, total_reasoning or 0, total_latency or 0
    )
    reply = Reply(None, None, finish_reason, prompt, completion, reasoning, latency or 0.0)
    result = Extracted(
        record_id, extracted, attempts, reply, usage, max_tokens, content_hash, grounding, model
    )
    return ChunkDone(record_id, pass_, chunk, chunks, start, end, result)


class ChunkStore:
    """Reads the kept chunks of one record at a time, on its own cursor of the run's connection, in a
    worker thread (one read at a time): the writer keeps writing meanwhile."""

    def __init__(self, cursor: Database, context: RunContext) -> None:
        spec, version = context.spec, context.version
        self._cursor = cursor
        self._limiter = anyio.CapacityLimiter(1)
        self._parameters = {**version.parameters(), "variant": spec.variant}
        self._sql = (
            f"SELECT {_STORED} FROM {quote(chunks_table(spec))} WHERE variant = $variant "
            "AND record_id = $record_id AND content_hash = $content_hash "
            "AND content_fields = $content_fields AND prompt_hash = $prompt_hash "
            "AND schema_hash = $schema_hash AND settings_hash = $chunked_settings_hash "
            "AND list_contains($models, model) ORDER BY pass, chunk"
        )

    @classmethod
    async def open(cls, connection: Database, context: RunContext) -> ChunkStore:
        return cls(await anyio.to_thread.run_sync(connection.cursor), context)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._cursor.close, limiter=self._limiter)

    async def finished(self, record_id: RecordId, content_hash: int | None) -> list[ChunkDone]:
        """The chunks of ``record_id`` kept from its text as it is (``content_hash``) by today's job."""
        parameters = {**self._parameters, "record_id": record_id, "content_hash": content_hash}
        try:
            rows = await anyio.to_thread.run_sync(
                self._cursor.rows, self._sql, parameters, limiter=self._limiter
            )
        except DatabaseError as error:  # the run stops; what it finished is saved
            raise FatalRunError(
                f"cannot read the kept chunks of record {record_id} ({error.reason})"
            ) from error
        return [_as_done(record_id, row) for row in rows]
