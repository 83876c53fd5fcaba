"""One run's task groups: the watchers (progress, snapshots, read copies, metrics, the router, the stall
watchdog, signals) around producer → bounded stream → N workers → the writer.

* A fatal error (the router's, the watchdog's, the answer breaker's) cancels the producer and the
  workers; a signal stops the producer and gives the requests in flight a grace period
  (:mod:`pipeline.run.shutdown`). Either way the writer still drains and commits every finished outcome.
* Every record's outcome, once handed to the writer, is judged by the :mod:`pipeline.run.answer_breaker`
  (in the order the records were sent): a server whose answers stopped validating stops the run before
  it marks the backlog failed, and the records failed in the breaker's window are kept retryable once
  the writer has drained.
* A writer that fails (the disk is full) ends the run with its own error: the workers that then find
  its stream closed stop quietly instead of adding errors of their own.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import anyio
import structlog
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from pipeline.errors import (
    ANSWER_FAILURE_CLASSES,
    ConfigError,
    DatabaseError,
    FatalRunError,
    StalledRunError,
    first_error,
)
from pipeline.extraction.context import RunContext
from pipeline.extraction.documents import DocumentExtractor
from pipeline.extraction.outcomes import Failed, Outcome, Stored
from pipeline.run.answer_breaker import KEPT_NOTE, AnswerBreaker
from pipeline.run.committer import FLUSH_MAX_ROWS, commit_outcomes
from pipeline.run.fleet import read_counters_at_end
from pipeline.run.notices import say_blank
from pipeline.run.options import RunCommands, RunOptions, RunStatus
from pipeline.run.progress import LogProgress
from pipeline.run.prometheus import publish_metrics
from pipeline.run.read_copies import ReadCopies
from pipeline.run.series import RunSeries
from pipeline.run.shutdown import Shutdown
from pipeline.run.stats import RunStats
from pipeline.run.watchdog import StallWatchdog
from pipeline.servers.router import Router
from pipeline.source.pending import PendingQueries, Selection, pending_count
from pipeline.source.reader import SourceReader, SourceRecord
from pipeline.store.snapshot import write_snapshot
from pipeline.store.writer import StoreWriter

log = structlog.get_logger("pipeline.run.execution")

SNAPSHOT_INTERVAL_S = 2.0


def save_snapshot(context: RunContext, run_id: int, stats: RunStats, status: str) -> OSError | None:
    """Write the progress snapshot ``status`` reads (blocking: call it in a worker thread). A disk too
    full for it costs only the snapshot: the error is given back, for the caller to say once."""
    try:
        write_snapshot(context.database, run_id, stats.snapshot(), status)
    except OSError as error:
        return error
    return None


@dataclass(frozen=True, slots=True)
class OpenRun:
    """A run whose parts are open (:func:`pipeline.run.runner.opened_run` opens them, as one value):
    what its execution reads and drives. ``context`` is the one it runs with (its servers')."""

    context: RunContext
    options: RunOptions
    reader: SourceReader
    router: Router
    stats: RunStats
    writer: StoreWriter
    extractor: DocumentExtractor


class RunExecution:
    def __init__(self, run: OpenRun) -> None:
        operations = run.context.spec.operations
        self._context = run.context
        self._router = run.router
        self._options = run.options
        self._reader = run.reader
        self._writer = run.writer
        self._stats = run.stats
        self._extractor = run.extractor
        self._progress = run.options.progress or LogProgress()
        self._shutdown = Shutdown(operations.shutdown_grace_s)
        self._watchdog = StallWatchdog(
            run.stats,
            warn_after_s=operations.stall_warning_s,
            abort_after_s=operations.stall_abort_s,
            on_abort=self._abort,
        )
        self._commands = RunCommands.of(run.context.spec, run.options)
        self._breaker = AnswerBreaker(plain_run=self._commands.run())
        self._fatal: FatalRunError | None = None
        # A run whose options are not a plain run's (--limit, --sample, --retry-failed...) counts what a
        # plain run would take, as status does, for the backlog it leaves; a plain run's is its own count.
        self._backlog_counted = None if _plain(run.options.selection) else anyio.Event()
        self.series = RunSeries(run.stats)  # real time, like the progress snapshot

    def _abort(self, error: FatalRunError) -> None:
        self._fatal = self._fatal or error
        self._shutdown.stop_now()

    async def execute(self, copies: ReadCopies) -> tuple[RunStatus, FatalRunError | None]:
        if self._options.retry & ANSWER_FAILURE_CLASSES:  # --retry-failed: known to fail, not judged
            failed_before = await self._writer.failed_on_answers()
            self._breaker = AnswerBreaker(failed_before=failed_before, plain_run=self._commands.run())
        async with anyio.create_task_group() as watchers:
            options = self._options
            publish = functools.partial(
                publish_metrics,
                self._stats,
                self._context.spec.name,
                port=options.metrics_port,
                host=self._context.spec.operations.metrics_host,
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
            if self._backlog_counted is not None:
                watchers.start_soon(self._count_backlog, self._backlog_counted)
            if self._options.handle_signals:
                watchers.start_soon(self._shutdown.watch_signals, lambda: self._stats.in_flight)
            try:
                await self._pump()
                await self._keep_retryable()
                if self._backlog_counted is not None:
                    await self._backlog_counted.wait()  # a quick run ends with its backlog counted
                await read_counters_at_end(self._router)  # the servers' prefix-cache counts to the end
                # Its numbers stop here: the metrics' last write, the progress line's, the row, the
                # snapshot and the summary all say these.
                self._stats.end()
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
        return RunStatus.COMPLETED_WITH_FAILURES if self._stats.numbers.failed else RunStatus.COMPLETED

    async def _pump(self) -> None:
        records_tx, records_rx = anyio.create_memory_object_stream[SourceRecord](
            self._context.spec.source.batch_size
        )
        outcomes_tx, outcomes_rx = anyio.create_memory_object_stream[Stored](FLUSH_MAX_ROWS)
        workers = self._router.most_in_flight
        if self._reader.content_counted:  # else the count is not final yet: more may come
            workers = min(workers, self._stats.numbers.pending_at_start)
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
            try:
                async for record in records:
                    if self._shutdown.stopping:
                        return  # records still queued stay pending in the database: the next run does them
                    turn = self._breaker.sent()
                    outcome = await self._extractor.extract(record, outcomes.send)
                    # Sent to the writer first: the breaker may stop the run, and the outcome that
                    # tripped it is kept with the rest of its window.
                    await outcomes.send(outcome)
                    self._judge(turn, outcome)
            except* anyio.BrokenResourceError:
                pass  # the writer failed and closed its stream: its error ends the run, the rest is pending

    def _judge(self, turn: int, outcome: Outcome) -> None:
        """What the outcome of the record sent at ``turn`` says of the server: the answer breaker's
        verdict, and the last server-side failure for the progress line."""
        if isinstance(outcome, Failed):
            self._stats.last_failure = outcome.message
        tripped = self._breaker.observe(turn, outcome)
        if tripped is not None:
            self._abort(tripped)

    async def _keep_retryable(self) -> None:
        """After the answer breaker stopped the run (the writer has drained): the records that failed in
        its window failed on the server's answers, not their own, so a plain run does them again."""
        kept = self._breaker.kept_retryable
        if not kept:
            return
        try:
            changed = await self._writer.keep_retryable(kept, KEPT_NOTE)
        except DatabaseError as error:
            log.warning(
                "the failures of the breaker's window were not made retryable, so a plain run leaves them: "
                f"`{self._commands.run('--retry-failed')}` does them with the rest once the server is fixed",
                error=str(error),
            )
            return
        self._stats.made_transient(changed)

    async def _count_content(self) -> None:
        """Count the records whose content changed while the first requests are out (it hashes every
        record's text), then make the run's pending count final. A count that fails stops the run like
        the stream would (it runs beside it, so its error would otherwise escape the run's accounting)."""
        try:
            counted = await self._reader.count_content()
        except FatalRunError as error:
            self._abort(error)
            return
        numbers, blank = self._stats.numbers, self._reader.blank
        pending = self._options.capped(numbers.pending_at_start + counted)
        backlog = numbers.backlog_at_start + (counted if self._backlog_counted is None else 0)
        more_blank = blank.count > numbers.blank
        self._stats.set_pending(pending, backlog)
        self._stats.set_blank(blank.count)
        if counted:
            log.info("content changed since extraction", records=counted)
        if more_blank:
            say_blank(blank)
        if counted or more_blank:
            await self._writer.update_numbers(self._stats.now())

    async def _count_backlog(self, counted: anyio.Event) -> None:
        """What a plain run would take as this run begins (what status calls pending), for the backlog it
        leaves (``pipeline_records_pending``); a count that fails leaves this run's own, said once."""
        try:
            backlog = await anyio.to_thread.run_sync(self._plain_pending)
        except DatabaseError as error:
            log.warning(
                "the job's pending records were not counted: the run's metrics say its own", error=str(error)
            )
        else:
            self._stats.set_pending(self._stats.numbers.pending_at_start, backlog)
        finally:
            counted.set()

    def _plain_pending(self) -> int:
        cursor = self._writer.connection.cursor()  # its own cursor: the writer goes on committing
        try:
            return pending_count(cursor, PendingQueries(self._context.spec, self._context.version))
        finally:
            cursor.close()

    async def _write_snapshots(self) -> None:
        said = False  # a full disk is said once, not every few seconds
        while True:
            run_id = self._writer.run_id
            error = await anyio.to_thread.run_sync(
                save_snapshot, self._context, run_id, self._stats, "running"
            )
            if error is not None and not said:
                log.warning("the progress snapshot was not written", error=str(error))
            said = error is not None
            await anyio.sleep(SNAPSHOT_INTERVAL_S)


def _plain(selection: Selection) -> bool:
    """A plain run's selection, whatever the seed of a sample it does not take."""
    return selection.limit is None and dataclasses.replace(selection, seed=0) == Selection()
