"""A record end to end, whole or in chunks: every record a run extracts goes through here.

Without ``chunking:``, or for a record that fits (:mod:`pipeline.extraction.chunk_plan`), the record
goes to the :class:`~pipeline.extraction.extractor.Extractor` as it is: the same request, the same
outcome. A long record is extracted chunk by chunk: each chunk is a record of its own for the extractor
(the long field is the chunk, the other fields go with it), so it waits for a slot like any request and
has the same retries. The chunks of one pass run at once; a later pass starts when the one before has
finished, and each of its requests lists what was found so far in that chunk, asking only for what is
missing. Each chunk's answer is handed on (``emit``) as soon as it is done, to be kept; chunks an
earlier run kept are taken as they are. When every chunk of every pass is done, the answers are merged
(:mod:`pipeline.extraction.merging`) and validated against the schema: that is the record's result. A
chunk that fails fails the record, naming the chunk; the chunks that finished stay kept for the next try.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import orjson
from pydantic import BaseModel, ValidationError

from pipeline.errors import FailureClass, TooLongError, summarize_validation_error
from pipeline.extraction.budget import estimated_text_tokens
from pipeline.extraction.chunk_plan import ChunkPlanner, DocumentPlan
from pipeline.extraction.extractor import Extractor
from pipeline.extraction.merging import ChunkAnswer, MergedAnswer, found_in_chunk, merge_passes
from pipeline.extraction.outcomes import ChunkDone, Extracted, Failed, Outcome, Usage
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.splitting import Span
from pipeline.quality.grounding import grounding_from_json, grounding_json
from pipeline.servers.client import ChatMessage
from pipeline.source.reader import RecordId, SourceRecord

#: Told to a later pass, after the chunk: "Your previous reply" opens it as it opens a re-ask.
FOUND_INSTRUCTION = (
    "Your previous reply and the other parts of this document already found these values:\n{found}\n"
    "Read the text again and reply with one JSON object of the same schema holding only values the text "
    "has and this list lacks, each copied from the text; give [] or null where there is nothing new."
)

Emit = Callable[[ChunkDone], Awaitable[None]]


class KeptChunks(Protocol):
    """The chunks an earlier run kept (:class:`pipeline.store.chunks.ChunkStore`)."""

    async def finished(self, record_id: RecordId, content_hash: int | None) -> list[ChunkDone]: ...


class DocumentExtractor:
    def __init__(
        self,
        extractor: Extractor,
        prompts: PromptBuilder,
        schema: type[BaseModel],
        planner: ChunkPlanner | None = None,
        kept: KeptChunks | None = None,
    ) -> None:
        self.extractor = extractor
        self.prompts = prompts
        self.schema = schema
        self._planner = planner
        self.kept = kept

    async def extract(self, record: SourceRecord, emit: Emit) -> Outcome:
        """The record's outcome; with chunks, each finished chunk goes to ``emit`` first."""
        if self._planner is None:
            return await self.extractor.extract(record)
        try:
            plan = await self._planner.plan(record)
        except TooLongError as error:
            return Failed(
                record.id, error.failure_class, str(error), 0, None, Usage(), 0, record.content_hash
            )
        if plan is None:
            return await self.extractor.extract(record)
        return await _Document(self, record, plan, emit).run()


def _answer(done: ChunkDone) -> ChunkAnswer:
    grounding = grounding_from_json(done.result.grounding_json) or ()
    return ChunkAnswer(done.chunk, done.pass_, orjson.loads(done.result.data_json), grounding)


def _moved(stored: str | None, field: str, offset: int) -> str | None:
    """Grounding found in a chunk, its offsets in ``field`` moved to the whole field."""
    grounding = grounding_from_json(stored)
    if grounding is None:
        return None
    return grounding_json(value.moved(field, offset) for value in grounding)


def _fitting(found: dict[str, Any], room: int) -> str:
    """``found`` as JSON within ``room`` tokens (estimated): the longest lists lose their last items."""
    while True:
        text = orjson.dumps(found).decode()
        lists = [name for name, value in found.items() if isinstance(value, list) and value]
        if estimated_text_tokens(text) <= room or not lists:
            return text
        longest = max(lists, key=lambda name: len(found[name]))
        found[longest] = found[longest][:-1]


class _Document:
    """One long record's chunks, passes and merge."""

    def __init__(
        self, owner: DocumentExtractor, record: SourceRecord, plan: DocumentPlan, emit: Emit
    ) -> None:
        self.owner, self.record, self.plan, self.emit = owner, record, plan, emit
        self.count = len(plan.spans)
        self.done: dict[tuple[int, int], ChunkDone] = {}  # (pass, chunk) -> its answer
        self.failed: list[tuple[int, int, Failed]] = []

    async def run(self) -> Outcome:
        await self._take_kept()
        for pass_ in range(1, self.plan.passes + 1):
            earlier = self._merged(before=pass_) if pass_ > 1 else None
            async with anyio.create_task_group() as tasks:
                for chunk in range(1, self.count + 1):
                    if (pass_, chunk) not in self.done:
                        tasks.start_soon(self._chunk, pass_, chunk, earlier)
            if self.failed:
                return self._failure()
        return self._result()

    async def _take_kept(self) -> None:
        if self.owner.kept is None:
            return
        for done in await self.owner.kept.finished(self.record.id, self.record.content_hash):
            planned = done.chunks == self.count and done.pass_ <= self.plan.passes
            if planned and self.plan.spans[done.chunk - 1] == Span(done.start, done.end):
                self.done[(done.pass_, done.chunk)] = done

    def _merged(self, before: int | None = None) -> MergedAnswer:
        answers = [
            _answer(done) for key, done in sorted(self.done.items()) if before is None or key[0] < before
        ]
        return merge_passes(self.owner.schema, list(self.owner.prompts.texts(self.record.fields)), answers)

    async def _chunk(self, pass_: int, chunk: int, earlier: MergedAnswer | None) -> None:
        span = self.plan.spans[chunk - 1]
        fields = {**self.record.fields, self.plan.field: self.plan.chunk_text(chunk - 1)}
        piece = SourceRecord(self.record.id, fields, self.record.content_hash)
        follow_up = None if earlier is None else self._found(earlier, chunk)
        outcome = await self.owner.extractor.extract(piece, follow_up)
        if isinstance(outcome, Failed):
            self.failed.append((pass_, chunk, outcome))
            return
        moved = _moved(outcome.grounding_json, self.plan.field, span.start)
        done = ChunkDone(
            self.record.id,
            pass_,
            chunk,
            self.count,
            span.start,
            span.end,
            dataclasses.replace(outcome, grounding_json=moved),
        )
        await self.emit(done)
        self.done[(pass_, chunk)] = done

    def _found(self, earlier: MergedAnswer, chunk: int) -> ChatMessage:
        """What a later pass over ``chunk`` is told was found (within the room the plan keeps for it)."""
        span = self.plan.spans[chunk - 1]
        own = [_answer(done) for (_, number), done in self.done.items() if number == chunk]
        found = found_in_chunk(earlier, own, self.plan.field, span.start, span.end)
        return {
            "role": "user",
            "content": FOUND_INSTRUCTION.format(found=_fitting(found, self.plan.found_room)),
        }

    def _where(self, pass_: int, chunk: int) -> str:
        span = self.plan.spans[chunk - 1]
        in_pass = f", pass {pass_}" if self.plan.passes > 1 else ""
        return (
            f"chunk {chunk} of {self.count} (characters {span.start:,}-{span.end:,} of "
            f"'{self.plan.field}'){in_pass}"
        )

    def _failure(self) -> Failed:
        failures = sorted(self.failed, key=lambda failure: failure[:2])
        pass_, chunk, first = failures[0]
        more = f" ({len(failures) - 1} more chunks failed)" if len(failures) > 1 else ""
        return Failed(
            self.record.id,
            first.failure_class,
            f"{self._where(pass_, chunk)}: {first.message}{more}",
            sum(failure.attempts for _, _, failure in failures),
            first.last_raw_output,
            sum((failure.usage for _, _, failure in failures), Usage()),
            first.max_tokens,
            self.record.content_hash,
            first.model,
            chunked=True,
        )

    def _result(self) -> Outcome:
        merged = self._merged()
        dones = [done for _, done in sorted(self.done.items())]
        try:
            value = self.owner.schema.model_validate(merged.value)
        except ValidationError as error:
            return Failed(
                self.record.id,
                FailureClass.SCHEMA_INVALID,
                f"the merged answer of {self.count} chunks does not validate: "
                f"{summarize_validation_error(error)}",
                0,
                orjson.dumps(merged.value).decode(),
                Usage(),
                0,
                self.record.content_hash,
                chunked=True,
            )
        last = dones[-1].result
        grounded = any(done.result.grounding_json is not None for done in dones)
        return Extracted(
            self.record.id,
            value.model_dump_json(),
            sum(done.result.attempts for done in dones),
            last.reply,
            sum((done.result.usage for done in dones), Usage()),
            max(done.result.max_tokens for done in dones),
            self.record.content_hash,
            grounding_json(merged.grounding) if grounded else None,
            last.model,
            chunking_json=orjson.dumps(self._summary(merged)).decode(),
        )

    def _summary(self, merged: MergedAnswer) -> dict[str, Any]:
        """The results' ``chunks`` column: the chunks, and how many values each pass found first."""
        return {
            "field": self.plan.field,
            "chunks": self.count,
            "passes": self.plan.passes,
            "spans": [[span.start, span.end] for span in self.plan.spans],
            "added": {str(number): count for number, count in merged.added_by_pass.items()},
        }
