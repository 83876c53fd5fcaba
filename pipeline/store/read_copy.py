"""The read copy: what readers open while a run holds the database.

DuckDB lets one process open a database file while another writes it, not even read-only, and a
backlog run holds it for a day and more. So the run keeps a copy for readers beside the database:

* ``<database>.read.duckdb``: the output tables (results, their history, failures, runs) and a row
  ``_read_copy`` saying when the copy was taken and by which run. The run writes it on a timer and
  when a reader asks (:func:`request_copy`), from a cursor of its own in a worker thread: one
  consistent read of the tables (DuckDB's MVCC), while the writer goes on committing.
* ``<database>.read-source.duckdb``: the other tables (the source), once per run: a run does not
  change them, and a second writer cannot (the run holds the file).

Each is written to a temporary file and renamed into place, so a reader sees the last whole copy or
the one before, never half of one, even when the run is killed in the middle of writing. A reader
opens the copy read-only with the source attached (:func:`open_read_copy`) and runs the same SQL it
runs on the database. The run removes both copies when it ends: from then on readers open the
database again.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from pipeline.errors import DatabaseLockedError
from pipeline.job.spec import JobSpec
from pipeline.source.db import Database, open_database, quote
from pipeline.store.tables import output_table_names

log = structlog.get_logger("pipeline.store.read_copy")

#: Chaos testing only: hold each copy half-written this long, logging CHAOS_LINE first.
CHAOS_READ_COPY_DELAY_ENV = "PIPELINE_CHAOS_READ_COPY_DELAY_S"
CHAOS_LINE = "chaos: read copy half-written"
COPY_TABLE = "_read_copy"
SOURCE_ALIAS = "read_source"
#: A reader that finds a copy younger than this uses it at once; else it asks the run for a new one.
FRESH_S = 5.0
#: How long a reader waits for the copy it asked for before it reads the last one (or gives up).
WAIT_S = 30.0
_POLL_S = 0.2


def copy_path(database: Path) -> Path:
    return database.with_name(database.name + ".read.duckdb")


def source_copy_path(database: Path) -> Path:
    return database.with_name(database.name + ".read-source.duckdb")


def request_path(database: Path) -> Path:
    return database.with_name(database.name + ".read.request")


@dataclass(frozen=True, slots=True)
class ReadCopy:
    """Where a reader's numbers come from when a run holds the database."""

    as_of: dt.datetime  # UTC, when the copy was taken
    run_id: int  # the run in progress that took it

    def age_s(self, now: dt.datetime | None = None) -> float:
        return max(0.0, ((now or dt.datetime.now(dt.UTC)) - self.as_of).total_seconds())

    def describe(self, now: dt.datetime | None = None) -> str:
        local = self.as_of.astimezone().strftime("%H:%M:%S")
        return f"as of {local}, {self.age_s(now):.0f} s ago, run #{self.run_id} in progress"

    def to_json(self) -> dict[str, Any]:
        return {"as_of": self.as_of.isoformat(), "age_s": round(self.age_s(), 1), "run_id": self.run_id}


def read_copy_of(connection: Database) -> ReadCopy | None:
    """The copy ``connection`` reads, or None when it reads the database itself."""
    if COPY_TABLE not in connection.table_names():
        return None
    row = connection.row(f"SELECT as_of, run_id FROM {COPY_TABLE}")
    if row is None:
        return None
    return ReadCopy(row[0].replace(tzinfo=dt.UTC), int(row[1]))


# --- the run's side ----------------------------------------------------------------------------------


def write_copy(connection: Database, spec: JobSpec, run_id: int) -> float:
    """Write the read copy of the output tables (and, if missing, of the source) from ``connection``, a
    cursor the caller owns; return the seconds it took. Blocking."""
    started = time.perf_counter()
    outputs = output_table_names(spec)
    if not source_copy_path(spec.database).exists():
        every = connection.rows(
            "SELECT table_name FROM duckdb_tables() "
            "WHERE database_name = current_database() AND NOT temporary"
        )
        others = sorted({str(name) for (name,) in every} - set(outputs), key=str.lower)
        _copy_tables(connection, others, source_copy_path(spec.database), None)
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    _copy_tables(connection, outputs, copy_path(spec.database), (now, run_id))
    return time.perf_counter() - started


def _copy_tables(
    connection: Database, tables: Sequence[str], path: Path, stamp: tuple[dt.datetime, int] | None
) -> None:
    """``tables`` into a new database at ``path``, in one read of them, then renamed into place."""
    temporary = path.with_name(f"{path.name}.tmp-{secrets.token_hex(4)}")
    alias = f"copy_{secrets.token_hex(4)}"
    connection.execute(f"ATTACH {_literal(temporary)} AS {alias}")
    try:
        with connection.transaction():
            for table in tables:
                connection.execute(
                    f"CREATE TABLE {alias}.{quote(table)} AS SELECT * FROM main.{quote(table)}"
                )
            if stamp is not None:
                connection.execute(
                    f"CREATE TABLE {alias}.{COPY_TABLE} AS SELECT ?::TIMESTAMP AS as_of, ? AS run_id",
                    list(stamp),
                )
                _chaos_pause()
    finally:
        connection.execute(f"DETACH {alias}")
    os.replace(temporary, path)


def _chaos_pause() -> None:
    """Tests only: hold a copy half-written, so a kill -9 can land in the middle of one."""
    delay = float(os.environ.get(CHAOS_READ_COPY_DELAY_ENV) or 0)
    if delay:
        log.warning(CHAOS_LINE)
        time.sleep(delay)


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def copy_requested(database: Path) -> bool:
    return request_path(database).exists()


def clear_request(database: Path) -> None:
    request_path(database).unlink(missing_ok=True)


def remove_copies(database: Path) -> None:
    """The copies, their request and any temporary file a killed run left: readers open the database."""
    for path in (copy_path(database), source_copy_path(database), request_path(database)):
        path.unlink(missing_ok=True)
    for leftover in database.parent.glob(f"{database.name}.read*.duckdb.tmp-*"):
        leftover.unlink(missing_ok=True)


# --- the reader's side -------------------------------------------------------------------------------


def request_copy(database: Path) -> float:
    """Ask the run for a new copy; return the time asked (copies written after it answer)."""
    asked = time.time()
    request_path(database).write_bytes(b"")
    return asked


def _copy_time(database: Path) -> float | None:
    try:
        return copy_path(database).stat().st_mtime
    except OSError:
        return None


def wait_for_copy(database: Path, wait_s: float = WAIT_S) -> bool:
    """Use the copy as it is when it is fresh; else ask for a new one and wait up to ``wait_s`` for it.
    Whether some copy exists to read."""
    written = _copy_time(database)
    if written is not None and time.time() - written < FRESH_S:
        return True
    asked = request_copy(database)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        written = _copy_time(database)
        if written is not None and written >= asked:
            return True
        time.sleep(_POLL_S)
    return _copy_time(database) is not None


def open_read_copy(spec: JobSpec, locked: DatabaseLockedError, wait_s: float = WAIT_S) -> Database:
    """The read copy, read-only, with the source copy attached and visible under its own names. Raises
    ``locked`` (the run holds the database) when the run has written no copy."""
    database = spec.database
    if not wait_for_copy(database, wait_s) or not source_copy_path(database).exists():
        raise DatabaseLockedError(
            f"{locked} and has written no read copy yet: try again in a minute"
        ) from locked
    connection = open_database(copy_path(database), read_only=True, memory_limit=spec.duckdb_memory_limit)
    with connection.closed_on_error():
        connection.execute(f"ATTACH {_literal(source_copy_path(database))} AS {SOURCE_ALIAS} (READ_ONLY)")
        rows = connection.rows(
            f"SELECT table_name FROM duckdb_tables() WHERE database_name = '{SOURCE_ALIAS}'"
        )
        for (table,) in rows:
            connection.execute(
                f"CREATE TEMP VIEW {quote(table)} AS SELECT * FROM {SOURCE_ALIAS}.{quote(table)}"
            )
    return connection
