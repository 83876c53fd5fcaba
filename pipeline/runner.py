"""``run_job``: one task group, producer → bounded stream → N workers → one store writer.

* In-flight requests never exceed the job's concurrency: N workers each hold at most one record, and a
  worker takes the next record the moment it hands one to the writer.
* Records and outcomes travel through bounded memory-object streams, so memory stays flat.
* The writer commits a batch every ``FLUSH_INTERVAL_S`` (or ``FLUSH_MAX_ROWS``) in a shielded
  transaction: a crash loses at most what was in flight, and resume redoes exactly that.
* A fatal error cancels the producer and the workers; a signal stops the producer and gives the
  requests in flight a grace period (:mod:`pipeline.shutdown`). Either way the writer still drains
  and commits every finished outcome before the run ends.
* One ``pipeline run`` per job at a time (:mod:`pipeline.lock`); a stall watchdog
  (:mod:`pipeline.watchdog`) and a server-outage gate (:class:`pipeline.retry.ServerGate`) keep an
  unattended run from hanging or failing records while the server restarts.
"""

from __future__ import annotations

import functools
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

from pipeline.errors import (
    PERMANENT_FAILURE_CLASSES,
    ConfigError,
    FailureClass,
    FatalRunError,
    ModelNotServedError,
    RecordError,
    StalledRunError,
)
from pipeline.extractor import BudgetGrowth, Extractor
from pipeline.job import JobSpec
from pipeline.llm import ClientSettings, LLMClient
from pipeline.lock import RunLock
from pipeline.metrics import publish_metrics
from pipeline.outcomes import Failed, Outcome, SourceRecord
from pipeline.progress import LogProgress, ProgressReporter, write_snapshot
from pipeline.prompt import PromptBuilder, response_format_for
from pipeline.retry import RetryKind, RetryPolicy, ServerGate
from pipeline.shutdown import Shutdown
from pipeline.source import SourceReader
from pipeline.stats import RunStats
from pipeline.store import RunStart, StoreWriter, prepare_database
from pipeline.watchdog import StallWatchdog

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
    STALLED = "stalled"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class RunOptions:
    limit: int | None = None
    retry_failed: bool = False
    retry_classes: frozenset[FailureClass] = frozenset()  # with retry_failed: only these; empty: all
    handle_signals: bool = False
    progress: ProgressReporter | None = None
    metrics_port: int | None = None
    metrics_textfile: Path | None = None
    transport: httpx2.AsyncBaseTransport | None = None
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep

    @property
    def retry(self) -> frozenset[FailureClass]:
        """The permanent failure classes this run extracts again."""
        if not self.retry_failed:
            return frozenset()
        return self.retry_classes or PERMANENT_FAILURE_CLASSES


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
        preflight_timeout_s=spec.operations.preflight_timeout_s,
    )


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
    return reader, await reader.count_pending(retry=options.retry, limit=options.limit)


async def run_job(spec: JobSpec, options: RunOptions | None = None) -> RunSummary:
    """Extract every pending record of ``spec``. Raises :class:`FatalRunError` (incl. ConfigError)."""
    options = options or RunOptions()
    if spec.endpoint.is_local:
        raise ConfigError(
            f"{spec.source_file}: key 'endpoint.base_url' is 'local': run with `pipeline run --local` "
            "(library: pipeline.local.run_job_locally)"
        )
    settings = client_settings(spec)
    with RunLock(spec.database):
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
        await _check_server(llm, spec)
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


async def _check_server(llm: LLMClient, spec: JobSpec) -> None:
    try:
        await llm.check_server()
    except ModelNotServedError as error:
        raise ModelNotServedError(f"{spec.source_file}: key 'model': {error}") from error


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
    gate = ServerGate(llm.probe, give_up_after_s=spec.operations.server_down_abort_s, sleep=options.sleep)
    return Extractor(
        llm,
        PromptBuilder(spec),
        spec.schema_class,
        policy,
        growth,
        stats,
        spec.retry.abort_after_consecutive_failures,
        gate,
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
        self._shutdown = Shutdown(spec.operations.shutdown_grace_s)
        self._watchdog = StallWatchdog(
            stats,
            warn_after_s=spec.operations.stall_warning_s,
            abort_after_s=spec.operations.stall_abort_s,
            on_abort=self._abort,
        )
        self._fatal: FatalRunError | None = None

    def _abort(self, error: FatalRunError) -> None:
        self._fatal = self._fatal or error
        self._shutdown.stop_now()

    async def execute(self) -> tuple[RunStatus, FatalRunError | None]:
        async with anyio.create_task_group() as watchers:
            options = self._options
            publish = functools.partial(
                publish_metrics,
                self._stats,
                self._spec.name,
                port=options.metrics_port,
                textfile=options.metrics_textfile,
            )
            try:
                await watchers.start(publish)
            except ConfigError as error:  # e.g. the metrics port is taken: before any request
                watchers.cancel_scope.cancel()
                return RunStatus.ABORTED, error
            watchers.start_soon(self._progress.run, self._stats)
            watchers.start_soon(self._write_snapshots)
            watchers.start_soon(self._watchdog.run)
            if self._options.handle_signals:
                watchers.start_soon(self._shutdown.watch_signals, lambda: self._stats.in_flight)
            try:
                await self._pump()
            finally:
                watchers.cancel_scope.cancel()
                self._progress.close(self._stats)
        return self._status(), self._fatal

    def _status(self) -> RunStatus:
        if isinstance(self._fatal, StalledRunError):
            return RunStatus.STALLED
        if self._fatal is not None:
            return RunStatus.ABORTED
        if self._shutdown.interrupted:
            return RunStatus.INTERRUPTED
        return RunStatus.COMPLETED_WITH_FAILURES if self._stats.failed else RunStatus.COMPLETED

    async def _pump(self) -> None:
        records_tx, records_rx = anyio.create_memory_object_stream[SourceRecord](self._spec.source.batch_size)
        outcomes_tx, outcomes_rx = anyio.create_memory_object_stream[Outcome](FLUSH_MAX_ROWS)
        workers = min(self._spec.concurrency, self._stats.pending_at_start)
        try:
            async with anyio.create_task_group() as io:
                io.start_soon(self._write_all, outcomes_rx)
                with self._shutdown.work:
                    async with outcomes_tx, records_rx:
                        try:
                            async with anyio.create_task_group() as work:
                                work.start_soon(self._produce, records_tx)
                                for _ in range(workers):
                                    work.start_soon(self._work, records_rx.clone(), outcomes_tx.clone())
                        except* FatalRunError as group:
                            # Caught inside the writer's task group, so the writer still drains.
                            self._fatal = self._fatal or _first_fatal(group)
        except* FatalRunError as group:  # the writer itself failed
            self._fatal = self._fatal or _first_fatal(group)

    async def _produce(self, records: ObjectSendStream[SourceRecord]) -> None:
        with self._shutdown.intake:
            await self._reader.stream_pending(records, retry=self._options.retry, limit=self._options.limit)

    async def _work(
        self, records: ObjectReceiveStream[SourceRecord], outcomes: ObjectSendStream[Outcome]
    ) -> None:
        async with records, outcomes:
            async for record in records:
                if self._shutdown.stopping:
                    return  # records still queued stay pending in the database: the next run does them
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
