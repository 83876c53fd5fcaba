"""``pipeline status``: done / failed / pending / blank / stale / orphaned, tokens per record, and the
rate and ETA of the last run, for one variant.

While a run holds the database, DuckDB lets no other process open it, so the status comes from the
progress snapshot the run keeps beside the database instead.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.errors import DatabaseLockedError, SourceMissingError
from pipeline.job.spec import JobSpec
from pipeline.quality.found_share import FoundShare, found_shares_sql
from pipeline.reports.chunk_status import ChunkingStatus, chunking_status
from pipeline.reports.variants import check_variant
from pipeline.servers.cache_counters import hit_rate, low_hit_rate_warning
from pipeline.source.blank import BlankRecords, blank_records
from pipeline.source.db import Database, quote
from pipeline.source.pending import PendingQueries, accounted_blank, pending_count, read_blank
from pipeline.source.relation import source_columns, source_relation
from pipeline.source.versions import (
    JOB_CAUSES,
    StaleCause,
    read_stale_counts,
    read_stale_models,
    version_of,
)
from pipeline.store.numbers import RunNumbers
from pipeline.store.opening import open_for_reading
from pipeline.store.read_copy import ReadCopy, read_copy_of
from pipeline.store.run_profiles import BENCH, NOTHING_TO_DO, newest_run
from pipeline.store.snapshot import read_snapshot


@dataclass(frozen=True, slots=True)
class JobStatus:
    database: str
    variant: str = "main"
    source_records: int | None = None  # None: the source cannot be read (``source_problem``)
    done: int | None = None  # current or stale results of records still in the source
    results: int = 0  # the variant's stored results, whether or not their record is in the source
    # Why the source cannot be read (its table is not in the database, a column is missing,
    # source.query fails), with how to fix it: then only what is stored is counted.
    source_problem: str | None = None
    # With the source, ``done + sum(failed) + pending + blank`` is ``source_records``: each record
    # counted once, as a plain run would see it. ``done``: a result the run keeps (stale for a job cause
    # included); ``failed``: by class, a failure it does not retry; ``pending``: what it would take;
    # ``blank``: what it would take but never sends, every prompt field empty. Without the source,
    # ``failed`` is every stored failure.
    failed: dict[str, int] = field(default_factory=dict)
    pending: int | None = None
    blank: BlankRecords = field(default_factory=lambda: BlankRecords(()))  # how many, the first ids
    pending_new: int = 0  # of the pending: records never tried
    pending_retried: dict[str, int] = field(default_factory=dict)  # of the pending: failures retried
    content_changed: int = 0  # of the pending: records whose prompt fields changed since
    redo_failed: int = 0  # of the done: a redo failed since, the older result is kept
    not_taken: int = 0  # a re-run's records without a current result of what it repeats
    # "total" and one count per cause; every key is there, zero before any result is stored
    stale: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("total", *map(str, JOB_CAUSES)), 0))
    models: tuple[str, ...] = ()  # the models a current result is made by: the job's, its endpoints'
    stale_models: dict[str, int] = field(default_factory=dict)  # results stale for the model, by maker
    orphaned: int = 0  # results whose record is no longer in the source
    tokens_per_done: dict[str, float] | None = None  # every attempt's tokens over the records done
    grounding: dict[str, dict[str, float]] = field(default_factory=dict)  # per grounded path
    chunking: ChunkingStatus | None = None  # results merged from a long record's chunks, and passes
    # Results whose answer came in the reasoning field, content null (vLLM issue 23694), and was taken.
    answers_from_reasoning: int = 0
    last_run: dict[str, Any] | None = None
    # The newest run, when it had nothing to do: a quiet night since ``last_run`` (which passes over
    # quiet nights), its ``run_id`` and ``started_at`` (ISO 8601, UTC).
    quiet_run: dict[str, Any] | None = None
    live: dict[str, Any] | None = None  # the snapshot of a run that holds the database right now
    read_copy: ReadCopy | None = None  # a run holds the database: the numbers are its copy's

    @property
    def last_numbers(self) -> RunNumbers | None:
        """The last run's numbers, as its row has them."""
        return RunNumbers.of(self.last_run) if self.last_run else None

    @property
    def rate_per_min(self) -> float | None:
        """The last run's records/min (:attr:`RunNumbers.records_per_min`); None before it finished one."""
        numbers = self.last_numbers
        return numbers.records_per_min if numbers is not None and numbers.records_per_min > 0 else None

    @property
    def eta_s(self) -> float | None:
        """How long the pending records take: a run in progress says (from its live rate); else at the
        last run's rate, unless the server ended it (aborted, stalled: its rate says nothing of how
        fast the next run goes) or nothing is pending."""
        if self.live is not None:
            eta = self.live.get("eta_s")
            return float(eta) if isinstance(eta, int | float) else None
        numbers, run = self.last_numbers, self.last_run or {}
        if numbers is None or not self.pending or run.get("status") in _ENDED_BY_THE_SERVER:
            return None
        return numbers.seconds_for(self.pending)

    @property
    def server_cache(self) -> ServerCache:
        """The servers' prefix-cache hit rate and preemptions in the run going on, else in the last run."""
        if self.live is not None:
            return _live_cache(self.live)
        return server_cache_of(self.last_run) if self.last_run else ServerCache()


@dataclass(frozen=True, slots=True)
class ServerCache:
    """What the servers' ``/metrics`` said of a run (all None: they have none, e.g. behind a proxy)."""

    prefix_cache_hit_rate: float | None = None  # prompt tokens from the prefix cache over those queried
    preemptions: int | None = None
    warnings: tuple[str, ...] = ()  # a low hit rate, and what may cause it


def _live_cache(live: dict[str, Any]) -> ServerCache:
    """A running run's, from its snapshot: its numbers' hit rate, and the warning of that same rate."""
    endpoints = live.get("endpoints")
    urls = (
        [str(n.get("base_url", name)) for name, n in endpoints.items()] if isinstance(endpoints, dict) else []
    )
    return _cache_of(RunNumbers.of(live), ", ".join(urls) or "the run's servers")


def server_cache_of(run: Mapping[str, Any]) -> ServerCache:
    """A stored run's (a runs-table row), from its numbers; a row kept before they held the hit rate,
    from its series (run/series.py), whose last point holds its counts."""
    numbers = RunNumbers.of(run)
    if run.get("prefix_cache_hit_rate") is None and run.get("preemptions") is None:
        series = run.get("series")
        last = series[-1] if isinstance(series, list) and series and isinstance(series[-1], dict) else {}
        queries, preemptions = _number(last.get("prefix_cache_queries")), _number(last.get("preemptions"))
        numbers.prefix_cache_hit_rate = hit_rate(_number(last.get("prefix_cache_hits")), queries)
        numbers.prefix_cache_queries = None if queries is None else round(queries)
        numbers.preemptions = None if preemptions is None else round(preemptions)
    return _cache_of(numbers, str(run.get("base_url")))


def _cache_of(numbers: RunNumbers, where: str) -> ServerCache:
    """The hit rate and preemptions of ``numbers``, and the warning of that same rate (one number)."""
    rate = numbers.prefix_cache_hit_rate
    warning = low_hit_rate_warning(rate, numbers.prefix_cache_reachable, where, numbers.prefix_cache_queries)
    return ServerCache(rate, numbers.preemptions, (warning,) if warning else ())


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


#: Run statuses whose rate is no estimate for the next run.
_ENDED_BY_THE_SERVER = frozenset({"aborted", "stalled"})
#: What a live run's progress snapshot adds to the numbers of its read copy: what the copy cannot have.
#: Its counts (done, failed, remaining) are left out: taken at another moment than the copy's, they
#: would not add up with them.
LIVE_BESIDE_COPY = (
    *("run_id", "status", "pid", "as_of", "in_flight", "attempts", "records_per_min"),
    *("output_tokens_per_s", "eta_s", "elapsed_s", "timeouts", "endpoints"),
    *("prefix_cache_hit_rate", "prefix_cache_queries", "prefix_cache_recent_hit_rate", "preemptions"),
    "prefix_cache_reachable",
)


def job_status(spec: JobSpec, *, local: bool = False) -> JobStatus:
    """Read the job's status, judged against the job as a run makes it (``local``: as ``--local``
    runs it, with the bundled model; give a spec with other overrides, e.g. ``--model``, for those).
    Blocking (DuckDB); the CLI calls it directly. While a run holds the database, the counts come
    from its read copy and ``live`` holds its progress snapshot; before the run has written a copy,
    only ``live``."""
    spec = spec.as_run(local=local)
    try:
        connection = open_for_reading(spec)
    except DatabaseLockedError:
        return JobStatus(database=str(spec.database), variant=spec.variant, live=read_snapshot(spec.database))
    try:
        check_variant(connection, spec)
        copy = read_copy_of(connection)
        status = _read_status(connection, spec, running=copy is not None)
    finally:
        connection.close()
    if copy is None:
        return status
    live = read_snapshot(spec.database)
    beside = {key: live[key] for key in LIVE_BESIDE_COPY if key in live} if live is not None else None
    return dataclasses.replace(status, read_copy=copy, live=beside)


def pending_as_read(spec: JobSpec) -> tuple[int | None, ReadCopy | None]:
    """What a plain run would take, as :func:`job_status` counts it, and the read copy it comes from
    while a run holds the database (None, None: the run has written no copy yet). Blocking."""
    try:
        connection = open_for_reading(spec)
    except DatabaseLockedError:
        return None, None
    try:
        return pending_count(connection, PendingQueries(spec, version_of(spec))), read_copy_of(connection)
    finally:
        connection.close()


def blank_as_read(spec: JobSpec) -> BlankRecords | None:
    """What a plain run would take but never sends, every prompt field empty, as :func:`job_status`
    counts it (None: a run holds the database and has written no copy yet). Blocking."""
    try:
        connection = open_for_reading(spec)
    except DatabaseLockedError:
        return None
    try:
        return read_blank(connection, PendingQueries(spec, version_of(spec)))
    finally:
        connection.close()


def _read_status(connection: Database, spec: JobSpec, *, running: bool = False) -> JobStatus:
    base = JobStatus(database=str(spec.database), variant=spec.variant)
    stored = spec.output.results_table.lower() in connection.table_names()
    try:
        source_columns(connection, spec)
    except SourceMissingError as error:  # say so, and still show what the database holds
        base = dataclasses.replace(base, source_problem=str(error))
        return _stored(connection, spec, base, running=running) if stored else base
    total = connection.scalar(f"SELECT count(*) FROM {source_relation(spec)}")
    if not stored:  # before the first run: every record is new, and pending unless it is blank
        blank = blank_records(connection, source_relation(spec), spec.source.id_column, spec.content_fields())
        pending = total - blank.count
        return dataclasses.replace(
            base, source_records=total, done=0, pending=pending, pending_new=pending, blank=blank
        )
    base = dataclasses.replace(base, source_records=total, done=0, pending=total, pending_new=total)
    return _against_source(connection, spec, _stored(connection, spec, base, running=running))


def _against_source(connection: Database, spec: JobSpec, status: JobStatus) -> JobStatus:
    """Each source record once (done, failed or pending, as a plain run sees it), which stored results
    are stale or orphaned, and the models that made them."""
    version = version_of(spec)
    queries = PendingQueries(spec, version)
    parameters = queries.parameters()
    counts = _stale_counts(connection, queries, parameters)
    orphaned = counts.pop("orphaned")
    counts.pop("results")
    return dataclasses.replace(
        _accounted(status, connection.rows(queries.accounting_sql(), parameters), spec),
        orphaned=orphaned,
        stale=counts,
        models=version.models,
        stale_models=read_stale_models(connection, spec, version) if counts[str(StaleCause.MODEL)] else {},
    )


def _accounted(status: JobStatus, rows: list[tuple[Any, ...]], spec: JobSpec) -> JobStatus:
    """``status`` with the counts of :meth:`PendingQueries.accounting_sql`'s rows."""

    def total(state: str, reason: str | None = None) -> int:
        return sum(n for s, r, _, n, _ in rows if s == state and (reason is None or r == reason))

    def by_class(state: str, reason: str | None = None) -> dict[str, int]:
        found: dict[str, int] = {}
        for s, r, failure_class, n, _ in sorted(rows, key=lambda row: str(row[2])):
            if s == state and (reason is None or r == reason):
                found[str(failure_class)] = found.get(str(failure_class), 0) + int(n)
        return found

    return dataclasses.replace(
        status,
        done=total("done"),
        redo_failed=total("done", "failed_redo"),
        failed=by_class("failed"),
        pending=total("pending"),
        blank=accounted_blank(rows, spec),
        pending_new=total("pending", "new"),
        pending_retried=by_class("pending", "retried"),
        content_changed=total("pending", "content"),
        not_taken=total("outside"),
    )


def _stored(connection: Database, spec: JobSpec, status: JobStatus, *, running: bool) -> JobStatus:
    """What the variant's tables hold, whether or not the source is there to match it against."""
    results = connection.scalar(
        f"SELECT count(*) FROM {quote(spec.output.results_table)} WHERE variant = ?", [spec.variant]
    )
    return dataclasses.replace(
        status,
        results=results,
        failed=_failed(connection, spec),
        tokens_per_done=_tokens_per_done(connection, spec),
        grounding=_grounding(connection, spec),
        chunking=chunking_status(connection, spec),
        last_run=_last_run(connection, spec, running=running),
        quiet_run=_quiet_run(connection, spec),
        answers_from_reasoning=_answers_from_reasoning(connection, spec),
    )


def _stale_counts(
    connection: Database, queries: PendingQueries, parameters: dict[str, Any]
) -> dict[str, int]:
    """The results a plain run keeps though the job changed since they were made (``total`` and per
    job cause), and the orphaned. A result whose text changed too is not among them: a plain run
    redoes it, so it is pending (``content_changed``), one story, not two."""
    values = read_stale_counts(connection, queries.spec, queries.version)
    changed = connection.counts(queries.changed_count_sql(), parameters)
    return {
        "results": values["results"],
        "orphaned": values["orphaned"],
        "total": values["stale"] - changed["job_stale"],
        **{str(cause): values[str(cause)] - changed[f"stale_{cause}"] for cause in JOB_CAUSES},
    }


def _failed(connection: Database, spec: JobSpec) -> dict[str, int]:
    rows = connection.rows(
        f"SELECT failure_class, count(*) FROM {quote(spec.output.failures_table)} "
        "WHERE variant = ? GROUP BY ALL ORDER BY ALL",
        [spec.variant],
    )
    return {str(name): int(count) for name, count in rows}


def _answers_from_reasoning(connection: Database, spec: JobSpec) -> int:
    """The variant's results whose answer was recovered from the reasoning field."""
    table = spec.output.results_table
    if "answer_from_reasoning" not in connection.column_names(table):  # a read copy of an older run's
        return 0
    return connection.scalar(
        f"SELECT count(*) FROM {quote(table)} WHERE variant = ? AND answer_from_reasoning", [spec.variant]
    )


def _tokens_per_done(connection: Database, spec: JobSpec) -> dict[str, float] | None:
    """What a done record costs over the variant's runs, as one run's numbers say it of that run
    (:attr:`RunNumbers.tokens_per_done`): their tokens, every request's, over their records done."""
    counts = ("done", "prompt_tokens", "completion_tokens", "reasoning_tokens")
    row = connection.row(
        f"SELECT {', '.join(f'sum({name})' for name in counts)} "
        f"FROM {quote(spec.output.runs_table)} WHERE variant = ?",
        [spec.variant],
    )
    return RunNumbers.of(dict(zip(counts, row or (), strict=False))).tokens_per_done


def _grounding(connection: Database, spec: JobSpec) -> dict[str, dict[str, float]]:
    """Per grounded path, how many extracted values were found in their record's text."""
    sql = found_shares_sql(quote(spec.output.results_table), "variant = ?")
    rows = connection.execute(sql, [spec.variant]).fetchall()
    return {str(path): FoundShare(int(found), int(values)).to_json() for path, found, values in rows}


def _last_run(connection: Database, spec: JobSpec, *, running: bool = False) -> dict[str, Any] | None:
    as_json = _json_columns(connection, spec.output.runs_table)
    # A quiet night (nothing to do) is no last run: its rate and counts would say nothing of the next;
    # nor is a knee a bench sweep kept (no run at all).
    cursor = connection.execute(
        f"SELECT * FROM {quote(spec.output.runs_table)} WHERE variant = ? AND status NOT IN (?, ?) "
        "ORDER BY run_id DESC LIMIT 1",
        [spec.variant, NOTHING_TO_DO, BENCH],
    )
    row = cursor.fetchone()
    if row is None:
        return None
    run = {
        name: orjson.loads(value) if name in as_json and isinstance(value, str) else _plain(value)
        for name, value in zip(cursor.columns, row, strict=True)
    }
    if run["status"] == "running" and not running:
        # We could open the database, so no process holds it: that run was killed without a trace.
        run["status"] = "abandoned"
    return run


def _quiet_run(connection: Database, spec: JobSpec) -> dict[str, Any] | None:
    """The newest run when it had nothing to do (a run going on now is newer: then none)."""
    newest = newest_run(connection, spec)
    if newest is None or not newest.quiet:
        return None
    return {"run_id": newest.run_id, "started_at": newest.started_at}


def _json_columns(connection: Database, table: str) -> set[str]:
    """The table's JSON columns (DuckDB hands them over as text)."""
    rows = connection.rows(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND lower(table_name) = lower(?) AND data_type = 'JSON'",
        [table],
    )
    return {str(name) for (name,) in rows}


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value
