"""The model judge: a model judges every value of a seeded sample's results, and its verdicts are
stored as judgments by ``model:<model>`` beside the people's (:mod:`pipeline.store.judgments`).

A model judges a larger sample than people do, and the statistics combine its many judgments with
their few: the sample of ``--sample N --seed S`` is nested (the 100 records people judged are inside
the 2,000 the model judged, seed for seed), which is what pairs them up.

For each record of the sample with a result of a variant: ONE request, with the record's text and the
numbered values of its answer (:func:`~pipeline.quality.judgments.values_to_judge`), asking for a
verdict per value (:mod:`pipeline.judging.model_prompt`); a bad answer is asked again, a failure retried,
under the one retry policy (:mod:`pipeline.extraction.retry`). A record's verdicts are written together,
in batches of records, each batch in one transaction; the database is open only while a batch is
written, never on the event loop. A record this judge already judged for its current result is skipped,
so an interrupted judging resumes where it stopped: nothing is judged twice and nothing written is lost.
A record whose judging fails after its retries is counted and named, and the others go on; when records
fail and none is judged (``retry.abort_after_consecutive_failures`` in a row, or every one), it stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.from_thread
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.errors import (
    BadOutputError,
    ConfigError,
    ContextLengthError,
    FatalRunError,
    PermanentRecordError,
    RecordError,
    StructuredOutputRejectedError,
    first_error,
)
from pipeline.extraction.parse import parse_reply
from pipeline.extraction.prompt import client_settings
from pipeline.extraction.retry import RetryPolicy
from pipeline.job.commands import command
from pipeline.job.judge import JudgeSettings
from pipeline.job.spec import JobSpec
from pipeline.judging.model_prompt import Asking, JudgePrompts, verdicts_model, verdicts_of
from pipeline.judging.model_store import JudgedRecord, JudgingTask, read_sample_to_judge, write_judged
from pipeline.quality.judgments import JudgmentVerdict, model_judge
from pipeline.reports.reading import Sample
from pipeline.servers.client import ClientSettings, LLMClient
from pipeline.servers.config import LOCAL_ENDPOINT
from pipeline.servers.replies import Reply
from pipeline.wording import counted

log = structlog.get_logger("pipeline.judging.model")

#: A batch of judged records is written at most this often (or when it reaches FLUSH_MAX_RECORDS):
#: each write opens the database, and a judge at c=256 finishes tens of records a second.
FLUSH_INTERVAL_S = 0.5
FLUSH_MAX_RECORDS = 500


@dataclass(frozen=True, slots=True)
class JudgingFailure:
    """A record (of a variant) the model could not judge, after its retries."""

    record_id: str
    variant: str
    failure_class: str
    message: str


@dataclass(frozen=True, slots=True)
class ModelJudging:
    """What a model judge did over a sample (so far, when a progress callback is handed it)."""

    judge: str  # model:<model>
    variants: tuple[str, ...]
    sample: Sample | None
    records: int  # records of the sample with a result, once per variant
    skipped: int  # already judged by this judge, for their current result
    empty: int  # results with no value to judge (every field null or empty)
    judged: int  # judged now, and written
    values: int  # values judged now
    correct: int  # of them, judged correct
    failed: tuple[JudgingFailure, ...]
    changed: int  # redone by a run while being judged: their verdicts were not written
    requests: int
    seconds: float

    @property
    def failures(self) -> dict[str, int]:
        """Failed records by failure class."""
        return dict(Counter(failure.failure_class for failure in self.failed))

    @property
    def correct_share(self) -> float | None:
        return self.correct / self.values if self.values else None

    @property
    def values_per_s(self) -> float:
        return self.values / self.seconds if self.seconds > 0 else 0.0

    @property
    def left(self) -> int:
        """Records still to judge (nothing when the judging ended)."""
        done = self.skipped + self.empty + self.judged + len(self.failed) + self.changed
        return max(0, self.records - done)


Progress = Callable[[ModelJudging], None]


@dataclass(slots=True)
class _Tally:
    judge: str
    variants: tuple[str, ...]
    sample: Sample | None
    started: float = field(default_factory=time.perf_counter)
    records: int = 0
    skipped: int = 0
    empty: int = 0
    judged: int = 0
    values: int = 0
    correct: int = 0
    failed: list[JudgingFailure] = field(default_factory=list)
    changed: int = 0
    requests: int = 0

    def written(self, kept: Sequence[JudgedRecord], changed: int) -> None:
        self.judged += len(kept)
        self.values += sum(len(item.verdicts) for item in kept)
        self.correct += sum(verdict is JudgmentVerdict.CORRECT for item in kept for verdict in item.verdicts)
        self.changed += changed

    @property
    def sent(self) -> int:
        """Records this judging sends requests for."""
        return self.records - self.skipped - self.empty

    def snapshot(self) -> ModelJudging:
        return ModelJudging(
            judge=self.judge,
            variants=self.variants,
            sample=self.sample,
            records=self.records,
            skipped=self.skipped,
            empty=self.empty,
            judged=self.judged,
            values=self.values,
            correct=self.correct,
            failed=tuple(self.failed),
            changed=self.changed,
            requests=self.requests,
            seconds=time.perf_counter() - self.started,
        )


def judge_sample_by_model(
    spec: JobSpec,
    variants: Sequence[str],
    sample: Sample | None,
    *,
    model: str | None = None,
    endpoint: str | None = None,
    progress: Progress | None = None,
) -> ModelJudging:
    """:func:`judge_by_model`, blocking: ``anyio.run``, or inside a running event loop (a notebook)
    one of its own in a worker thread."""
    call = functools.partial(
        judge_by_model, spec, variants, sample, model=model, endpoint=endpoint, progress=progress
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(call)
    with anyio.from_thread.start_blocking_portal() as portal:
        return portal.call(call)


async def judge_by_model(
    spec: JobSpec,
    variants: Sequence[str],
    sample: Sample | None,
    *,
    model: str | None = None,
    endpoint: str | None = None,
    progress: Progress | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> ModelJudging:
    """Judge every value of the results of ``variants`` (default: the spec's) for the records of
    ``sample`` (None: every record) by the judge of ``spec.judge`` (``model``: another model;
    ``endpoint``: the URL of another server, as ``judge.endpoint.base_url`` names one), and store the
    verdicts; return the counts. ``progress`` is handed them after each write and failure.

    Raises :class:`ConfigError` (no database, a variant without results, the judge's server not
    served) or ``DatabaseLockedError`` (a run holds the database) before anything is sent, and
    :class:`FatalRunError` when the judging stops (every request failing, the server refusing the
    key): what was written is kept."""
    settings = spec.judge_settings(model, endpoint)
    _check_served(spec, settings)
    judge, variants = model_judge(settings.model), tuple(variants) or (spec.variant,)
    found = await anyio.to_thread.run_sync(read_sample_to_judge, spec, variants, sample, judge)
    tally = _Tally(judge, variants, sample, records=found.records, skipped=found.skipped, empty=found.empty)
    tasks = found.tasks
    if not tasks:
        return tally.snapshot()
    async with LLMClient(judge_client_settings(spec, settings)) as client:
        await client.check_server()
        judging = _Judging(spec, settings, client, tally, RetryPolicy(spec.retry, sleep=sleep), progress)
        await judging.run(tasks)
    return tally.snapshot()


def judge_client_settings(spec: JobSpec, settings: JudgeSettings) -> ClientSettings:
    """The job's request settings on the judge's server, with its model, concurrency and effort; no
    ``response_format`` of the job's schema (each request carries its own)."""
    return dataclasses.replace(
        client_settings(spec, settings.endpoint),
        reasoning_effort=settings.reasoning_effort,
        response_format=None,
        system_with_schema=None,
    )


def _check_served(spec: JobSpec, settings: JudgeSettings) -> None:
    if settings.endpoint.base_url == LOCAL_ENDPOINT:
        raise ConfigError(
            f"{spec.source_file}: key 'judge.endpoint.base_url': the job's server is "
            f"'{LOCAL_ENDPOINT}', which is not served while judging: give the judge a running server's "
            f"URL (`{command('serve-local')}` prints one)"
        )


class _Judging:
    """The workers (one request in flight each) and the writer of one judging."""

    def __init__(
        self,
        spec: JobSpec,
        settings: JudgeSettings,
        client: LLMClient,
        tally: _Tally,
        policy: RetryPolicy,
        progress: Progress | None,
    ) -> None:
        self._spec = spec
        self._client = client
        self._tally = tally
        self._policy = policy
        self._progress = progress
        self._prompts = JudgePrompts(spec.schema_class, settings)
        self._structured = settings.endpoint.structured_output
        self._concurrency = settings.endpoint.most_in_flight
        self._ceiling = spec.retry.max_tokens_ceiling or settings.max_tokens * 4
        self._failed_in_row = 0
        self._abort_after = spec.retry.abort_after_consecutive_failures
        self._stopped: FatalRunError | None = None

    async def run(self, tasks: Sequence[JudgingTask]) -> None:
        """Judge ``tasks`` ``concurrency`` at a time while one writer stores what they judge."""
        send_tasks, receive_tasks = anyio.create_memory_object_stream[JudgingTask](len(tasks))
        with send_tasks:
            for task in tasks:
                send_tasks.send_nowait(task)
        send_judged, receive_judged = anyio.create_memory_object_stream[JudgedRecord](self._concurrency)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._write_all, receive_judged)
                async with send_judged, receive_tasks, anyio.create_task_group() as workers:
                    for _ in range(min(self._concurrency, len(tasks))):
                        workers.start_soon(self._work, receive_tasks.clone(), send_judged.clone(), workers)
        except* FatalRunError as group:  # the writer's: the database failed, or a run holds it now
            self._stopped = self._stopped or first_error(group)
        if self._stopped is not None:
            raise self._stopped

    async def _work(
        self,
        tasks: MemoryObjectReceiveStream[JudgingTask],
        judged: MemoryObjectSendStream[JudgedRecord],
        workers: TaskGroup,
    ) -> None:
        async with tasks, judged:
            async for task in tasks:
                try:
                    verdicts = await self._judge(task)
                except RecordError as error:
                    self._failed(task, error)
                except FatalRunError as error:
                    self._stopped = self._stopped or error
                else:
                    self._failed_in_row = 0
                    try:
                        await judged.send(JudgedRecord(task, verdicts))
                    except anyio.BrokenResourceError:
                        return  # the writer failed: its error ends the judging
                if self._stopped is not None:
                    workers.cancel_scope.cancel()

    async def _judge(self, task: JudgingTask) -> tuple[JudgmentVerdict, ...]:
        first = self._prompts.request_for(task.texts, task.values, structured=self._structured)
        asking = Asking(first, self._spec.retry.truncation_growth, self._ceiling)
        answer = verdicts_model(len(task.values))
        async for attempt in self._policy.attempts():
            with attempt:
                reply = await self._send(asking)
                try:
                    verdicts = parse_reply(reply, answer)
                except BadOutputError as error:
                    asking.after_bad_answer(error)
                    raise
                return tuple(verdicts_of(verdicts, len(task.values)))
        raise AssertionError("the retry loop ends with verdicts or an error")

    async def _send(self, asking: Asking) -> Reply:
        """One attempt; a server that refuses ``response_format`` is asked again without it, at no cost
        (the system prompt says the answer's shape, and validation and re-asks hold it to it)."""
        while True:
            request = asking.request
            if not self._structured:
                request = dataclasses.replace(request, response_format=None)
            self._tally.requests += 1
            try:
                return await self._client.complete(request)
            except StructuredOutputRejectedError as error:
                if request.response_format is None:  # refused without it: about this record
                    raise PermanentRecordError(str(error)) from error
                if self._structured:
                    log.warning(
                        "the judge's server refuses response_format: asking without it", error=str(error)
                    )
                    self._structured = False
            except ContextLengthError as error:
                asking.after_context_refused(error)
                raise

    def _failed(self, task: JudgingTask, error: RecordError) -> None:
        said = " ".join(str(error).split())
        failure = JudgingFailure(task.record_id, task.variant, str(error.failure_class), said)
        log.info("record not judged", record_id=task.record_id, variant=task.variant, error=said)
        self._tally.failed.append(failure)
        self._failed_in_row += 1
        every = self._failed_in_row == self._tally.sent
        if self._stopped is None and (every or self._failed_in_row >= self._abort_after):
            in_row = "every record" if every else f"{counted(self._failed_in_row, 'record')} in a row"
            self._stopped = FatalRunError(
                f"the model judge stopped: {in_row} could not be judged ({failure.failure_class}: {said}); "
                "judgments written so far are kept, and judging again resumes"
            )
        self._report()

    async def _write_all(self, judged: MemoryObjectReceiveStream[JudgedRecord]) -> None:
        """Write what the workers judge in batches until they end; cancelled, it still writes what it
        holds and what is waiting (shielded), as a run's committer does."""
        batch: list[JudgedRecord] = []
        async with judged:
            try:
                ended = False
                while not ended:
                    ended = await _collect(judged, batch)
                    await self._write(batch)
                    batch = []
            except anyio.get_cancelled_exc_class():
                while True:
                    try:
                        batch.append(judged.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self._write(batch)
                raise

    async def _write(self, batch: Sequence[JudgedRecord]) -> None:
        if not batch:
            return
        with anyio.CancelScope(shield=True):
            kept = await anyio.to_thread.run_sync(write_judged, self._spec, self._tally.judge, batch)
        self._tally.written(kept, len(batch) - len(kept))
        self._report()

    def _report(self) -> None:
        if self._progress is not None:
            self._progress(self._tally.snapshot())


async def _collect(stream: MemoryObjectReceiveStream[JudgedRecord], batch: list[JudgedRecord]) -> bool:
    """Receive into ``batch``: one, then more until FLUSH_INTERVAL_S passes or it is full; True when the
    stream has ended."""
    try:
        batch.append(await stream.receive())
        with anyio.move_on_after(FLUSH_INTERVAL_S):
            while len(batch) < FLUSH_MAX_RECORDS:
                batch.append(await stream.receive())
    except anyio.EndOfStream:
        return True
    return False
