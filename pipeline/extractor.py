"""One record, end to end: first request, retries under the policy, validation, a classified outcome.

Record-level problems always end as a :class:`Failed` outcome (never silently dropped); only a
:class:`FatalRunError` escapes, to stop the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson
import structlog
from pydantic import BaseModel

from pipeline.errors import (
    BadOutputError,
    FailureClass,
    FatalRunError,
    RecordError,
    ServerUnreachableError,
    TransientError,
    TruncatedError,
)
from pipeline.llm import ChatRequest, LLMClient, Reply
from pipeline.outcomes import Extracted, Failed, Outcome, SourceRecord, Usage
from pipeline.parse import grown_budget, larger_budget_request, parse_reply, reask_request
from pipeline.prompt import PromptBuilder
from pipeline.quality.grounding import Grounder
from pipeline.retry import RetryPolicy, ServerGate
from pipeline.stats import RunStats

log = structlog.get_logger("pipeline.extractor")

# Failures that say something about the server, not the record: many in a row mean it is down.
_SERVER_SIDE = frozenset({FailureClass.TRANSIENT, FailureClass.PERMANENT})


@dataclass(slots=True)
class _RecordState:
    first: ChatRequest
    request: ChatRequest
    attempts: int = 0
    last_raw_output: str | None = None
    usage: Usage = field(default_factory=Usage)
    sent_max_tokens: int = 0  # the budget of the last request sent (the next one may be larger)


@dataclass(frozen=True, slots=True)
class BudgetGrowth:
    factor: float
    ceiling: int

    def after(self, max_tokens: int) -> int:
        return grown_budget(max_tokens, self.factor, self.ceiling)


class Extractor:
    def __init__(
        self,
        llm: LLMClient,
        prompts: PromptBuilder,
        schema: type[BaseModel],
        policy: RetryPolicy,
        growth: BudgetGrowth,
        stats: RunStats,
        abort_after_consecutive_failures: int,
        gate: ServerGate,
        grounder: Grounder | None = None,
    ) -> None:
        self._llm = llm
        self._prompts = prompts
        self._schema = schema
        self._policy = policy
        self._growth = growth
        self._stats = stats
        self._abort_after = abort_after_consecutive_failures
        self._server_failures_in_a_row = 0
        self._gate = gate
        self._grounder = grounder

    async def extract(self, record: SourceRecord) -> Outcome:
        budget = record.truncated_at_max_tokens
        first = self._prompts.request_for(record.fields, self._growth.after(budget) if budget else None)
        state = _RecordState(first=first, request=first)
        try:
            async for attempt in self._policy.attempts():
                with attempt:
                    reply, value = await self._attempt(state)
                    self._server_failures_in_a_row = 0
                    return Extracted(
                        record.id,
                        value.model_dump_json(),
                        state.attempts,
                        reply,
                        state.usage,
                        state.sent_max_tokens,
                        record.content_hash,
                        self._grounding(value, record),
                    )
        except RecordError as error:
            return self._failed(record, state, error)
        raise AssertionError("the retry loop ends with a result or an error")  # pragma: no cover

    def _grounding(self, value: BaseModel, record: SourceRecord) -> str | None:
        if self._grounder is None:
            return None
        texts = self._prompts.texts(record.fields)
        grounding = self._grounder.ground(value.model_dump(mode="json"), texts)
        return orjson.dumps(grounding.to_json()).decode()

    async def _attempt(self, state: _RecordState) -> tuple[Reply, BaseModel]:
        state.attempts += 1
        state.sent_max_tokens = state.request.max_tokens
        reply = await self._send(state.request, state.usage)
        state.last_raw_output = reply.content if reply.content is not None else reply.reasoning
        try:
            return reply, parse_reply(reply, self._schema)
        except TruncatedError:
            state.request = larger_budget_request(state.request, self._growth.factor, self._growth.ceiling)
            raise
        except BadOutputError as error:
            budget = ChatRequest(state.first.messages, state.request.max_tokens)
            state.request = reask_request(budget, error)
            raise

    async def _send(self, request: ChatRequest, usage: Usage) -> Reply:
        """One attempt. A request that could not connect waits at the gate and goes again: it never
        reached the server, so it costs the record nothing."""
        while True:
            await self._gate.wait_open()
            try:
                return await self._send_once(request, usage)
            except ServerUnreachableError as error:
                await self._gate.hold(error)

    async def _send_once(self, request: ChatRequest, usage: Usage) -> Reply:
        stats = self._stats
        ticket = stats.request_sent()
        answered = False
        started = time.perf_counter()
        try:
            reply = await self._llm.complete(request)
            answered = True
            usage.add_reply(reply)
        except TransientError as error:
            if error.timed_out:
                stats.timeouts += 1
                log.warning("request timed out", error=str(error))
            raise
        except RecordError:
            answered = True  # the server refused the request: an answer all the same
            raise
        finally:
            stats.request_ended(ticket, answered=answered)
            usage.requests += 1
            usage.latency_s += time.perf_counter() - started
        stats.output_tokens += reply.completion_tokens or 0
        stats.prompt_tokens += reply.prompt_tokens or 0
        stats.reasoning_tokens += reply.reasoning_tokens or 0
        return reply

    def _failed(self, record: SourceRecord, state: _RecordState, error: RecordError) -> Failed:
        failure_class = error.failure_class
        log.info("record failed", record_id=record.id, failure_class=str(failure_class), error=str(error))
        if failure_class in _SERVER_SIDE:
            self._server_failures_in_a_row += 1
            if self._server_failures_in_a_row >= self._abort_after:
                raise FatalRunError(
                    f"{self._server_failures_in_a_row} records in a row failed on the server side "
                    f"(last: {error}); stopping the run, results so far are saved"
                ) from error
        return Failed(
            record.id,
            failure_class,
            str(error),
            state.attempts,
            state.last_raw_output,
            state.usage,
            state.sent_max_tokens or state.request.max_tokens,
            record.content_hash,
        )
