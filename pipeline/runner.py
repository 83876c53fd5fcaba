"""``run_job``: one task group, producer → bounded stream → N workers → one store writer.

* In-flight requests never exceed the job's concurrency: N workers each hold at most one record, and a
  worker takes the next record the moment it hands one to the writer.
* Records and outcomes travel through bounded memory-object streams, so memory stays flat.
* The writer commits a batch every ``FLUSH_INTERVAL_S`` (or ``FLUSH_MAX_ROWS``) in a shielded
  transaction: a crash loses at most what was in flight, and resume redoes exactly that.
* A fatal error or a signal cancels the producer and the workers; the writer still drains and
  commits every finished outcome before the run ends.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import anyio
import duckdb
import httpx2
import structlog
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from anyio.streams.memory import MemoryObjectReceiveStream

from pipeline.errors import ConfigError, FatalRunError, RecordError
from pipeline.extractor import BudgetGrowth, Extractor
from pipeline.job import JobSpec
from pipeline.llm import ClientSettings, LLMClient
from pipeline.loader import load_file
from pipeline.outcomes import Failed, Outcome, SourceRecord
from pipeline.progress import LogProgress, ProgressReporter, write_snapshot
from pipeline.prompt import PromptBuilder, response_format_for
from pipeline.retry import RetryKind, RetryPolicy
from pipeline.source import SourceReader, describe_source
from pipeline.stats import RunStats
from pipeline.store import RunStart, StoreWriter, create_output_tables, open_database

log = structlog.get_logger("pipeline.runner")

FLUSH_INTERVAL_S = 0.5
FLUSH_MAX_ROWS = 1000
SNAPSHOT_INTERVAL_S = 2.0
# Below this a request at high concurrency is killed while the server is still working on it.
SHORT_TIMEOUT_S = 300.0


class RunStatus(StrEnum):
    NOTHING_TO_DO = "nothing_to_do"
    COMPLETED = "completed"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    INTERRUPTED = "interrupted"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class RunOptions:
    limit: int | None = None
    retry_failed: bool = False
    handle_signals: bool = False
    progress: ProgressReporter | None = None
    transport: httpx2.AsyncBaseTransport | None = None
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: int | None
    status: RunStatus
    database: Path
    results_table: str
    failures_table: str
    pending_at_start: int
    done: int = 0
    failed: int = 0
    requests: int = 0
    output_tokens: int = 0
    timeouts: int = 0
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        return {RunStatus.INTERRUPTED: 130, RunStatus.COMPLETED_WITH_FAILURES: 1}.get(self.status, 0)

    @property
    def records_per_s(self) -> float:
        return (self.done + self.failed) / self.elapsed_s if self.elapsed_s > 0 else 0.0


def client_settings(spec: JobSpec) -> ClientSettings:
    return ClientSettings(
        base_url=spec.endpoint.base_url,
        model=spec.model,
        api_key=spec.api_key(),
        api_key_env=spec.endpoint.api_key_env,
        concurrency=spec.concurrency,
        request_timeout_s=spec.request_timeout_s,
        temperature=spec.temperature,
        reasoning_effort=spec.reasoning_effort,
        response_format=response_format_for(spec.schema_class) if spec.endpoint.structured_output else None,
        extra_body=spec.extra_body,
    )


def prepare_database(spec: JobSpec) -> duckdb.DuckDBPyConnection:
    """Open the job's database, load the seed file into an absent source table, check the source and
    create the output tables. Blocking; raises :class:`ConfigError` before any request is sent."""
    try:
        connection = open_database(spec.database, memory_limit=spec.duckdb_memory_limit)
    except ConfigError as error:
        raise ConfigError(f"{spec.source_file}: key 'database': {error}") from error
    try:
        table, seed = spec.source.table, spec.source.seed_file
        if table is not None and seed is not None and not _table_exists(connection, table):
            try:
                report = load_file(connection, spec, seed)
            except ConfigError as error:
                raise ConfigError(f"{spec.source_file}: key 'source.seed_file': {error}") from error
            log.info("loaded seed file", file=str(seed), table=table, records=report.inserted)
        shape = describe_source(connection, spec)
        create_output_tables(connection, spec, shape.id_type)
    except BaseException:
        connection.close()
        raise
    return connection


def _table_exists(connection: duckdb.DuckDBPyConnection, table: str) -> bool:
    row = connection.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE lower(table_name) = lower(?) AND NOT temporary", [table]
    ).fetchone()
    return bool(row and row[0])


async def count_pending(spec: JobSpec, options: RunOptions | None = None) -> int:
    """Check the database (as a run would) and count what a run would extract."""
    options = options or RunOptions()
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    try:
        return (await _pending_reader(connection, spec, options))[1]
    finally:
        await anyio.to_thread.run_sync(connection.close)


async def _pending_reader(
    connection: duckdb.DuckDBPyConnection, spec: JobSpec, options: RunOptions
) -> tuple[SourceReader, int]:
    reader = SourceReader(await anyio.to_thread.run_sync(connection.cursor), spec)
    return reader, await reader.count_pending(retry_failed=options.retry_failed, limit=options.limit)


async def run_job(spec: JobSpec, options: RunOptions | None = None) -> RunSummary:
    """Extract every pending record of ``spec``. Raises :class:`FatalRunError` (incl. ConfigError)."""
    options = options or RunOptions()
    if spec.endpoint.is_local:
        raise ConfigError(
            f"{spec.source_file}: key 'endpoint.base_url' is 'local': run with `pipeline run --local` "
            "(library: pipeline.local.run_job_locally)"
        )
    settings = client_settings(spec)
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    try:
        return await _run_prepared(spec, options, settings, connection)
    finally:
        await anyio.to_thread.run_sync(connection.close)


async def _run_prepared(
    spec: JobSpec, options: RunOptions, settings: ClientSettings, connection: duckdb.DuckDBPyConnection
) -> RunSummary:
    reader, pending = await _pending_reader(connection, spec, options)
    summary = functools.partial(
        RunSummary,
        database=spec.database,
        results_table=spec.output.results_table,
        failures_table=spec.output.failures_table,
        pending_at_start=pending,
    )
    if pending == 0:
        log.info("nothing to do", job=spec.name)
        return summary(run_id=None, status=RunStatus.NOTHING_TO_DO)
    _warn_if_timeout_is_short(spec)
    async with LLMClient(settings, transport=options.transport) as llm:
        await llm.check_server()
        writer = StoreWriter(connection, spec)
        stats = RunStats(pending_at_start=pending, concurrency=spec.concurrency)
        run_id = await writer.begin_run(
            RunStart(spec.job_hash(), spec.model, spec.endpoint.base_url, spec.concurrency, pending)
        )
        log.info("run started", job=spec.name, run_id=run_id, pending=pending, concurrency=spec.concurrency)
        run = _Run(spec, options, reader, writer, stats, _extractor(spec, options, llm, stats))
        status, fatal = await run.execute()
        message = str(fatal) if fatal else None
        await writer.finish_run(str(status), message)
        await anyio.to_thread.run_sync(write_snapshot, spec.database, run_id, stats, str(status))
    log.info("run ended", run_id=run_id, status=str(status), done=stats.done, failed=stats.failed)
    if fatal is not None:
        raise fatal
    return summary(
        run_id=run_id,
        status=status,
        done=stats.done,
        failed=stats.failed,
        requests=stats.requests,
        output_tokens=stats.output_tokens,
        timeouts=stats.timeouts,
        elapsed_s=stats.elapsed_s(),
    )


def _warn_if_timeout_is_short(spec: JobSpec) -> None:
    if spec.request_timeout_s < SHORT_TIMEOUT_S and spec.concurrency >= 32:
        log.warning(
            "request timeout is short for this concurrency: a busy server finishes requests after minutes",
            request_timeout_s=spec.request_timeout_s,
            concurrency=spec.concurrency,
        )


def _extractor(spec: JobSpec, options: RunOptions, llm: LLMClient, stats: RunStats) -> Extractor:
    def observe(kind: RetryKind, error: RecordError, attempt: int, wait_s: float) -> None:
        stats.retries[str(kind)] += 1
        log.debug("retrying", kind=str(kind), attempt=attempt, wait_s=round(wait_s, 2), error=str(error))

    policy = RetryPolicy(spec.retry, sleep=options.sleep, observer=observe)
    growth = BudgetGrowth(spec.retry.truncation_growth, spec.max_tokens_ceiling)
    return Extractor(
        llm,
        PromptBuilder(spec),
        spec.schema_class,
        policy,
        growth,
        stats,
        spec.retry.abort_after_consecutive_failures,
    )


class _Run:
    def __init__(
        self,
        spec: JobSpec,
        options: RunOptions,
        reader: SourceReader,
        writer: StoreWriter,
        stats: RunStats,
        extractor: Extractor,
    ) -> None:
        self._spec = spec
        self._options = options
        self._reader = reader
        self._writer = writer
        self._stats = stats
        self._extractor = extractor
        self._progress = options.progress or LogProgress()
        self._work_scope = anyio.CancelScope()
        self._interrupted = False
        self._fatal: FatalRunError | None = None

    async def execute(self) -> tuple[RunStatus, FatalRunError | None]:
        async with anyio.create_task_group() as watchers:
            watchers.start_soon(self._progress.run, self._stats)
            watchers.start_soon(self._write_snapshots)
            if self._options.handle_signals:
                watchers.start_soon(self._stop_on_signals)
            try:
                await self._pump()
            finally:
                watchers.cancel_scope.cancel()
                self._progress.close(self._stats)
        return self._status(), self._fatal

    def _status(self) -> RunStatus:
        if self._fatal is not None:
            return RunStatus.ABORTED
        if self._interrupted:
            return RunStatus.INTERRUPTED
        return RunStatus.COMPLETED_WITH_FAILURES if self._stats.failed else RunStatus.COMPLETED

    async def _pump(self) -> None:
        records_tx, records_rx = anyio.create_memory_object_stream[SourceRecord](self._spec.source.batch_size)
        outcomes_tx, outcomes_rx = anyio.create_memory_object_stream[Outcome](FLUSH_MAX_ROWS)
        workers = min(self._spec.concurrency, self._stats.pending_at_start)
        produce = functools.partial(
            self._reader.stream_pending,
            records_tx,
            retry_failed=self._options.retry_failed,
            limit=self._options.limit,
        )
        try:
            async with anyio.create_task_group() as io:
                io.start_soon(self._write_all, outcomes_rx)
                with self._work_scope:
                    async with outcomes_tx, records_rx:
                        try:
                            async with anyio.create_task_group() as work:
                                work.start_soon(produce)
                                for _ in range(workers):
                                    work.start_soon(self._work, records_rx.clone(), outcomes_tx.clone())
                        except* FatalRunError as group:
                            # Caught inside the writer's task group, so the writer still drains.
                            self._fatal = _first_fatal(group)
        except* FatalRunError as group:  # the writer itself failed
            self._fatal = _first_fatal(group)

    async def _work(
        self, records: ObjectReceiveStream[SourceRecord], outcomes: ObjectSendStream[Outcome]
    ) -> None:
        async with records, outcomes:
            async for record in records:
                await outcomes.send(await self._extractor.extract(record))

    async def _write_all(self, outcomes: MemoryObjectReceiveStream[Outcome]) -> None:
        batch: list[Outcome] = []
        deadline = anyio.current_time() + FLUSH_INTERVAL_S
        async with outcomes:
            while True:
                with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                    try:
                        batch.append(await outcomes.receive())
                    except anyio.EndOfStream:
                        break
                    _drain_ready(outcomes, batch, FLUSH_MAX_ROWS)
                if len(batch) >= FLUSH_MAX_ROWS or anyio.current_time() >= deadline:
                    await self._commit(batch)
                    batch = []
                    deadline = anyio.current_time() + FLUSH_INTERVAL_S
        await self._commit(batch)

    async def _commit(self, batch: list[Outcome]) -> None:
        if not batch:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self._writer.write(batch)
            except duckdb.Error as exc:
                raise FatalRunError(
                    f"{self._spec.database}: cannot write results ({' '.join(str(exc).split())})"
                ) from exc
        for outcome in batch:
            if isinstance(outcome, Failed):
                self._stats.failed += 1
                self._stats.failures[str(outcome.failure_class)] += 1
            else:
                self._stats.done += 1

    async def _write_snapshots(self) -> None:
        while True:
            await anyio.to_thread.run_sync(
                write_snapshot, self._spec.database, self._writer.run_id, self._stats, "running"
            )
            await anyio.sleep(SNAPSHOT_INTERVAL_S)

    async def _stop_on_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if self._interrupted:
                    log.warning("second signal: still saving finished records, please wait")
                    continue
                self._interrupted = True
                log.warning(
                    "interrupted: cancelling requests in flight, saving finished records",
                    signal=signal.Signals(signum).name,
                )
                self._work_scope.cancel()


def _drain_ready(outcomes: MemoryObjectReceiveStream[Outcome], batch: list[Outcome], limit: int) -> None:
    """Take what is already waiting, without blocking; the next receive() reports the end."""
    while len(batch) < limit:
        try:
            batch.append(outcomes.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            return


def _first_fatal(group: BaseExceptionGroup[FatalRunError]) -> FatalRunError:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            return _first_fatal(error)
        return error
    raise group  # pragma: no cover - an exception group is never empty
