"""``pipeline status``: done / failed / pending, and the rate and ETA of the last run.

While a run holds the database, DuckDB lets no other process open it, so the status comes from the
progress snapshot the run keeps beside the database instead.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import duckdb

from pipeline.errors import DatabaseLockedError
from pipeline.job import JobSpec
from pipeline.progress import read_snapshot
from pipeline.source import pending_sql, quote, source_relation
from pipeline.store import open_database, table_names


@dataclass(frozen=True, slots=True)
class JobStatus:
    database: str
    source_records: int | None = None
    done: int | None = None
    failed: dict[str, int] = field(default_factory=dict)
    pending: int | None = None
    last_run: dict[str, Any] | None = None
    live: dict[str, Any] | None = None  # the snapshot of a run that holds the database right now

    @property
    def rate_per_min(self) -> float | None:
        run = self.last_run
        if not run or not run.get("started_at") or not run.get("updated_at"):
            return None
        seconds = (run["updated_at"] - run["started_at"]).total_seconds()
        finished = (run.get("done") or 0) + (run.get("failed") or 0)
        return finished * 60.0 / seconds if seconds > 0 and finished else None

    @property
    def eta_s(self) -> float | None:
        rate = self.rate_per_min
        return self.pending * 60.0 / rate if rate and self.pending is not None else None


def job_status(spec: JobSpec) -> JobStatus:
    """Read the job's status. Blocking (DuckDB); the CLI calls it directly."""
    try:
        connection = open_database(spec.database, read_only=True, memory_limit=spec.duckdb_memory_limit)
    except DatabaseLockedError:
        return JobStatus(database=str(spec.database), live=read_snapshot(spec.database))
    try:
        return _read_status(connection, spec)
    finally:
        connection.close()


def _scalar(connection: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = connection.execute(sql).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _read_status(connection: duckdb.DuckDBPyConnection, spec: JobSpec) -> JobStatus:
    out = spec.output
    tables = table_names(connection)
    source_known = spec.source.query is not None or (spec.source.table or "").lower() in tables
    if out.results_table.lower() not in tables or not source_known:
        total = _scalar(connection, f"SELECT count(*) FROM {source_relation(spec)}") if source_known else None
        return JobStatus(database=str(spec.database), source_records=total, done=0, pending=total)
    failed = dict(
        connection.execute(
            f"SELECT failure_class, count(*) FROM {quote(out.failures_table)} GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    )
    return JobStatus(
        database=str(spec.database),
        source_records=_scalar(connection, f"SELECT count(*) FROM {source_relation(spec)}"),
        done=_scalar(connection, f"SELECT count(*) FROM {quote(out.results_table)}"),
        failed={str(name): int(count) for name, count in failed.items()},
        pending=_scalar(connection, f"SELECT count(*) FROM ({pending_sql(spec)})"),
        last_run=_last_run(connection, spec),
    )


def _last_run(connection: duckdb.DuckDBPyConnection, spec: JobSpec) -> dict[str, Any] | None:
    cursor = connection.execute(f"SELECT * FROM {quote(spec.output.runs_table)} ORDER BY run_id DESC LIMIT 1")
    row = cursor.fetchone()
    if row is None:
        return None
    names = [column[0] for column in cursor.description]
    run = {name: _plain(value) for name, value in zip(names, row, strict=True)}
    if run["status"] == "running":
        # We could open the database, so no process holds it: that run was killed without a trace.
        run["status"] = "abandoned"
    return run


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value
