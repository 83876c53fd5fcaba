"""The job's DuckDB database: output tables, the single batched writer, and status queries.

Results are unique per record id (primary key). Each batch of outcomes is one transaction that also
updates the run's counters, so what ``status`` shows is always what is on disk.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import duckdb
import structlog

from pipeline.errors import ConfigError, DatabaseLockedError
from pipeline.job import JobSpec
from pipeline.loader import load_file
from pipeline.lock import already_running, lock_holder
from pipeline.outcomes import Extracted, Failed, Outcome
from pipeline.source import describe_source, quote

log = structlog.get_logger("pipeline.store")

T = TypeVar("T")

#: Chaos testing only: hold each batch's transaction open this long before committing, so a kill -9
#: can be aimed at the middle of a commit (tests/integration/test_chaos.py).
CHAOS_COMMIT_DELAY_ENV = "PIPELINE_CHAOS_COMMIT_DELAY_S"
AppendAction = Literal["upsert", "delete"]


# Timestamps are stored as plain TIMESTAMP in UTC: TIMESTAMPTZ values need pytz to be read in Python.
UTC_NOW = "timezone('UTC', now())"

RESULT_COLUMNS = [
    "record_id",
    "run_id",
    "extracted",
    "model",
    "attempts",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "latency_s",
    "finish_reason",
    "prompt_hash",
    "schema_hash",
]
FAILURE_COLUMNS = ["record_id", "run_id", "failure_class", "message", "attempts", "last_raw_output"]


def open_database(
    path: Path, *, read_only: bool = False, memory_limit: str = "128MB"
) -> duckdb.DuckDBPyConnection:
    """Connect, translating "locked by another process" and unreadable files into one clear line."""
    if read_only and not path.exists():
        raise ConfigError(f"{path}: database does not exist yet (run `pipeline load` or `pipeline run`)")
    try:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        connection = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        text = " ".join(str(exc).split())
        if "lock" in text.lower():
            if (pid := lock_holder(path)) is not None:
                raise already_running(path, pid) from exc
            raise DatabaseLockedError(f"{path}: database is in use by another process ({text})") from exc
        raise ConfigError(f"{path}: cannot open database ({text})") from exc
    except (duckdb.Error, OSError) as exc:
        raise ConfigError(f"{path}: cannot open database ({' '.join(str(exc).split())})") from exc
    # DuckDB's default buffer pool is 80% of RAM and fills with cached result blocks as a run goes
    # on; a bounded pool keeps the process small (it spills to disk if a query needs more).
    connection.execute(f"SET memory_limit = '{memory_limit}'")
    return connection


@dataclass(slots=True)
class RunCounts:
    done: int = 0
    failed: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, outcome: Outcome) -> None:
        self.attempts += outcome.attempts
        if isinstance(outcome, Failed):
            self.failed += 1
            return
        self.done += 1
        self.prompt_tokens += outcome.reply.prompt_tokens or 0
        self.completion_tokens += outcome.reply.completion_tokens or 0


def create_output_tables(connection: duckdb.DuckDBPyConnection, spec: JobSpec, id_type: str) -> None:
    """Create the job's output tables if missing; the record id keeps the source id's type."""
    out = spec.output
    connection.execute(
        f"""
        CREATE TABLE IF NOT EXISTS {quote(out.runs_table)} (
            run_id INTEGER PRIMARY KEY, job_name VARCHAR, job_hash VARCHAR, model VARCHAR,
            base_url VARCHAR, concurrency INTEGER, started_at TIMESTAMP, updated_at TIMESTAMP,
            ended_at TIMESTAMP, status VARCHAR, pending_at_start BIGINT, done BIGINT DEFAULT 0,
            failed BIGINT DEFAULT 0, attempts BIGINT DEFAULT 0, prompt_tokens BIGINT DEFAULT 0,
            completion_tokens BIGINT DEFAULT 0, message VARCHAR);
        CREATE TABLE IF NOT EXISTS {quote(out.results_table)} (
            record_id {id_type} PRIMARY KEY, run_id INTEGER, extracted JSON, model VARCHAR,
            attempts INTEGER, prompt_tokens INTEGER, completion_tokens INTEGER, reasoning_tokens INTEGER,
            latency_s DOUBLE, finish_reason VARCHAR, prompt_hash VARCHAR, schema_hash VARCHAR,
            created_at TIMESTAMP DEFAULT ({UTC_NOW}));
        CREATE TABLE IF NOT EXISTS {quote(out.failures_table)} (
            record_id {id_type} PRIMARY KEY, run_id INTEGER, failure_class VARCHAR, message VARCHAR,
            attempts INTEGER, last_raw_output VARCHAR, created_at TIMESTAMP DEFAULT ({UTC_NOW}));
        """
    )


@dataclass(frozen=True, slots=True)
class RunStart:
    job_hash: str
    model: str
    base_url: str
    concurrency: int
    pending: int


class StoreWriter:
    """The single writer: owns one connection; every call runs in a worker thread, one at a time."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, spec: JobSpec) -> None:
        self.connection = connection
        self.spec = spec
        self.run_id = 0
        self.counts = RunCounts()
        self._hashes = (spec.prompt_hash(), spec.schema_hash())
        self._limiter = anyio.CapacityLimiter(1)
        self._chaos_commit_delay_s = float(os.environ.get(CHAOS_COMMIT_DELAY_ENV) or 0)

    async def _call(self, function: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(function, limiter=self._limiter)

    async def begin_run(self, start: RunStart) -> int:
        self.run_id = await self._call(lambda: self._insert_run(start))
        return self.run_id

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        """Commit a batch of outcomes and the run's new counters in one transaction."""
        if outcomes:
            await self._call(lambda: self._write_batch(outcomes))

    async def finish_run(self, status: str, message: str | None = None) -> None:
        await self._call(lambda: self._finish(status, message))

    def _insert_run(self, start: RunStart) -> int:
        table = quote(self.spec.output.runs_table)
        con = self.connection
        row = con.execute(f"SELECT coalesce(max(run_id), 0) + 1 FROM {table}").fetchone()
        run_id = int(row[0]) if row else 1
        con.execute(
            f"INSERT INTO {table} (run_id, job_name, job_hash, model, base_url, concurrency, started_at, "
            "updated_at, status, pending_at_start) "
            f"VALUES (?, ?, ?, ?, ?, ?, {UTC_NOW}, {UTC_NOW}, 'running', ?)",
            [
                run_id,
                self.spec.name,
                start.job_hash,
                start.model,
                start.base_url,
                start.concurrency,
                start.pending,
            ],
        )
        return run_id

    def _write_batch(self, outcomes: Sequence[Outcome]) -> None:
        extracted = [o for o in outcomes if isinstance(o, Extracted)]
        failed = [o for o in outcomes if isinstance(o, Failed)]
        counts = dataclasses.replace(self.counts)
        for outcome in outcomes:
            counts.add(outcome)
        con, out = self.connection, self.spec.output
        con.begin()
        try:
            if extracted:
                self._append(out.results_table, RESULT_COLUMNS, [self._result_row(o) for o in extracted])
                # A record that failed before (transient, or --retry-failed) is no longer a failure.
                self._append(out.failures_table, ["record_id"], [[o.record_id] for o in extracted], "delete")
            if failed:
                self._append(
                    out.failures_table, FAILURE_COLUMNS, [self._failure_row(o) for o in failed], "upsert"
                )
            self._update_run(counts, status=None, message=None)
            if self._chaos_commit_delay_s:
                log.warning("chaos: transaction open before commit", rows=len(outcomes))
                time.sleep(self._chaos_commit_delay_s)
            con.commit()
        except BaseException:
            con.rollback()
            raise
        self.counts = counts

    def _append(
        self, table: str, columns: list[str], rows: list[list[Any]], action: AppendAction = "upsert"
    ) -> None:
        if action == "delete":  # a delete appender buffers exactly its key columns
            appender = self.connection.appender(table, action=action, key=columns)
        else:
            appender = self.connection.appender(table, columns=columns, action=action)
        appender.append_rows(rows)
        appender.flush()

    def _result_row(self, outcome: Extracted) -> list[Any]:
        reply = outcome.reply
        return [
            outcome.record_id,
            self.run_id,
            outcome.data_json,
            self.spec.model,
            outcome.attempts,
            reply.prompt_tokens,
            reply.completion_tokens,
            reply.reasoning_tokens,
            reply.latency_s,
            reply.finish_reason,
            *self._hashes,
        ]

    def _failure_row(self, outcome: Failed) -> list[Any]:
        return [
            outcome.record_id,
            self.run_id,
            str(outcome.failure_class),
            outcome.message,
            outcome.attempts,
            outcome.last_raw_output,
        ]

    def _update_run(self, counts: RunCounts, *, status: str | None, message: str | None) -> None:
        self.connection.execute(
            f"UPDATE {quote(self.spec.output.runs_table)} SET done = ?, failed = ?, attempts = ?, "
            f"prompt_tokens = ?, completion_tokens = ?, updated_at = {UTC_NOW}, "
            "status = coalesce(?, status), message = coalesce(?, message), "
            f"ended_at = CASE WHEN ? IS NULL THEN ended_at ELSE {UTC_NOW} END WHERE run_id = ?",
            [
                counts.done,
                counts.failed,
                counts.attempts,
                counts.prompt_tokens,
                counts.completion_tokens,
                status,
                message,
                status,
                self.run_id,
            ],
        )

    def _finish(self, status: str, message: str | None) -> None:
        self._update_run(self.counts, status=status, message=message)


def prepare_database(spec: JobSpec) -> duckdb.DuckDBPyConnection:
    """Open the job's database, load the seed file into an absent source table, check the source and
    create the output tables. Blocking; raises :class:`ConfigError` before any request is sent."""
    try:
        connection = open_database(spec.database, memory_limit=spec.duckdb_memory_limit)
    except ConfigError as error:
        raise ConfigError(f"{spec.source_file}: key 'database': {error}") from error
    try:
        table, seed = spec.source.table, spec.source.seed_file
        if table is not None and seed is not None and table.lower() not in table_names(connection):
            try:
                report = load_file(connection, spec, seed)
            except ConfigError as error:
                raise ConfigError(f"{spec.source_file}: key 'source.seed_file': {error}") from error
            log.info("loaded seed file", file=str(seed), table=table, records=report.inserted)
        shape = describe_source(connection, spec)
        create_output_tables(connection, spec, shape.id_type)
        # Only one process can open the database for writing, so a run still "running" was killed
        # (also when this run then finds nothing to do and records no run of its own).
        runs = quote(spec.output.runs_table)
        connection.execute(f"UPDATE {runs} SET status = 'abandoned' WHERE status = 'running'")
    except BaseException:
        connection.close()
        raise
    return connection


def table_names(connection: duckdb.DuckDBPyConnection) -> set[str]:
    """The database's tables, lower-cased (DuckDB matches table names case-insensitively). Blocking."""
    rows = connection.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()
    return {str(row[0]).lower() for row in rows}
