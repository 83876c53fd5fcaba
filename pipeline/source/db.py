"""The DuckDB boundary: the one module that imports DuckDB (an import-linter contract holds it).

Every read and write of the package goes through a :class:`Database`: a connection (or a cursor of
one) whose every call translates DuckDB's exceptions once, here, into :class:`DatabaseError` with
DuckDB's reason in one line and without record text, the way httpx maps its transport's exceptions
in one place. Callers that know what the statement was for catch ``DatabaseError`` (never a DuckDB
class) and say so: "cannot load into table ...", "key duckdb_memory_limit: ...". Opening a database,
quoting identifiers and binding named parameters live here too.

All calls block: the callers run them in worker threads, one connection per owner.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal

import duckdb

from pipeline.errors import ConfigError, DatabaseError, DatabaseFailure, DatabaseLockedError
from pipeline.source.lock import already_running, lock_holder

#: DuckDB's buffer pool (it spills to disk beyond it) unless the job sets ``duckdb_memory_limit``.
#: Part of a run's footprint: a job restarted over 10^6 rows peaked at 295-315 MB RSS with 128 MB,
#: 277 MB with this (benchmarks/restart_million.py).
DEFAULT_MEMORY_LIMIT = "96MB"

# Timestamps are stored as plain TIMESTAMP in UTC: TIMESTAMPTZ values need pytz to be read in Python.
UTC_NOW = "timezone('UTC', now())"

Parameters = Mapping[str, Any] | Sequence[Any] | None
Row = tuple[Any, ...]
AppendAction = Literal["upsert", "delete"]

_REASON_LIMIT = 400
_CONVERTED_VALUE = re.compile(r'convert string "(?:[^"\\]|\\.)*"')
# ENOSPC as the C library words it (Linux, macOS), and as Windows does.
_DISK_FULL = re.compile(r"No space left on device|not enough space on the disk", re.IGNORECASE)
_KINDS: tuple[tuple[type[duckdb.Error], DatabaseFailure], ...] = (
    (duckdb.OutOfMemoryException, DatabaseFailure.OUT_OF_MEMORY),
    (duckdb.CatalogException, DatabaseFailure.MISSING),
    (duckdb.IOException, DatabaseFailure.IO),
    (duckdb.ParserException, DatabaseFailure.INVALID),
    (duckdb.BinderException, DatabaseFailure.INVALID),
)


def quote(name: str) -> str:
    """An identifier for SQL text (job names and table names are checked to be plain SQL names too)."""
    return '"' + name.replace('"', '""') + '"'


def bind(sql: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The named parameters ``sql`` uses (``$name``): DuckDB refuses a parameter the query does not use."""
    used = set(re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", sql))
    return {name: value for name, value in values.items() if name in used}


def reason(exc: BaseException, limit: int = _REASON_LIMIT) -> str:
    """DuckDB's message in one line: without the echoed query, its suggestions, its sniffer settings,
    the "Original Line" of a file or the value it could not convert (record text, and often not even
    the line at fault)."""
    text = re.split(r"\n\s*\n|\nLINE \d+:|\nPossible [Ss]olution", str(exc), maxsplit=1)[0]
    kept = [line for line in text.splitlines() if not line.startswith("Original Line:")]
    said = " ".join(" ".join(kept).split())
    said = _CONVERTED_VALUE.sub("convert a value", said)  # the value is record text
    if re.search(r"utf-?8|unicode", said, re.IGNORECASE):
        said += "; the file must be UTF-8 (convert it, e.g. iconv -f latin1 -t utf-8)"
    if disk_full(said):  # DuckDB says it as an I/O or commit failure: say what to do about it
        said = f"the disk is full ({said})"
    return said if len(said) <= limit else said[: limit - 3] + "..."


def disk_full(said: str) -> bool:
    """Whether DuckDB's message says the disk that holds the database (or its WAL, or a spill) is full."""
    return _DISK_FULL.search(said) is not None


def translated_error(exc: duckdb.Error, database: Path | None) -> DatabaseError:
    said = reason(exc)
    kind = next((kind for cls, kind in _KINDS if isinstance(exc, cls)), DatabaseFailure.OTHER)
    return DatabaseError(said, kind=DatabaseFailure.DISK_FULL if disk_full(said) else kind, database=database)


@contextmanager
def _translated(database: Path | None) -> Iterator[None]:
    try:
        yield
    except duckdb.Error as exc:
        raise translated_error(exc, database) from exc


def statement_kinds(sql: str) -> list[str]:
    """The kind of each statement in ``sql`` (``SELECT``, ``DELETE``...), without running any."""
    with _translated(None):
        return [statement.type.name for statement in duckdb.extract_statements(sql)]


class Result:
    """The rows of one executed statement, fetched through the boundary."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection, database: Path) -> None:
        self._cursor = cursor
        self._database = database

    def fetchone(self) -> Row | None:
        with _translated(self._database):
            return self._cursor.fetchone()

    def fetchall(self) -> list[Row]:
        with _translated(self._database):
            return self._cursor.fetchall()

    @property
    def columns(self) -> list[str]:
        return [column[0] for column in self._cursor.description or ()]


class Database:
    """One DuckDB connection, or a cursor of one: the only way the package runs a statement."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: Path) -> None:
        self._connection = connection
        self.path = path

    def execute(self, sql: str, parameters: Parameters = None) -> Result:
        """Run ``sql``; named parameters (a mapping) are bound by name, those it does not use dropped."""
        values = bind(sql, parameters) if isinstance(parameters, Mapping) else parameters
        with _translated(self.path):
            return Result(self._connection.execute(sql, values), self.path)

    def rows(self, sql: str, parameters: Parameters = None) -> list[Row]:
        return self.execute(sql, parameters).fetchall()

    def row(self, sql: str, parameters: Parameters = None) -> Row | None:
        return self.execute(sql, parameters).fetchone()

    def scalar(self, sql: str, parameters: Parameters = None) -> int:
        """The first column of the first row as an integer; NULL or no row reads as 0."""
        row = self.row(sql, parameters)
        return int(row[0]) if row and row[0] is not None else 0

    def counts(self, sql: str, parameters: Parameters = None) -> dict[str, int]:
        """The one row of a counting query, by column name (NULL reads as 0)."""
        result = self.execute(sql, parameters)
        row = result.fetchone() or ()
        return {name: int(value or 0) for name, value in zip(result.columns, row, strict=False)}

    def cursor(self) -> Database:
        """Another cursor of the same database: its own statements, for another owner (thread)."""
        with _translated(self.path):
            return Database(self._connection.cursor(), self.path)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction for the block: committed at its end, rolled back by any exception. A commit
        that fails (a full disk, a conflict) has ended the transaction already: its error is the one
        raised, not that nothing was left to roll back."""
        with _translated(self.path):
            self._connection.begin()
        try:
            yield
        except BaseException:
            with suppress(duckdb.Error):  # the block's error is the one to say, even if this fails too
                self._connection.rollback()
            raise
        with _translated(self.path):
            self._connection.commit()

    def append(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], action: AppendAction
    ) -> None:
        """Rows into ``table`` through DuckDB's appender: ``upsert`` (each row holds ``columns``, then
        its ``created_at``) or ``delete`` (each row is a key of ``columns``)."""
        with _translated(self.path):
            if action == "delete":  # a delete appender buffers exactly its key columns
                appender = self._connection.appender(table, action=action, key=list(columns))
            else:
                appender = self._connection.appender(table, columns=[*columns, "created_at"], action=action)
            appender.append_rows(rows)
            appender.flush()

    def table_names(self) -> set[str]:
        """The database's tables, lower-cased (DuckDB matches table names case-insensitively)."""
        rows = self.rows("SELECT table_name FROM duckdb_tables() WHERE NOT temporary")
        return {str(row[0]).lower() for row in rows}

    def column_names(self, table: str) -> list[str]:
        """A table's columns, lower-cased, in order."""
        return [str(row[0]).lower() for row in self.rows(f"DESCRIBE {quote(table)}")]

    def close(self) -> None:
        with _translated(self.path):
            self._connection.close()

    @contextmanager
    def closed_on_error(self) -> Iterator[Database]:
        """The block that makes this connection ready (checks, attaches, upgrades): an error in it
        closes the connection and goes on, so an opener returns a connection ready to use or none."""
        try:
            yield self
        except BaseException:
            with suppress(DatabaseError):  # the block's error is the one to say, even if this fails too
                self.close()
            raise


def memory_limit_or_default(memory_limit: str | None) -> str:
    """The buffer pool a database opens with: the job's ``duckdb_memory_limit``, None for the default."""
    return memory_limit or DEFAULT_MEMORY_LIMIT


def open_database(
    path: Path, *, read_only: bool = False, memory_limit: str | None = None, made_by: Sequence[str] = ()
) -> Database:
    """Connect, translating "locked by another process" and unreadable files into one clear line.
    ``memory_limit`` None is :data:`DEFAULT_MEMORY_LIMIT`; ``made_by``: the commands that would create
    a database not there yet, which reading it read-only names (the caller knows the job)."""
    if read_only and not path.exists():
        run = f" (run {' or '.join(f'`{command}`' for command in made_by)})" if made_by else ""
        raise ConfigError(f"{path}: database does not exist yet{run}")
    try:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        connection = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        said = reason(exc)
        if "lock" in said.lower():
            if (pid := lock_holder(path)) is not None:
                raise already_running(path, pid) from exc
            raise DatabaseLockedError(f"{path}: database is in use by another process ({said})") from exc
        raise ConfigError(f"{path}: cannot open database ({said})") from exc
    except (duckdb.Error, OSError) as exc:
        raise ConfigError(f"{path}: cannot open database ({reason(exc)})") from exc
    database = Database(connection, path)
    # DuckDB's default buffer pool is 80% of RAM and fills with cached result blocks as a run goes
    # on; a bounded pool keeps the process small (it spills to disk if a query needs more).
    database.execute(f"SET memory_limit = '{memory_limit_or_default(memory_limit)}'")
    return database
