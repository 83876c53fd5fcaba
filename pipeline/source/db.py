"""The DuckDB boundary: opening a database, quoting identifiers, listing tables, and saying what
DuckDB said in one line. Every module that touches DuckDB goes through these."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb

from pipeline.errors import ConfigError, DatabaseLockedError
from pipeline.job.spec import DEFAULT_MEMORY_LIMIT
from pipeline.source.lock import already_running, lock_holder

# Timestamps are stored as plain TIMESTAMP in UTC: TIMESTAMPTZ values need pytz to be read in Python.
UTC_NOW = "timezone('UTC', now())"


def quote(name: str) -> str:
    """An identifier for SQL text (job names and table names are checked to be plain SQL names too)."""
    return '"' + name.replace('"', '""') + '"'


def duckdb_reason(exc: BaseException) -> str:
    """DuckDB's message squeezed to one line."""
    return " ".join(str(exc).split())


def open_database(
    path: Path, *, read_only: bool = False, memory_limit: str = DEFAULT_MEMORY_LIMIT
) -> duckdb.DuckDBPyConnection:
    """Connect, translating "locked by another process" and unreadable files into one clear line."""
    if read_only and not path.exists():
        raise ConfigError(f"{path}: database does not exist yet (run `pipeline load` or `pipeline run`)")
    try:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        connection = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        text = duckdb_reason(exc)
        if "lock" in text.lower():
            if (pid := lock_holder(path)) is not None:
                raise already_running(path, pid) from exc
            raise DatabaseLockedError(f"{path}: database is in use by another process ({text})") from exc
        raise ConfigError(f"{path}: cannot open database ({text})") from exc
    except (duckdb.Error, OSError) as exc:
        raise ConfigError(f"{path}: cannot open database ({duckdb_reason(exc)})") from exc
    # DuckDB's default buffer pool is 80% of RAM and fills with cached result blocks as a run goes
    # on; a bounded pool keeps the process small (it spills to disk if a query needs more).
    connection.execute(f"SET memory_limit = '{memory_limit}'")
    return connection


def table_names(connection: duckdb.DuckDBPyConnection) -> set[str]:
    """The database's tables, lower-cased (DuckDB matches table names case-insensitively). Blocking."""
    rows = connection.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()
    return {str(row[0]).lower() for row in rows}


def column_names(connection: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """A table's columns, lower-cased, in order. Blocking."""
    rows = connection.execute(f"DESCRIBE {quote(table)}").fetchall()
    return [str(row[0]).lower() for row in rows]


def bind(sql: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The named parameters ``sql`` uses (``$name``): DuckDB refuses a parameter the query does not use."""
    used = set(re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", sql))
    return {name: value for name, value in values.items() if name in used}
