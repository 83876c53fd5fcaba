"""``run_job``: one task group, producer → bounded stream → N workers → one store writer.

* In-flight requests never exceed each endpoint's limit: every attempt takes a slot from the router;
  the workers (as many as the endpoints may ever have in flight) each hold one record.
* Records and outcomes travel through bounded memory-object streams, so memory stays flat.
* The writer (:mod:`pipeline.run.committer`) commits batches in shielded transactions: a crash loses at
  most what was in flight, and resume redoes exactly that.
* What is pending (:mod:`pipeline.source.pending`) is counted in two phases; the content phase (hashing
  every record's text) is counted in the background while the first requests are out.
* A fatal error cancels the producer and the workers; a signal stops the producer and gives the
  requests in flight a grace period (:mod:`pipeline.run.shutdown`). Either way the writer still drains
  and commits every finished outcome before the run ends.
* Requests go through the :mod:`pipeline.servers.router` to the job's endpoints
  (:mod:`pipeline.run.fleet`), each at its own concurrency; an endpoint that goes away is held while
  the others go on.
* One ``pipeline run`` per job at a time (:mod:`pipeline.source.lock`); a stall watchdog
  (:mod:`pipeline.run.watchdog`) and the router keep an unattended run from hanging or failing records
  while a server restarts.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import anyio
import structlog
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from pipeline.errors import (
    ConfigError,
    DatabaseError,
    FatalRunError,
    StalledRunError,
    first_error,
)
from pipeline.extraction.documents import DocumentExtractor
from pipeline.extraction.outcomes import Stored
from pipeline.job.spec import JobSpec
from pipeline.quality.drift import BASELINE_RUNS, Drift, find_drift
from pipeline.run.committer import FLUSH_MAX_ROWS, commit_outcomes
from pipeline.run.context import RunContext
from pipeline.run.extractors import record_extractor
from pipeline.run.fleet import open_fleet
from pipeline.run.notices import stale_kept, warn_if_timeout_is_short
from pipeline.run.options import RunOptions, RunStatus, RunSummary
from pipeline.run.progress import LogProgress
from pipeline.run.prometheus import publish_metrics
from pipeline.run.read_copies import ReadCopies
from pipeline.run.series import RunSeries
from pipeline.run.shutdown import Shutdown
from pipeline.run.stats import RunStats
from pipeline.run.watchdog import StallWatchdog
from pipeline.servers.router import Router
from pipeline.source.db import Database
from pipeline.source.lock import RunLock
from pipeline.source.reader import SourceReader, SourceRecord
from pipeline.source.relation import count_records
from pipeline.store.chunks import ChunkStore
from pipeline.store.opening import known_knees, prepare_database
from pipeline.store.read_copy import remove_copies
from pipeline.store.snapshot import write_snapshot
from pipeline.store.writer import RunStart, StoreWriter

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions

__all__ = ["RunOptions", "RunStatus", "RunSummary", "count_pending", "run_job", "run_job_locally"]

log = structlog.get_logger("pipeline.run.runner")

SNAPSHOT_INTERVAL_S = 2.0


async def count_pending(spec: JobSpec, options: RunOptions | None = None) -> int:
    """Check the database (as a run would) and count what a run would extract."""
    options = options or RunOptions()
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    reader = await SourceReader.open(connection, RunContext.of(spec).pending(options.selection))
    try:
        return _capped(await reader.count_metadata() + await reader.count_content(), options.limit)
    finally:
        await reader.aclose()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(connection.close)


def _capped(count: int, limit: int | None) -> int:
    return count if limit is None else min(count, limit)


async def run_job(spec: JobSpec, options: RunOptions | None = None) -> RunSummary:
    """Extract every pending record of ``spec``. Raises :class:`FatalRunError` (incl. ConfigError)."""
    options = options or RunOptions()
    if spec.endpoint.is_local and not spec.endpoints and options.local_server is None:
        raise ConfigError(
            f"{spec.source_file}: key 'endpoint.base_url' is 'local': run with `pipeline run --local` "
            "(library: pipeline.run_job_locally)"
        )
    with RunLock(spec.database):
        connection = await anyio.to_thread.run_sync(prepare_database, spec)
        try:
            context = RunContext.of(spec)  # the composition root: what the stages below are given
            reader = await SourceReader.open(connection, context.pending(options.selection))
            try:
                return await _run_with_reader(context, options, connection, reader)
            finally:
                await reader.aclose()
        finally:
            # Shielded: a caller that cancels the run (a notebook's stop) must not keep the file open.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(connection.close)


async def run_job_locally(
    spec: JobSpec, options: RunOptions | None = None, server: LocalServerOptions | None = None
) -> RunSummary:
    """Run ``spec`` against a local vLLM server started (and stopped) for this run, through exactly the
    same code as against any other server; a configuration error, or nothing to do, starts no server."""
    from pipeline.local import LocalServerOptions  # the local extra: only when asked for

    options = dataclasses.replace(options or RunOptions(), local_server=server or LocalServerOptions())
    return await run_job(spec.as_run(local=True), options)


async def _run_with_reader(
    context: RunContext, options: RunOptions, connection: Database, reader: SourceReader
) -> RunSummary:
    spec = context.spec
    pending = _capped(await reader.count_metadata(), options.limit)
    if pending == 0:  # only now is the content phase worth waiting for
        pending = _capped(await reader.count_content(), options.limit)
    summary = functools.partial(
        RunSummary,
        database=spec.database,
        results_table=spec.output.results_table,
        failures_table=spec.output.failures_table,
        pending_at_start=pending,
        variant=spec.variant,
    )
    if pending == 0:
        log.info("nothing to do", job=spec.name, variant=spec.variant)
        records = await anyio.to_thread.run_sync(count_records, connection, spec)
        kept = await stale_kept(reader)
        return summary(run_id=None, status=RunStatus.NOTHING_TO_DO, stale_kept=kept, source_records=records)
    warn_if_timeout_is_short(context)
    knees = await anyio.to_thread.run_sync(known_knees, connection, spec) if context.auto else {}
    fleet = open_fleet(context, local=options.local_server, sleep=options.sleep, knees=knees)
    async with fleet as (context, router):
        stats, run_id, status, fatal, drift = await _run_on(
            context, options, connection, reader, router, pending
        )
    log.info("run ended", run_id=run_id, status=str(status), done=stats.done, failed=stats.failed)
    if fatal is not None:
        raise fatal
    return summary(
        run_id=run_id,
        status=status,
        pending_at_start=stats.pending_at_start,
        done=stats.done,
        failed=stats.failed,
        requests=stats.requests,
        output_tokens=stats.output_tokens,
        timeouts=stats.timeouts,
        elapsed_s=stats.elapsed_s(),
        stale_kept=await stale_kept(reader),
        drift=drift,
    )


async def _run_on(
    context: RunContext,
    options: RunOptions,
    connection: Database,
    reader: SourceReader,
    router: Router,
    pending: int,
) -> tuple[RunStats, int, RunStatus, FatalRunError | None, tuple[Drift, ...]]:
    spec = context.spec
    stats = RunStats(pending_at_start=pending, concurrency=router.most_in_flight)
    stats.endpoint_numbers = lambda: {e.name: e.stats.as_dict(e) for e in router.endpoints}
    kept = await ChunkStore.open(connection, spec, context.version) if spec.chunking else None
    try:
        extractor = record_extractor(spec, options, router, stats, kept)  # a bad chunking: no run row
        return await _recorded_run(context, options, connection, reader, router, stats, extractor)
    finally:
        if kept is not None:
            await kept.aclose()


async def _recorded_run(
    context: RunContext,
    options: RunOptions,
    connection: Database,
    reader: SourceReader,
    router: Router,
    stats: RunStats,
    extractor: DocumentExtractor,
) -> tuple[RunStats, int, RunStatus, FatalRunError | None, tuple[Drift, ...]]:
    spec, pending = context.spec, stats.pending_at_start
    writer = StoreWriter(connection, spec, context.version)
    urls = ", ".join(endpoint.config.base_url for endpoint in router.endpoints)
    run_id = await writer.begin_run(
        RunStart(context.version.job_hash, spec.model, urls, router.most_in_flight, pending)
    )
    log.info(
        "run started",
        job=spec.name,
        variant=spec.variant,
        run_id=run_id,
        pending=pending,
        endpoints=[endpoint.name for endpoint in router.endpoints],
        concurrency=[endpoint.config.concurrency or "auto" for endpoint in router.endpoints],
    )
    run = _Run(spec, options, reader, writer, stats, router, extractor)
    status, fatal = await _with_read_copies(run, connection, spec, run_id)
    knees = {e.config.knee_key: e.found_knee for e in router.endpoints if e.found_knee is not None}
    await writer.finish_run(str(status), str(fatal) if fatal else None, knees)
    await anyio.to_thread.run_sync(write_snapshot, spec.database, run_id, stats.snapshot(), str(status))
    run.series.sample()
    return stats, run_id, status, fatal, await _profile_and_drift(writer, run.series)


async def _with_read_copies(
    run: _Run, connection: Database, spec: JobSpec, run_id: int
) -> tuple[RunStatus, FatalRunError | None]:
    """Execute the run while keeping a read copy for readers; remove it when the run ends, so readers
    open the database again."""
    await anyio.to_thread.run_sync(remove_copies, spec.database)  # a killed run's, if any
    cursor = await anyio.to_thread.run_sync(connection.cursor)
    try:
        # Real time (not options.sleep, the retry waits tests make instant): a copy every few seconds.
        return await run.execute(ReadCopies(cursor, spec, run_id))
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(cursor.close)
            await anyio.to_thread.run_sync(remove_copies, spec.database)


async def _profile_and_drift(writer: StoreWriter, series: RunSeries) -> tuple[Drift, ...]:
    """Keep the run's series and profile, and say what drifted against the runs before it. The results
    are committed already: a failure here is a warning, not the run's end."""
    try:
        await writer.save_series(series.points)
        if writer.counts.done == 0:
            return ()
        await writer.profile_run()
        runs = await writer.recent_runs(BASELINE_RUNS + 1)
    except DatabaseError as error:
        log.warning("the run's profile was not kept: no drift check", error=str(error))
        return ()
    drift = tuple(find_drift([(run["run_id"], run["profile"]) for run in runs]))
    if drift:
        log.warning(
            "the run drifted: numbers moved beyond their usual run-to-run variation",
            drift=[entry.describe() for entry in drift],
        )
    return drift


class _Run:
    def __init__(
        self,
        spec: JobSpec,
        options: RunOptions,
        reader: SourceReader,
        writer: StoreWriter,
        stats: RunStats,
        router: Router,
        extractor: DocumentExtractor,
    ) -> None:
        self._spec = spec
        self._router = router
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
        self.series = RunSeries(stats)  # real time, like the progress snapshot

    def _abort(self, error: FatalRunError) -> None:
        self._fatal = self._fatal or error
        self._shutdown.stop_now()

    async def execute(self, copies: ReadCopies) -> tuple[RunStatus, FatalRunError | None]:
        async with anyio.create_task_group() as watchers:
            options = self._options
            publish = functools.partial(
                publish_metrics,
                self._stats,
                self._spec.name,
                port=options.metrics_port,
                host=self._spec.operations.metrics_host,
                textfile=options.metrics_textfile,
            )
            try:
                await watchers.start(publish)
            except ConfigError as error:  # e.g. the metrics port is taken: before any request
                watchers.cancel_scope.cancel()
                return RunStatus.ABORTED, error
            watchers.start_soon(self._progress.run, self._stats)
            watchers.start_soon(self._write_snapshots)
            watchers.start_soon(self.series.run, self._writer.save_series)
            watchers.start_soon(copies.run)
            await watchers.start(self._router.run)
            watchers.start_soon(self._watchdog.run)
            if not self._reader.content_counted:
                watchers.start_soon(self._count_content)
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
        outcomes_tx, outcomes_rx = anyio.create_memory_object_stream[Stored](FLUSH_MAX_ROWS)
        workers = self._router.most_in_flight
        if self._reader.content_counted:  # else the count is not final yet: more may come
            workers = min(workers, self._stats.pending_at_start)
        try:
            async with anyio.create_task_group() as io:
                io.start_soon(commit_outcomes, outcomes_rx, self._writer, self._stats)
                with self._shutdown.work:
                    async with outcomes_tx, records_rx:
                        try:
                            async with anyio.create_task_group() as work:
                                work.start_soon(self._produce, records_tx)
                                for _ in range(workers):
                                    work.start_soon(self._work, records_rx.clone(), outcomes_tx.clone())
                        except* FatalRunError as group:
                            # Caught inside the writer's task group, so the writer still drains.
                            self._fatal = self._fatal or first_error(group)
        except* FatalRunError as group:  # the writer itself failed
            self._fatal = self._fatal or first_error(group)

    async def _produce(self, records: ObjectSendStream[SourceRecord]) -> None:
        with self._shutdown.intake:
            await self._reader.stream_pending(records)

    async def _work(
        self, records: ObjectReceiveStream[SourceRecord], outcomes: ObjectSendStream[Stored]
    ) -> None:
        async with records, outcomes:
            async for record in records:
                if self._shutdown.stopping:
                    return  # records still queued stay pending in the database: the next run does them
                await outcomes.send(await self._extractor.extract(record, outcomes.send))

    async def _count_content(self) -> None:
        """Count the records whose content changed while the first requests are out (it hashes every
        record's text), then make the run's pending count final. A count that fails stops the run like
        the stream would (it runs beside it, so its error would otherwise escape the run's accounting)."""
        try:
            counted = await self._reader.count_content()
        except FatalRunError as error:
            self._abort(error)
            return
        metadata = self._stats.pending_at_start
        self._stats.pending_at_start = _capped(metadata + counted, self._options.limit)
        if counted:
            log.info("content changed since extraction", records=counted)
            await self._writer.set_pending(self._stats.pending_at_start)

    async def _write_snapshots(self) -> None:
        while True:
            await anyio.to_thread.run_sync(
                write_snapshot, self._spec.database, self._writer.run_id, self._stats.snapshot(), "running"
            )
            await anyio.sleep(SNAPSHOT_INTERVAL_S)
