"""Pending records, streamed from DuckDB in batches, off the event loop.

Pending = the source minus ids already in results (and, unless ``--retry-failed``, minus ids whose
failure is permanent). The subtraction is one SQL anti-join over the ids alone, streamed; each batch
of pending ids then fetches its records' fields. Selecting the fields in the anti-join itself made
DuckDB read every record's text before the first row came out (3.5 s, and past a 128 MB memory
limit, for 10^6 records with 9x10^5 done). Resuming never loads results into Python and memory stays
flat whatever the table size.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import duckdb
from anyio.abc import ObjectSendStream

from pipeline.errors import PERMANENT_FAILURE_CLASSES, ConfigError, FailureClass
from pipeline.job import JobSpec
from pipeline.outcomes import SourceRecord

T = TypeVar("T")


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def source_relation(spec: JobSpec) -> str:
    """The source as something a FROM clause accepts."""
    if spec.source.query is not None:
        return f"({_single_select(spec)})"
    assert spec.source.table is not None
    return quote(spec.source.table)


def _single_select(spec: JobSpec) -> str:
    """``source.query`` as one SELECT: a query that closes the parenthesis it is put in cannot run
    a second statement (``SELECT 1) ; DROP TABLE results; SELECT (1``). A trailing ``;`` is dropped."""
    assert spec.source.query is not None
    query = spec.source.query.strip().rstrip(";").rstrip()
    where = f"{spec.source_file}: key source.query"
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ConfigError(f"{where} fails: {' '.join(str(exc).split())}") from exc
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kinds = ", ".join(statement.type.name for statement in statements) or "nothing"
        raise ConfigError(f"{where} must be one SELECT statement, not: {kinds}")
    return query


def pending_sql(spec: JobSpec, *, retry: Collection[FailureClass] = (), limit: int | None = None) -> str:
    """Select the id of every record still to do; failures of the ``retry`` classes count as to do."""
    out, src = spec.output, spec.source
    skipped = sorted(PERMANENT_FAILURE_CLASSES - set(retry))
    listed = ", ".join(f"'{failure_class}'" for failure_class in skipped)  # enum values, not input
    skip_failed = (
        f" AND NOT EXISTS (SELECT 1 FROM {quote(out.failures_table)} f "
        f"WHERE f.record_id = s.{quote(src.id_column)} AND f.failure_class IN ({listed}))"
        if skipped
        else ""
    )
    return (
        f"SELECT s.{quote(src.id_column)} FROM {source_relation(spec)} s "
        f"WHERE NOT EXISTS (SELECT 1 FROM {quote(out.results_table)} r "
        f"WHERE r.record_id = s.{quote(src.id_column)}){skip_failed}"
        + (f" LIMIT {int(limit)}" if limit is not None else "")
    )


def records_sql(spec: JobSpec) -> str:
    """Select the id and the prompt fields of the records whose ids are the list parameter."""
    src = spec.source
    columns = ", ".join(f"s.{quote(name)}" for name in src.fields)
    return (
        f"SELECT s.{quote(src.id_column)}, {columns} FROM {source_relation(spec)} s "
        f"WHERE s.{quote(src.id_column)} IN (SELECT unnest($ids))"
    )


@dataclass(frozen=True, slots=True)
class SourceShape:
    id_type: str
    columns: tuple[str, ...]


def describe_source(connection: duckdb.DuckDBPyConnection, spec: JobSpec) -> SourceShape:
    """Check the source has the id column and every prompt field, with usable ids. Blocking."""
    where = f"{spec.source_file}: source in {spec.database}"
    try:
        described = connection.execute(f"DESCRIBE SELECT * FROM {source_relation(spec)}").fetchall()
    except duckdb.CatalogException as exc:
        if spec.source.table is None:
            raise ConfigError(f"{where}: key source.query fails: {' '.join(str(exc).split())}") from exc
        raise ConfigError(
            f"{where}: table '{spec.source.table}' does not exist (key source.table); "
            f"load records with `pipeline load FILE --job {spec.source_file}`"
        ) from exc
    except duckdb.Error as exc:
        raise ConfigError(f"{where}: key source.query fails: {' '.join(str(exc).split())}") from exc
    types = {str(row[0]).lower(): str(row[1]) for row in described}
    missing = [name for name in (spec.source.id_column, *spec.source.fields) if name.lower() not in types]
    if missing:
        raise ConfigError(
            f"{where}: the source has no column {missing} (keys source.id_column / source.fields); "
            f"it has {sorted(types)}"
        )
    _check_ids(connection, spec, where)
    return SourceShape(id_type=types[spec.source.id_column.lower()], columns=tuple(types))


def _check_ids(connection: duckdb.DuckDBPyConnection, spec: JobSpec, where: str) -> None:
    id_column = quote(spec.source.id_column)
    relation = source_relation(spec)
    row = connection.execute(f"SELECT count(*) FROM {relation} WHERE {id_column} IS NULL").fetchone()
    if row is not None and row[0]:
        raise ConfigError(f"{where}: {row[0]} records have a NULL id in column {spec.source.id_column}")
    duplicates = connection.execute(
        f"SELECT {id_column} FROM {relation} GROUP BY ALL HAVING count(*) > 1 LIMIT 5"
    ).fetchall()
    if duplicates:
        shown = ", ".join(repr(dup[0]) for dup in duplicates)
        raise ConfigError(f"{where}: ids are not unique in column {spec.source.id_column} (e.g. {shown})")


class SourceReader:
    """Owns one DuckDB cursor; every call on it runs in a worker thread, one at a time."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, spec: JobSpec) -> None:
        self._cursor = connection
        self._spec = spec
        self._limiter = anyio.CapacityLimiter(1)

    async def _call(self, function: Callable[..., T], *args: object) -> T:
        return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)

    async def count_pending(self, *, retry: Collection[FailureClass] = (), limit: int | None = None) -> int:
        sql = f"SELECT count(*) FROM ({pending_sql(self._spec, retry=retry, limit=limit)})"
        row = await self._call(lambda: self._cursor.execute(sql).fetchone())
        return int(row[0]) if row else 0

    async def stream_pending(
        self,
        send: ObjectSendStream[SourceRecord],
        *,
        retry: Collection[FailureClass] = (),
        limit: int | None = None,
    ) -> None:
        """Send every pending record, then close ``send``. Backpressure comes from the bounded stream."""
        ids_sql = pending_sql(self._spec, retry=retry, limit=limit)
        fields_sql = records_sql(self._spec)
        names = self._spec.source.fields
        batch_size = self._spec.source.batch_size
        fetcher = await self._call(self._cursor.cursor)  # a second cursor: the ids query stays open
        try:
            async with send:
                await self._call(lambda: self._cursor.execute(ids_sql))
                while ids := await self._call(lambda: self._cursor.fetchmany(batch_size)):
                    rows = await self._call(_fetch, fetcher, fields_sql, [row[0] for row in ids])
                    for row in rows:
                        await send.send(SourceRecord(row[0], dict(zip(names, row[1:], strict=True))))
        finally:
            with anyio.CancelScope(shield=True):
                await self._call(fetcher.close)


def _fetch(cursor: duckdb.DuckDBPyConnection, sql: str, ids: list[object]) -> list[tuple[Any, ...]]:
    return cursor.execute(sql, {"ids": ids}).fetchall()
