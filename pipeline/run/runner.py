"""``run_job``: one task group, producer → bounded stream → N workers → one store writer.

* In-flight requests never exceed each endpoint's limit: every attempt takes a slot from the router;
  the workers (as many as the endpoints may ever have in flight) each hold one record.
* Records and outcomes travel through bounded memory-object streams, so memory stays flat.
* The writer (:mod:`pipeline.run.committer`) commits batches in shielded transactions: a crash loses at
  most what was in flight, and resume redoes exactly that.
* What is pending (:mod:`pipeline.source.pending`) is counted in two phases; the content phase (hashing
  every record's text) is counted in the background while the first requests are out.
* The task groups themselves, and how a fatal error or a signal stops them while the writer drains, are
  :mod:`pipeline.run.execution`. Here the run is recorded: its row is finished whatever ended it, also
  when the caller cancels the run (``asyncio.wait_for``): then ``interrupted``, never ``abandoned``.
* Requests go through the :mod:`pipeline.servers.router` to the job's endpoints
  (:mod:`pipeline.run.fleet`), each at its own concurrency; an endpoint that goes away is held while
  the others go on.
* One ``pipeline run`` per job at a time (:mod:`pipeline.source.lock`); a stall watchdog
  (:mod:`pipeline.run.watchdog`) and the router keep an unattended run from hanging or failing records
  while a server restarts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import structlog

from pipeline.errors import DatabaseError, FatalRunError
from pipeline.extraction.calibration import LEARNED_WINDOW
from pipeline.extraction.context import RunContext
from pipeline.job.spec import JobSpec
from pipeline.quality.drift import BASELINE_RUNS, Drift, ProfiledRun, describe_runs, judge_last
from pipeline.run.execution import OpenRun, RunExecution, save_snapshot
from pipeline.run.extractors import record_extractor
from pipeline.run.fleet import check_fleet, knees_to_store, open_fleet
from pipeline.run.notices import say_blank, stale_kept, warn_if_timeout_is_short
from pipeline.run.options import RunCommands, RunOptions, RunStatus, RunSummary
from pipeline.run.preflight import warn_before_start
from pipeline.run.prometheus import write_textfile_once
from pipeline.run.read_copies import ReadCopies
from pipeline.run.series import RunSeries
from pipeline.run.stats import RunStats
from pipeline.servers.router import Router
from pipeline.source.blank import BlankRecords
from pipeline.source.db import Database
from pipeline.source.lock import RunLock
from pipeline.source.reader import SourceReader
from pipeline.source.relation import count_records
from pipeline.store.chunks import ChunkStore
from pipeline.store.numbers import RunNumbers
from pipeline.store.opening import known_knees, prepare_database
from pipeline.store.read_copy import remove_copies
from pipeline.store.writer import RunStart, StoreWriter

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions

__all__ = [
    "JobRun",
    "RunOptions",
    "RunStatus",
    "RunSummary",
    "count_pending",
    "run_job",
    "run_job_locally",
    "runner_for",
]

log = structlog.get_logger("pipeline.run.runner")

#: The message of a run its caller cancelled (the row's status is ``interrupted``).
CANCELLED = "cancelled by its caller (e.g. asyncio.wait_for's timeout); what finished is saved"

Runner = Callable[[JobSpec, RunOptions | None], Awaitable[RunSummary]]


async def count_pending(spec: JobSpec, options: RunOptions | None = None) -> int:
    """Check the database (as a run would) and count what a run would extract."""
    options = options or RunOptions()
    async with _opened_source(RunContext.of(spec), options) as (_, reader):
        return options.capped(await reader.count_metadata() + await reader.count_content())


async def run_job(spec: JobSpec, options: RunOptions | None = None) -> RunSummary:
    """Extract every pending record of ``spec``: on the bundled local vLLM server when the job says so
    (:attr:`JobSpec.runs_locally`, as :meth:`JobSpec.as_run` makes it), started only when there is work
    (``options.local_server``: how). Raises :class:`FatalRunError` (incl. ConfigError)."""
    return await JobRun(RunContext.of(spec.as_run()), options or RunOptions()).run()


async def run_job_locally(
    spec: JobSpec, options: RunOptions | None = None, server: LocalServerOptions | None = None
) -> RunSummary:
    """Run ``spec`` against a local vLLM server started (and stopped) for this run, whatever its
    endpoint (``--local``), through exactly the same code as against any other server; a configuration
    error, or nothing to do, starts no server. ``server``: how to start it (default: as
    ``options.local_server`` says, else the bundled model's defaults)."""
    if server is not None:
        options = dataclasses.replace(options or RunOptions(), local_server=server)
    return await run_job(spec.as_run(local=True), options)


def runner_for(spec: JobSpec, *, local: bool = False) -> Runner:
    """How a run of ``spec`` is started: on the bundled local server when asked (``--local``) or when
    the job says so (:attr:`JobSpec.runs_locally`), else against the job's servers."""
    return run_job_locally if local or spec.runs_locally else run_job


class JobRun:
    """One run of a job, from its lock to its summary. It opens the database connection and the source
    reader, counts what is pending, and only then the run's parts, as one value (:func:`opened_run`),
    closed in reverse. The parts it hands on take its context (:class:`RunContext`), never the spec alone."""

    def __init__(self, context: RunContext, options: RunOptions) -> None:
        self.context = context
        self.options = options
        self._commands = RunCommands.of(context.spec, options)  # what its own lines name

    async def run(self) -> RunSummary:
        with RunLock(self.context.database):
            async with _opened_source(self.context, self.options) as (connection, reader):
                selected = await reader.count_metadata()
                if selected == 0:  # only now is the content phase worth waiting for
                    selected = await reader.count_content()
                say_blank(reader.blank)
                if selected == 0:
                    return await self._nothing_to_do(connection, reader)
                warn_if_timeout_is_short(self.context)
                opening = opened_run(self.context, self.options, connection, reader, selected)
                async with opening as run:
                    status, fatal, drift = await _recorded(run)
                numbers = run.stats.end()
                log.info(
                    "run ended",
                    run_id=run.writer.run_id,
                    status=str(status),
                    done=numbers.done,
                    failed=numbers.failed,
                    attempts=numbers.attempts,  # what a run stopped by an error says instead of a summary
                    records_per_min=round(numbers.records_per_min, 1),
                    elapsed_s=round(numbers.elapsed_s, 1),
                )
                if fatal is not None:
                    raise fatal
                kept = await stale_kept(reader, self._commands.run("--redo-stale"))
                return self._summary(
                    run.writer.run_id, status, numbers, kept, drift=drift, blank=reader.blank
                )

    def _summary(
        self,
        run_id: int,
        status: RunStatus,
        numbers: RunNumbers,
        stale: Mapping[str, int],
        *,
        drift: tuple[Drift, ...] = (),
        source_records: int | None = None,
        blank: BlankRecords | None = None,
    ) -> RunSummary:
        spec = self.context.spec
        return RunSummary(
            run_id,
            status,
            spec.database,
            spec.output.results_table,
            spec.output.failures_table,
            numbers,
            stale_kept=stale,
            variant=spec.variant,
            drift=drift,
            source_records=source_records,
            blank=blank,
        )

    async def _nothing_to_do(self, connection: Database, reader: SourceReader) -> RunSummary:
        """A quiet night: no record is sent, but its servers are checked as a run's are before its first
        request (:func:`check_fleet`: a broken setup fails tonight, with the same error, not tomorrow,
        whether nothing is pending or every record left is blank), the run is kept (a row with nothing
        done, its blank records counted, so ``report`` says so and judges no earlier run again) and the
        metrics textfile is written, so its age says the nightly run ran."""
        await check_fleet(self.context)
        spec, blank = self.context.spec, reader.blank
        records = await anyio.to_thread.run_sync(count_records, connection, spec)
        textfile = self.options.metrics_textfile
        if textfile is not None:
            stats = RunStats(pending_at_start=0, concurrency=0)
            stats.set_blank(blank.count)
            await write_textfile_once(stats, spec.name, textfile)
        urls = ", ".join(config.base_url for config in self.context.endpoints)
        numbers = RunNumbers(blank=blank.count)
        start = RunStart(
            self.context.version.job_hash, spec.model, urls, None, numbers, self.options.variant_options
        )
        writer = StoreWriter(connection, self.context)
        message = f"nothing pending of {records:,} source records" + (
            f", {blank.count:,} blank" if blank else ""
        )
        run_id = await writer.record_nothing_to_do(start, message)
        log.info("nothing to do", job=spec.name, variant=spec.variant, run_id=run_id)
        kept = await stale_kept(reader, self._commands.run("--redo-stale"))
        return self._summary(
            run_id, RunStatus.NOTHING_TO_DO, numbers, kept, source_records=records, blank=blank
        )


@asynccontextmanager
async def opened_run(
    context: RunContext, options: RunOptions, connection: Database, reader: SourceReader, selected: int
) -> AsyncIterator[OpenRun]:
    """The run's parts, opened in this order and closed in reverse: the router over the job's servers
    (the local one started first, if the job runs there; its context is the one the run runs with), the
    run's live stats, the store writer, the chunks earlier runs kept and the extractor (a bad
    ``chunking:`` is a ConfigError before the run has a row). ``selected``: what the options select,
    --limit aside."""
    knees = await anyio.to_thread.run_sync(known_knees, connection, context.spec) if context.auto else {}
    fleet = open_fleet(context, local=options.local_server, sleep=options.sleep, knees=knees)
    async with fleet as (running, router):
        pending = options.capped(selected)
        await warn_before_start(running, router, pending, RunCommands.of(running.spec, options).check())
        stats = _new_stats(running, router, pending, selected)
        stats.set_blank(reader.blank.count)
        writer = StoreWriter(connection, running)
        answered = await writer.recent_answers(LEARNED_WINDOW)  # what its answers start from
        kept = await ChunkStore.open(connection, running) if running.spec.chunking else None
        try:
            extractor = record_extractor(running, options, router, stats, kept, answered)
            yield OpenRun(running, options, reader, router, stats, writer, extractor)
        finally:
            if kept is not None:
                await kept.aclose()


def _new_stats(context: RunContext, router: Router, pending: int, selected: int) -> RunStats:
    """``pending``: what the run sets out to do; ``selected``: what its options select, --limit aside."""
    stats = RunStats(
        pending_at_start=pending,
        backlog_at_start=selected,
        concurrency=router.most_in_flight,
        abort_after_failures=context.spec.retry.abort_after_consecutive_failures,
    )
    stats.endpoint_numbers = lambda: {
        e.name: {**e.stats.as_dict(e), "failures_in_a_row": e.health.failures_in_a_row}
        for e in router.endpoints
    }
    return stats


async def _recorded(run: OpenRun) -> tuple[RunStatus, FatalRunError | None, tuple[Drift, ...]]:
    """The run with its row in the runs table, finished whatever ended it."""
    await _begin(run)
    execution = RunExecution(run)
    try:
        status, fatal = await _with_read_copies(run, execution)
    except anyio.get_cancelled_exc_class():
        # The caller cancelled the run: what finished is committed (the writer drains first); the row
        # says so, or the next run would take it for one killed without a trace.
        with anyio.CancelScope(shield=True):
            await _finish(run, RunStatus.INTERRUPTED, CANCELLED, quiet=True)
        raise
    await _finish(run, status, str(fatal) if fatal else None, quiet=fatal is not None)
    execution.series.sample()
    return status, fatal, await _profile_and_drift(run, execution.series)


async def _begin(run: OpenRun) -> None:
    spec, router, numbers = run.context.spec, run.router, run.stats.now()
    urls = ", ".join(endpoint.config.base_url for endpoint in router.endpoints)
    start = RunStart(run.context.version.job_hash, spec.model, urls, router.most_in_flight, numbers)
    run_id = await run.writer.begin_run(dataclasses.replace(start, options=run.options.variant_options))
    log.info(
        "run started",
        job=spec.name,
        variant=spec.variant,
        run_id=run_id,
        pending=numbers.pending_at_start,
        endpoints=[endpoint.name for endpoint in router.endpoints],
        concurrency=[endpoint.config.concurrency or "auto" for endpoint in router.endpoints],
    )


async def _finish(run: OpenRun, status: RunStatus, message: str | None, *, quiet: bool) -> None:
    """The run's row and snapshot at its end. ``quiet``: the run is ending on an error of its own
    already (a full disk that also refuses this last update), which stays the one the caller sees."""
    found = knees_to_store(run.router)
    try:
        # Its numbers once the workers stopped: every request sent, the cancelled ones too.
        await run.writer.finish_run(str(status), run.stats.end(), message, found)
    except DatabaseError as error:
        if not quiet:
            raise
        log.warning("the run's row was not updated at its end", status=str(status), error=str(error))
    run_id = run.writer.run_id
    unsaved = await anyio.to_thread.run_sync(save_snapshot, run.context, run_id, run.stats, str(status))
    if unsaved is not None:
        log.warning("the progress snapshot was not written", error=str(unsaved))


async def _with_read_copies(run: OpenRun, execution: RunExecution) -> tuple[RunStatus, FatalRunError | None]:
    """Execute the run while keeping a read copy for readers; remove it when the run ends, so readers
    open the database again."""
    database = run.context.database
    await anyio.to_thread.run_sync(remove_copies, database)  # a killed run's, if any
    cursor = await anyio.to_thread.run_sync(run.writer.connection.cursor)
    try:
        # Real time (not options.sleep, the retry waits tests make instant): a copy every few seconds.
        return await execution.execute(ReadCopies(cursor, run.context, run.writer.run_id))
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(cursor.close)
            await anyio.to_thread.run_sync(remove_copies, database)


async def _profile_and_drift(run: OpenRun, series: RunSeries) -> tuple[Drift, ...]:
    """Keep the run's series and profile, and say what drifted against the runs before it. The
    results are committed already: a failure here is a warning, not the run's end."""
    writer = run.writer
    try:
        await writer.save_series(series.points)
        if run.stats.numbers.finished == 0:  # a run that finished no record: no profile
            return ()
        await writer.profile_run()
        runs = await writer.recent_runs(BASELINE_RUNS + 1)
    except DatabaseError as error:
        log.warning("the run's profile was not kept: no drift check", error=str(error))
        return ()
    verdict = judge_last([ProfiledRun.of(row) for row in runs])
    if verdict.drift:
        said = log.warning if verdict.fails else log.info
        said(
            "the run drifted: numbers moved beyond their usual run-to-run variation"
            if verdict.fails
            else "the run improved: numbers moved for the better beyond their usual variation",
            drift=[entry.describe() for entry in verdict.drift],
            against=describe_runs(verdict.baseline),
        )
    return verdict.drift


@asynccontextmanager
async def _opened_source(
    context: RunContext, options: RunOptions
) -> AsyncIterator[tuple[Database, SourceReader]]:
    """The job's database, checked and brought up to date as a run needs it, and the reader of what
    ``options`` selects; both closed at the end, the database shielded (a caller that cancels the run,
    a notebook's stop, must not keep the file open)."""
    connection = await anyio.to_thread.run_sync(prepare_database, context.spec)
    try:
        reader = await SourceReader.open(connection, context.pending(options.selection))
        try:
            yield connection, reader
        finally:
            await reader.aclose()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(connection.close)
