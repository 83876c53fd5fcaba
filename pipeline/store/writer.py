"""The single batched writer of outcomes into the job's DuckDB database.

Results are unique per (variant, record id). Each batch of outcomes is one transaction that also moves
the results it replaces into the history table and updates the run's counters, so what ``status``
shows is always what is on disk, and a kill at any moment loses no result and doubles none.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import orjson
import structlog

from pipeline.errors import ANSWER_FAILURE_CLASSES
from pipeline.extraction.context import RunContext
from pipeline.extraction.outcomes import ChunkDone, Extracted, Failed, Stored
from pipeline.job.spec import JobSpec
from pipeline.servers.knee_search import KneeMemory
from pipeline.source.db import UTC_NOW, Database, quote
from pipeline.source.reader import RecordId
from pipeline.store.chunks import chunk_row
from pipeline.store.numbers import RUN_NUMBER_ASSIGNMENTS, RUN_NUMBER_COLUMNS, RunNumbers
from pipeline.store.run_profiles import (
    NOTHING_TO_DO,
    note_failures_before,
    run_profile,
    save_profile,
    save_series,
    stored_runs,
)
from pipeline.store.tables import (
    CHUNK_COLUMNS,
    FAILURE_COLUMNS,
    RESULT_COLUMNS,
    chunks_table,
    history_table,
)
from pipeline.wording import counted

log = structlog.get_logger("pipeline.store.writer")

T = TypeVar("T")

#: Chaos testing only: hold each batch's transaction open this long before committing, so a kill -9
#: can be aimed at the middle of a commit (tests/integration/test_chaos.py).
CHAOS_COMMIT_DELAY_ENV = "PIPELINE_CHAOS_COMMIT_DELAY_S"


@dataclass(frozen=True, slots=True)
class RunStart:
    job_hash: str
    model: str
    base_url: str
    concurrency: int | None  # None: no server was asked (nothing to do)
    numbers: RunNumbers  # as it begins: what it set out to do
    options: Sequence[str] = ()  # the command-line options that changed the job, as given


class StoreWriter:
    """The single writer: owns one connection; every call runs in a worker thread, one at a time."""

    def __init__(self, connection: Database, context: RunContext) -> None:
        self.connection = connection
        self.spec = context.spec
        self.version = context.version
        self.run_id = 0
        self._limiter = anyio.CapacityLimiter(1)
        self._chaos_commit_delay_s = float(os.environ.get(CHAOS_COMMIT_DELAY_ENV) or 0)

    async def _call(self, function: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(function, limiter=self._limiter)

    async def begin_run(self, start: RunStart) -> int:
        self.run_id = await self._call(lambda: self._insert_run(start))
        return self.run_id

    async def record_nothing_to_do(self, start: RunStart, message: str) -> int:
        """Keep a run that had nothing to do (a quiet night) as a row that ended as it began: nothing
        done, no profile, status ``nothing_to_do``, ``message`` saying why. Returns its run id."""
        self.run_id = await self._call(lambda: self._insert_run(start, NOTHING_TO_DO, message))
        return self.run_id

    async def write(self, outcomes: Sequence[Stored], numbers: RunNumbers) -> None:
        """Commit a batch of outcomes and the run's numbers with them counted (``numbers``) in one
        transaction."""
        if outcomes:
            await self._call(lambda: self._write_batch(outcomes, numbers))

    async def update_numbers(self, numbers: RunNumbers) -> None:
        """The run's numbers in its row (e.g. what it set out to do, once the content phase is counted)."""
        await self._call(lambda: self._update_run(numbers, status=None, message=None))

    async def finish_run(
        self,
        status: str,
        numbers: RunNumbers,
        message: str | None = None,
        knees: Mapping[str, KneeMemory] | None = None,
    ) -> None:
        """The run's end, with its numbers once its workers stopped; ``knees``: what `concurrency: auto`
        learned of each endpoint's best level, for the next run to start from (see :func:`known_knees`)."""
        found = {key: known.as_json() for key, known in (knees or {}).items()}
        text = orjson.dumps(found).decode() if found else None
        await self._call(lambda: self._update_run(numbers, status=status, message=message, knees=text))
        recovered = numbers.answers_from_reasoning
        if recovered:
            log.warning(
                f"{counted(recovered, 'answer')} recovered from reasoning: the server "
                "put the JSON in the reasoning field with content null (gpt-oss under structured output, "
                "vLLM issue 23694); taken, and marked in the results' answer_from_reasoning column",
                answers_from_reasoning=recovered,
            )

    async def keep_retryable(self, record_ids: Sequence[RecordId], note: str) -> Counter[str]:
        """Make this run's failures of ``record_ids`` transient, so a plain run does them again: they
        say nothing of their records (the run's answer breaker stopped the run on them). Each message
        then starts with ``note`` and the class it had; returns how many of each class changed."""
        return await self._call(lambda: self._keep_retryable(list(record_ids), note))

    async def failed_on_answers(self) -> frozenset[RecordId]:
        """The variant's records whose failure was on the server's answers (a class of
        :data:`ANSWER_FAILURE_CLASSES`): what ``--retry-failed`` asks for again."""
        sql = (
            f"SELECT record_id FROM {quote(self.spec.output.failures_table)} "
            "WHERE variant = ? AND failure_class IN (SELECT unnest(?))"
        )
        classes = sorted(str(failure_class) for failure_class in ANSWER_FAILURE_CLASSES)
        rows = await self._call(lambda: self.connection.rows(sql, [self.spec.variant, classes]))
        return frozenset(row[0] for row in rows)

    async def recent_answers(self, most: int) -> list[int]:
        """The variant's latest answers' completion tokens, oldest first (:func:`recent_answers`)."""
        return await self._call(lambda: recent_answers(self.connection, self.spec, most))

    async def save_series(self, points: Sequence[Mapping[str, Any]]) -> None:
        """The run's time series (run/series.py) in its row, replacing what was there."""
        await self._call(lambda: save_series(self.connection, self.spec, self.run_id, points))

    async def profile_run(self) -> dict[str, Any]:
        """Profile what this run wrote (store/run_profiles.py), keep it in its row, and return it."""

        def profile() -> dict[str, Any]:
            found = run_profile(self.connection, self.spec, self.run_id)
            save_profile(self.connection, self.spec, self.run_id, found)
            return found

        return await self._call(profile)

    async def recent_runs(self, most: int) -> list[dict[str, Any]]:
        """The variant's last ``most`` profiled runs, oldest first (:func:`stored_runs`)."""
        return await self._call(lambda: stored_runs(self.connection, self.spec, most))

    def _insert_run(self, start: RunStart, status: str = "running", message: str | None = None) -> int:
        """The run's row; a run that goes on (``running``) ends later, any other status ends now."""
        if status == "running":
            note_failures_before(self.connection, self.spec)  # the profile counts the records retried
        table = quote(self.spec.output.runs_table)
        run_id = self.connection.scalar(f"SELECT coalesce(max(run_id), 0) + 1 FROM {table}")
        numbers = ", ".join(name for name, _ in RUN_NUMBER_COLUMNS)
        self.connection.execute(
            f"INSERT INTO {table} (run_id, job_name, variant, job_hash, model, base_url, concurrency, "
            f"started_at, updated_at, ended_at, status, options, message, {numbers}) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, {UTC_NOW}, {UTC_NOW}, "
            f"CASE WHEN ? = 'running' THEN NULL ELSE {UTC_NOW} END, ?, ?, ?, "
            f"{', '.join('?' for _ in RUN_NUMBER_COLUMNS)})",
            [
                run_id,
                self.spec.name,
                self.spec.variant,
                start.job_hash,
                start.model,
                start.base_url,
                start.concurrency,
                status,
                status,
                orjson.dumps(list(start.options)).decode(),
                message,
                *start.numbers.row_values(),
            ],
        )
        return run_id

    def _write_batch(self, outcomes: Sequence[Stored], numbers: RunNumbers) -> None:
        extracted = [o for o in outcomes if isinstance(o, Extracted)]
        failed = [o for o in outcomes if isinstance(o, Failed)]
        chunks = [o for o in outcomes if isinstance(o, ChunkDone)]
        con, out = self.connection, self.spec.output
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        with con.transaction():
            if chunks:
                rows = [chunk_row(done, self.spec, self.version, self.run_id, now) for done in chunks]
                con.append(chunks_table(self.spec), CHUNK_COLUMNS, rows, "upsert")
            if extracted:
                ids = [o.record_id for o in extracted]
                self._move_to_history(ids)
                con.append(
                    out.results_table, RESULT_COLUMNS, [self._result_row(o, now) for o in extracted], "upsert"
                )
                # A record that failed before (transient, or --retry-failed) is no longer a failure.
                keys = [[self.spec.variant, record_id] for record_id in ids]
                con.append(out.failures_table, ["variant", "record_id"], keys, "delete")
            if failed:
                rows = [self._failure_row(o, now) for o in failed]
                con.append(out.failures_table, FAILURE_COLUMNS, rows, "upsert")
            self._update_run(numbers, status=None, message=None)
            if self._chaos_commit_delay_s:
                log.warning("chaos: transaction open before commit", rows=len(outcomes))
                time.sleep(self._chaos_commit_delay_s)

    def _keep_retryable(self, ids: list[RecordId], note: str) -> Counter[str]:
        table = quote(self.spec.output.failures_table)
        where = (
            "variant = ? AND run_id = ? AND record_id IN (SELECT unnest(?)) AND failure_class <> 'transient'"
        )
        keys = [self.spec.variant, self.run_id, ids]
        with self.connection.transaction():
            rows = self.connection.rows(
                f"SELECT failure_class, count(*) FROM {table} WHERE {where} GROUP BY ALL", keys
            )
            self.connection.execute(
                f"UPDATE {table} SET failure_class = 'transient', "
                f"message = ? || failure_class || ': ' || message WHERE {where}",
                [note, *keys],
            )
        return Counter({str(failure_class): int(count) for failure_class, count in rows})

    def _move_to_history(self, ids: list[Any]) -> None:
        """Copy the results these ids replace into the history table (same transaction as the new ones)."""
        columns = ", ".join([*RESULT_COLUMNS, "created_at"])
        self.connection.execute(
            f"INSERT INTO {quote(history_table(self.spec))} ({columns}, superseded_at, superseded_by_run) "
            f"SELECT {columns}, {UTC_NOW}, ? FROM {quote(self.spec.output.results_table)} "
            "WHERE variant = ? AND record_id IN (SELECT unnest(?))",
            [self.run_id, self.spec.variant, ids],
        )

    def _result_row(self, outcome: Extracted, now: dt.datetime) -> list[Any]:
        reply, usage = outcome.reply, outcome.usage
        return [
            self.spec.variant,
            outcome.record_id,
            self.run_id,
            outcome.data_json,
            outcome.attempts,
            reply.prompt_tokens,
            reply.completion_tokens,
            reply.reasoning_tokens,
            reply.latency_s,
            reply.finish_reason,
            outcome.max_tokens,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.reasoning_tokens,
            usage.latency_s,
            outcome.grounding_json,
            *self.version.key_values(outcome.content_hash, outcome.model, chunked=outcome.chunked),
            outcome.chunking_json,
            outcome.from_reasoning,
            now,
        ]

    def _failure_row(self, outcome: Failed, now: dt.datetime) -> list[Any]:
        usage = outcome.usage
        return [
            self.spec.variant,
            outcome.record_id,
            self.run_id,
            str(outcome.failure_class),
            outcome.message,
            outcome.attempts,
            outcome.last_raw_output,
            outcome.max_tokens,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.reasoning_tokens,
            usage.latency_s,
            *self.version.key_values(outcome.content_hash, outcome.model, chunked=outcome.chunked),
            outcome.counted_prompt_tokens,
            outcome.answer_cut_at,
            now,
        ]

    def _update_run(
        self, numbers: RunNumbers, *, status: str | None, message: str | None, knees: str | None = None
    ) -> None:
        self.connection.execute(
            f"UPDATE {quote(self.spec.output.runs_table)} SET {RUN_NUMBER_ASSIGNMENTS}, "
            f"updated_at = {UTC_NOW}, status = coalesce(?, status), message = coalesce(?, message), "
            f"knees = coalesce(?, knees), "
            f"ended_at = CASE WHEN ? IS NULL THEN ended_at ELSE {UTC_NOW} END WHERE run_id = ?",
            [*numbers.row_values(), status, message, knees, status, self.run_id],
        )


def recent_answers(connection: Database, spec: JobSpec, most: int) -> list[int]:
    """The completion tokens of the variant's latest ``most`` results, oldest first: what its answers
    took, for a run (or a check) to start from (:class:`~pipeline.extraction.calibration.Calibration`).
    Blocking."""
    sql = (
        f"SELECT completion_tokens FROM {quote(spec.output.results_table)} "
        "WHERE variant = ? AND completion_tokens > 0 ORDER BY created_at DESC LIMIT ?"
    )
    return [int(tokens) for (tokens,) in reversed(connection.rows(sql, [spec.variant, most]))]
