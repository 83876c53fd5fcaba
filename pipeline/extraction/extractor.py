"""One record, end to end: first request, retries under the policy, validation, a classified outcome.

Each attempt takes a slot on an endpoint from the :class:`~pipeline.servers.router.Router`. Record-level
problems always end as a :class:`Failed` outcome (never silently dropped); only a :class:`FatalRunError`
escapes, to stop the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import orjson
import structlog
from pydantic import BaseModel

from pipeline.errors import (
    BadOutputError,
    ConnectionLostError,
    FailureClass,
    PermanentRecordError,
    RecordError,
    ServerUnreachableError,
    StructuredOutputRejectedError,
    TransientError,
    TruncatedError,
)
from pipeline.extraction.outcomes import Extracted, Failed, Outcome, Usage
from pipeline.extraction.parse import grown_budget, larger_budget_request, parse_reply, reask_request
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.retry import RetryPolicy
from pipeline.quality.grounding import Grounder
from pipeline.servers.client import ChatRequest, Reply
from pipeline.servers.endpoint import Endpoint, EndpointEvacuatedError
from pipeline.servers.router import Router
from pipeline.source.reader import SourceRecord

log = structlog.get_logger("pipeline.extraction.extractor")

# Failures that say something about the server, not the record: many in a row mean it is broken.
_SERVER_SIDE = frozenset({FailureClass.TRANSIENT, FailureClass.PERMANENT})


class RequestCounters(Protocol):
    """The run's live counters an extractor updates for every request (the run's ``RunStats``)."""

    timeouts: int
    output_tokens: int
    prompt_tokens: int
    reasoning_tokens: int

    def request_sent(self) -> int:
        """Count a request in flight; the ticket ends it in :meth:`request_ended`."""
        ...

    def request_ended(self, ticket: int, *, answered: bool) -> None: ...


@dataclass(slots=True)
class _RecordState:
    first: ChatRequest
    request: ChatRequest
    attempts: int = 0
    last_raw_output: str | None = None
    usage: Usage = field(default_factory=Usage)
    sent_max_tokens: int = 0  # the budget of the last request sent (the next one may be larger)
    endpoint: Endpoint | None = None  # where the last request went


@dataclass(frozen=True, slots=True)
class BudgetGrowth:
    factor: float
    ceiling: int

    def after(self, max_tokens: int) -> int:
        return grown_budget(max_tokens, self.factor, self.ceiling)


class Extractor:
    def __init__(
        self,
        router: Router,
        prompts: PromptBuilder,
        schema: type[BaseModel],
        policy: RetryPolicy,
        growth: BudgetGrowth,
        stats: RequestCounters,
        grounder: Grounder | None = None,
    ) -> None:
        self._router = router
        self._prompts = prompts
        self._schema = schema
        self._policy = policy
        self._growth = growth
        self._stats = stats
        self._grounder = grounder

    async def extract(self, record: SourceRecord) -> Outcome:
        budget = record.truncated_at_max_tokens
        first = self._prompts.request_for(record.fields, self._growth.after(budget) if budget else None)
        state = _RecordState(first=first, request=first)
        try:
            async for attempt in self._policy.attempts():
                with attempt:
                    reply, value = await self._attempt(state)
                    self._finished(state, None)
                    return Extracted(
                        record.id,
                        value.model_dump_json(),
                        state.attempts,
                        reply,
                        state.usage,
                        state.sent_max_tokens,
                        record.content_hash,
                        self._grounding(value, record),
                        self._model(state),
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
        reply = await self._send(state)
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

    async def _send(self, state: _RecordState) -> Reply:
        """One attempt, on an endpoint with room. A request that never reached a server (refused),
        lost its connection to a server that is gone, was taken off a stalled endpoint, or was refused
        for its response_format goes again, elsewhere or without it: that costs the record nothing."""
        while True:
            async with self._router.slot() as endpoint:
                state.endpoint = endpoint
                with_format = endpoint.client.settings.response_format is not None
                try:
                    return await self._send_once(endpoint, state.request, state.usage)
                except ServerUnreachableError as error:
                    self._router.report_down(endpoint, str(error))
                except ConnectionLostError as error:
                    if not await self._router.confirm_lost(endpoint, str(error)):
                        raise
                except EndpointEvacuatedError:
                    pass
                except StructuredOutputRejectedError as error:
                    if not with_format:  # sent without it, and refused all the same: about the record
                        raise PermanentRecordError(str(error)) from error
                    _without_structured_output(endpoint, error)

    async def _send_once(self, endpoint: Endpoint, request: ChatRequest, usage: Usage) -> Reply:
        stats = self._stats
        ticket = stats.request_sent()
        answered = False
        started = time.perf_counter()
        try:
            with endpoint.request():
                reply = await endpoint.client.complete(request)
            answered = True
            usage.add_reply(reply)
            endpoint.answered(reply, time.perf_counter() - started)
        except TransientError as error:
            if error.timed_out:
                stats.timeouts += 1
                endpoint.timed_out()
                log.warning("request timed out", endpoint=endpoint.name, error=str(error))
            raise
        except (RecordError, StructuredOutputRejectedError):
            answered = True  # the server refused the request: an answer all the same
            endpoint.refused_by_server(time.perf_counter() - started)
            raise
        finally:
            stats.request_ended(ticket, answered=answered)
            usage.requests += 1
            usage.latency_s += time.perf_counter() - started
        stats.output_tokens += reply.completion_tokens or 0
        stats.prompt_tokens += reply.prompt_tokens or 0
        stats.reasoning_tokens += reply.reasoning_tokens or 0
        return reply

    def _finished(self, state: _RecordState, error: RecordError | None) -> None:
        if state.endpoint is not None:
            server_side = error is not None and error.failure_class in _SERVER_SIDE
            self._router.record_finished(state.endpoint, server_side_failure=server_side, error=str(error))

    def _model(self, state: _RecordState) -> str | None:
        return state.endpoint.config.model if state.endpoint is not None else None

    def _failed(self, record: SourceRecord, state: _RecordState, error: RecordError) -> Failed:
        failure_class = error.failure_class
        log.info("record failed", record_id=record.id, failure_class=str(failure_class), error=str(error))
        self._finished(state, error)
        return Failed(
            record.id,
            failure_class,
            str(error),
            state.attempts,
            state.last_raw_output,
            state.usage,
            state.sent_max_tokens or state.request.max_tokens,
            record.content_hash,
            self._model(state),
        )


def _without_structured_output(endpoint: Endpoint, error: StructuredOutputRejectedError) -> None:
    """Said once per endpoint (the other requests already in flight with it are refused too)."""
    if endpoint.client.settings.response_format is None:
        return
    log.warning(
        "the server refuses response_format: sending the schema in the prompt instead, with "
        "validation and re-asks (no record fails for it)",
        endpoint=endpoint.name,
        error=str(error),
    )
    endpoint.client.without_structured_output()
