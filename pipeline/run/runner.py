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
import functools
from typing import TYPE_CHECKING

import anyio
import structlog

from pipeline.errors import ConfigError, DatabaseError, FatalRunError
from pipeline.extraction.documents import DocumentExtractor
from pipeline.job.spec import JobSpec
from pipeline.quality.drift import BASELINE_RUNS, Drift, find_drift
from pipeline.run.context import RunContext
from pipeline.run.execution import RunExecution, save_snapshot
from pipeline.run.extractors import record_extractor
from pipeline.run.fleet import open_fleet, read_counters_at_end
from pipeline.run.notices import stale_kept, warn_if_timeout_is_short
from pipeline.run.options import RunOptions, RunStatus, RunSummary
from pipeline.run.preflight import warn_before_start
from pipeline.run.read_copies import ReadCopies
from pipeline.run.series import RunSeries
from pipeline.run.stats import RunStats
from pipeline.servers.router import Router
from pipeline.source.db import Database
from pipeline.source.lock import RunLock
from pipeline.source.reader import SourceReader
from pipeline.source.relation import count_records
from pipeline.store.chunks import ChunkStore
from pipeline.store.opening import known_knees, prepare_database
from pipeline.store.read_copy import remove_copies
from pipeline.store.writer import RunStart, StoreWriter

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions

__all__ = ["RunOptions", "RunStatus", "RunSummary", "count_pending", "run_job", "run_job_locally"]

log = structlog.get_logger("pipeline.run.runner")

#: The message of a run its caller cancelled (the row's status is ``interrupted``).
CANCELLED = "cancelled by its caller (e.g. asyncio.wait_for's timeout); what finished is saved"


async def count_pending(spec: JobSpec, options: RunOptions | None = None) -> int:
    """Check the database (as a run would) and count what a run would extract."""
    options = options or RunOptions()
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    reader = await SourceReader.open(connection, RunContext.of(spec).pending(options.selection))
    try:
        return options.capped(await reader.count_metadata() + await reader.count_content())
    finally:
        await reader.aclose()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(connection.close)


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
    pending = options.capped(await reader.count_metadata())
    if pending == 0:  # only now is the content phase worth waiting for
        pending = options.capped(await reader.count_content())
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
        await warn_before_start(context, router, pending)
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
    stats = RunStats(
        pending_at_start=pending,
        concurrency=router.most_in_flight,
        abort_after_failures=spec.retry.abort_after_consecutive_failures,
    )
    stats.endpoint_numbers = lambda: {
        e.name: {**e.stats.as_dict(e), "failures_in_a_row": e.health.failures_in_a_row}
        for e in router.endpoints
    }
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
    start = RunStart(context.version.job_hash, spec.model, urls, router.most_in_flight, pending)
    run_id = await writer.begin_run(dataclasses.replace(start, options=options.variant_options))
    log.info(
        "run started",
        job=spec.name,
        variant=spec.variant,
        run_id=run_id,
        pending=pending,
        endpoints=[endpoint.name for endpoint in router.endpoints],
        concurrency=[endpoint.config.concurrency or "auto" for endpoint in router.endpoints],
    )
    run = RunExecution(spec, options, reader, writer, stats, router, extractor)
    try:
        status, fatal = await _with_read_copies(run, connection, spec, run_id)
    except anyio.get_cancelled_exc_class():
        # The caller cancelled the run: what finished is committed (the writer drains first); the row
        # says so, or the next run would take it for one killed without a trace.
        with anyio.CancelScope(shield=True):
            await _finish(writer, router, stats, RunStatus.INTERRUPTED, CANCELLED, quiet=True)
        raise
    await read_counters_at_end(router)  # the servers' prefix-cache counts up to the run's end
    await _finish(writer, router, stats, status, str(fatal) if fatal else None, quiet=fatal is not None)
    run.series.sample()
    return stats, run_id, status, fatal, await _profile_and_drift(writer, run.series)


async def _finish(
    writer: StoreWriter,
    router: Router,
    stats: RunStats,
    status: RunStatus,
    message: str | None,
    *,
    quiet: bool,
) -> None:
    """The run's row and snapshot at its end. ``quiet``: the run is ending on an error of its own already
    (a full disk that also refuses this last update), which stays the one the caller sees."""
    knees = {e.config.knee_key: e.found_knee for e in router.endpoints if e.found_knee is not None}
    try:
        await writer.finish_run(str(status), message, knees)
    except DatabaseError as error:
        if not quiet:
            raise
        log.warning("the run's row was not updated at its end", status=str(status), error=str(error))
    unsaved = await anyio.to_thread.run_sync(save_snapshot, writer.spec, writer.run_id, stats, str(status))
    if unsaved is not None:
        log.warning("the progress snapshot was not written", error=str(unsaved))


async def _with_read_copies(
    run: RunExecution, connection: Database, spec: JobSpec, run_id: int
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
