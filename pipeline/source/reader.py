"""The job's source in DuckDB: checking it, and streaming the pending records in batches, off the
event loop.

What is pending is decided in :mod:`pipeline.source.pending`, in two phases. The ids of each phase are one
streamed query over ids and version columns; each batch of pending ids then fetches its records'
fields and content hash. Selecting the fields in the id query itself made DuckDB read every record's
text before the first row came out (3.5 s, and past a 128 MB memory limit, for 10^6 records with
9x10^5 done). Content changes need the text hashed: that phase's ids are collected into a temporary
table by a query that runs in the background from the start, so the first requests never wait for it.
Each phase's blank records (:mod:`pipeline.source.blank`) are then set aside from its ids, reading the
text of those ids alone: they are never sent, and counted apart (:attr:`SourceReader.blank`).
Memory stays flat whatever the table size: no result or record text is held beyond a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from anyio.abc import ObjectSendStream

from pipeline.errors import DatabaseError, FatalRunError
from pipeline.source.blank import BlankRecords, read_blank_ids
from pipeline.source.db import Database, quote
from pipeline.source.pending import PendingQueries
from pipeline.source.versions import JOB_CAUSES, read_stale_counts

T = TypeVar("T")
RecordId = int | str
_METADATA_TABLE = "pipeline_pending_metadata"
_CHANGED_TABLE = "pipeline_changed_content"
_CONTENT_TABLE = "pipeline_pending_content"


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One pending record as the stream hands it to a worker."""

    id: RecordId
    fields: Mapping[str, object]
    content_hash: int | None = None  # of the prompt fields as sent (pipeline.source.versions), from DuckDB
    # A record that failed truncated before: the budget of that last attempt, to start above it.
    truncated_at_max_tokens: int | None = None
    # A record that failed too_long before, under today's job and on today's text: the server's count of
    # its prompt then, and the tokens its answer was cut off at with all the room the context left.
    counted_prompt_tokens: int | None = None
    answer_cut_at: int | None = None


class _Cursor:
    """One DuckDB cursor and the thread it runs in, one call at a time."""

    def __init__(self, cursor: Database) -> None:
        self.cursor = cursor
        self._limiter = anyio.CapacityLimiter(1)

    async def call(self, function: Callable[..., T], *args: object) -> T:
        try:
            return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)
        except DatabaseError as error:  # e.g. out of memory: finished records are saved, the run stops
            raise FatalRunError(
                f"cannot read the pending records ({error.reason}); "
                "if DuckDB ran out of memory, raise duckdb_memory_limit in the job"
            ) from error

    async def scalar(self, sql: str, parameters: dict[str, Any]) -> int:
        return await self.call(self.cursor.scalar, sql, parameters)


class SourceReader:
    """Counts and streams one run's pending records. It owns three cursors of ``connection``: the
    metadata ids, the content ids (a temporary table lives on it) and the record fetches."""

    def __init__(self, cursors: tuple[Database, ...], queries: PendingQueries) -> None:
        self._queries = queries
        self._parameters = queries.parameters()
        self._ids, self._content, self._fetcher = (_Cursor(cursor) for cursor in cursors)
        self._metadata_count: int | None = None
        self._content_count: int | None = None
        self._content_lock = anyio.Lock()
        self._blank = BlankRecords(queries.spec.content_fields())

    @classmethod
    async def open(cls, connection: Database, queries: PendingQueries) -> SourceReader:
        cursors = await anyio.to_thread.run_sync(lambda: tuple(connection.cursor() for _ in range(3)))
        return cls(cursors, queries)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for cursor in (self._ids, self._content, self._fetcher):
                await cursor.call(cursor.cursor.close)

    @property
    def blank(self) -> BlankRecords:
        """The records the phases counted so far set aside, being blank: never sent."""
        return self._blank

    async def count_metadata(self) -> int:
        """New records, failures to retry, and (with --redo-stale) stale results, blank ones set aside:
        no other record's text is read.

        The ids go into a temporary table that the stream then reads: the query's hash tables (every
        result's id) are freed at once instead of being held for as long as the phase streams."""
        sql = f"CREATE OR REPLACE TEMP TABLE {_METADATA_TABLE} AS {self._queries.ids_sql('metadata')}"
        await self._ids.call(self._ids.cursor.execute, sql, self._parameters)
        await self._set_aside_blank(self._ids, _METADATA_TABLE)
        self._metadata_count = await self._ids.scalar(f"SELECT count(*) FROM {_METADATA_TABLE}", {})
        return self._metadata_count

    async def _set_aside_blank(self, ids: _Cursor, table: str) -> None:
        """Take the blank records out of ``table`` (a phase's ids), counting them."""
        self._blank = self._blank.plus(await ids.call(self._blank_taken_out, ids.cursor, table))

    def _blank_taken_out(self, cursor: Database, table: str) -> BlankRecords:
        blank, id_column = f"{table}_blank", self._queries.spec.source.id_column
        found = f"CREATE OR REPLACE TEMP TABLE {blank} AS {self._queries.blank_among_sql(table)}"
        cursor.execute(found, self._parameters)
        counted = read_blank_ids(cursor, f"SELECT * FROM {blank}", id_column, self._blank.fields)
        if counted:
            cursor.execute(f"DELETE FROM {table} WHERE {quote(id_column)} IN (SELECT * FROM {blank})")
        cursor.execute(f"DROP TABLE {blank}")
        return counted

    @property
    def content_counted(self) -> bool:
        return self._content_count is not None

    async def count_content(self) -> int:
        """Records whose prompt fields changed: hashes every record's text once, keeping the ids.
        Later calls (and the stream) reuse that."""
        async with self._content_lock:
            if self._content_count is None:
                self._content_count = await self._collect_content_ids()
            return self._content_count

    async def _collect_content_ids(self) -> int:
        """The changed ids into a temporary table first (the text hashing needs the memory), then the
        ones the metadata phase does not take anyway: the stream reads them from there."""
        if not self._queries.has_content_phase:
            return 0
        changed = f"CREATE OR REPLACE TEMP TABLE {_CHANGED_TABLE} AS {self._queries.changed_sql()}"
        pending = (
            f"CREATE OR REPLACE TEMP TABLE {_CONTENT_TABLE} AS "
            f"{self._queries.ids_sql('content', changed=_CHANGED_TABLE)}"
        )
        cursor = self._content.cursor
        for sql in (changed, pending):
            await self._content.call(cursor.execute, sql, self._parameters)
        await self._set_aside_blank(self._content, _CONTENT_TABLE)
        return await self._content.scalar(f"SELECT count(*) FROM {_CONTENT_TABLE}", {})

    async def any_stale(self) -> bool:
        """Whether some result of this variant is stale because the job changed: one scan of small
        columns that stops at the first, where the full count joins and groups every result."""
        sql = self._queries.any_stale_sql()
        row = await self._ids.call(self._ids.cursor.row, sql, self._parameters)
        return row is not None

    async def count_stale(self) -> dict[str, int]:
        """Results of this variant that are stale because the job changed: ``total`` and the non-zero
        causes (one result can have several); empty if none. No record text is read."""
        queries = self._queries

        def read() -> dict[str, int]:
            counts = read_stale_counts(self._ids.cursor, queries.spec, queries.version)
            if not counts["stale"]:
                return {}
            by_cause = {str(cause): counts[str(cause)] for cause in JOB_CAUSES if counts[str(cause)]}
            return {"total": counts["stale"], **by_cause}

        return await self._ids.call(read)

    async def stream_pending(self, send: ObjectSendStream[SourceRecord]) -> None:
        """Send every pending record (metadata phase first, as counted by :meth:`count_metadata`), then
        close ``send``. Backpressure comes from the bounded stream; the selection's limit holds over
        both phases."""
        limit = self._queries.selection.limit
        if self._metadata_count is None:
            await self.count_metadata()
        async with send:
            sent = await self._stream_ids(self._ids, _METADATA_TABLE, send, limit)
            if limit is not None and sent >= limit:
                return
            if await self.count_content():
                left = None if limit is None else limit - sent
                await self._stream_ids(self._content, _CONTENT_TABLE, send, left)

    async def _stream_ids(
        self, ids: _Cursor, table: str, send: ObjectSendStream[SourceRecord], limit: int | None
    ) -> int:
        """Page through the ids collected in ``table``, fetching each page's records. Each page is its
        own short read: a read held open for the whole run would keep DuckDB from freeing the old
        versions of the rows the writer changes meanwhile (its memory grew by ~1 KB a record)."""
        batch_size = self._queries.spec.source.batch_size
        names = self._queries.spec.source.fields
        fields_sql = self._queries.records_sql()
        page = f"SELECT rowid, * FROM {table} WHERE rowid > $after ORDER BY rowid LIMIT {batch_size}"
        sent, after = 0, -1
        while ids_batch := await ids.call(ids.cursor.rows, page, {"after": after}):
            after = ids_batch[-1][0]
            wanted = [row[1] for row in ids_batch][: None if limit is None else limit - sent]
            parameters = {**self._parameters, "ids": wanted}
            rows = await self._fetcher.call(self._fetcher.cursor.rows, fields_sql, parameters)
            for row in rows:
                values = dict(zip(names, row[1 : 1 + len(names)], strict=True))
                await send.send(SourceRecord(row[0], values, *row[1 + len(names) :]))
            sent += len(rows)
            if limit is not None and sent >= limit:
                break
        return sent


def longest_pending(connection: Database, queries: PendingQueries, top: int) -> list[SourceRecord]:
    """The ``top`` pending records with the longest prompts (:meth:`PendingQueries.longest_sql`), longest
    first: what a check fits to the context before a run meets them. Blocking."""
    names = queries.spec.source.fields
    rows = connection.rows(queries.longest_sql(top), queries.parameters())
    return [SourceRecord(row[0], dict(zip(names, row[1:], strict=True))) for row in rows]
