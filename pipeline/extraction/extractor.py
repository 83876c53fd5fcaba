"""One record, end to end: first request, retries under the policy, validation, a classified outcome.

Each attempt takes a slot on an endpoint from the :class:`~pipeline.servers.router.Router`, and asks for
no more tokens than that endpoint's context leaves after the prompt (:mod:`pipeline.extraction.budget`);
a prompt the estimate puts near the context is counted by the server first, one that certainly does not
fit is a ``too_long`` failure without a request, and one that may fit is sent: a 400 naming the
prompt's tokens then gives the budget that fits (or ``too_long``). What the server counts and what
its answers take teach the run's :class:`~pipeline.extraction.calibration.Calibration`, which every
record's budget then uses; an answer cut off with a budget the context cut below the job's is the
record's fit, not the server's answer: asked again with all the room the server's count leaves, or
``too_long`` with the numbers (never ``truncated``, which the run's answer breaker judges).
Record-level problems always end as a :class:`Failed` outcome (never silently dropped); only a
:class:`FatalRunError` escapes, to stop the run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Protocol

import orjson
import structlog
from pydantic import BaseModel

from pipeline.errors import (
    BadOutputError,
    ConnectionLostError,
    ContextFullError,
    ContextLengthError,
    FailureClass,
    PermanentRecordError,
    RecordError,
    RepetitionLoopError,
    ServerUnreachableError,
    StructuredOutputRejectedError,
    TooLongError,
    TransientError,
    TruncatedError,
)
from pipeline.extraction.budget import (
    BudgetGrowth,
    CountedPrompt,
    PromptCount,
    PromptParts,
    cut_by_the_estimate,
    cut_off_at_context,
    estimated_tokens,
    fitted,
    longest_field,
    needs_count,
    no_room_to_grow,
    prompt_count,
    prompt_floor,
    starved,
    too_long,
)
from pipeline.extraction.calibration import Calibration, fewest_answer_tokens
from pipeline.extraction.outcomes import Extracted, Failed, Outcome, Usage
from pipeline.extraction.parse import (
    from_reasoning,
    larger_budget_request,
    loop_reask_request,
    parse_reply,
    reask_request,
)
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.record_state import RecordState
from pipeline.extraction.retry import RetryPolicy
from pipeline.quality.grounding import Grounder
from pipeline.servers.client import ChatMessage, ChatRequest
from pipeline.servers.endpoint import Endpoint, EndpointEvacuatedError
from pipeline.servers.replies import Reply
from pipeline.servers.router import Router
from pipeline.source.reader import SourceRecord

__all__ = ["BudgetGrowth", "Extractor", "RequestCounters"]  # BudgetGrowth: pipeline.extraction.budget's

log = structlog.get_logger("pipeline.extraction.extractor")

# Failures that say something about the server, not the record: many in a row mean it is broken.
_SERVER_SIDE = frozenset({FailureClass.TRANSIENT, FailureClass.PERMANENT})


class RequestCounters(Protocol):
    """The run's live counters an extractor updates for every request (the run's ``RunStats``)."""

    def request_sent(self) -> int:
        """Count a request as sent and in flight; the ticket ends it in :meth:`request_ended`."""
        ...

    def request_ended(self, ticket: int, *, answered: bool) -> None: ...

    def replied(self, reply: Reply) -> None:
        """Count a reply's tokens."""

    def timed_out(self) -> None: ...


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
        answered_before: Sequence[int] = (),
    ) -> None:
        self._router = router
        self._prompts = prompts
        self._schema = schema
        self._policy = policy
        self._growth = growth
        self._stats = stats
        self._grounder = grounder
        self._fixed = prompts.fixed_messages
        # The run's, as the run has one extractor: every record's requests teach it and use it; it
        # starts from the answers of earlier runs (``answered_before``, oldest first).
        self.calibration = Calibration(fewest_answer_tokens(schema), answered_before)

    async def extract(self, record: SourceRecord, follow_up: ChatMessage | None = None) -> Outcome:
        """``follow_up``: a last message after the record's (a later pass over a chunk says what earlier
        ones found); re-asks keep it, being part of the first request."""
        state = self._state(record, follow_up)
        try:
            async for attempt in self._policy.attempts():
                with attempt:
                    reply, value = await self._attempt(state)
                    self._finished(state, None)
                    self.calibration.answered(reply.completion_tokens)
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
                        from_reasoning=from_reasoning(reply),
                    )
        except RecordError as error:
            return self._failed(record, state, error)
        raise AssertionError("the retry loop ends with a result or an error")

    def _state(self, record: SourceRecord, follow_up: ChatMessage | None) -> RecordState:
        """The record's first request, started above the budget an earlier truncated answer had."""
        budget = record.truncated_at_max_tokens
        first = self._prompts.request_for(record.fields, self._growth.after(budget) if budget else None)
        if follow_up is not None:  # a chunk, a record of its own: no earlier failure of it is known
            first = dataclasses.replace(first, messages=(*first.messages, follow_up))
        parts = PromptParts(longest_field(self._prompts.texts(record.fields)), self._fixed)
        return RecordState.of(record, first, parts)

    def _grounding(self, value: BaseModel, record: SourceRecord) -> str | None:
        if self._grounder is None:
            return None
        texts = self._prompts.texts(record.fields)
        grounding = self._grounder.ground(value.model_dump(mode="json"), texts)
        return orjson.dumps(grounding.to_json()).decode()

    async def _attempt(self, state: RecordState) -> tuple[Reply, BaseModel]:
        try:
            reply = await self._send(state)
        except ContextLengthError as error:
            await self._refused_for_context(state, error)
            raise
        state.last_raw_output = reply.content if reply.content is not None else reply.reasoning
        if reply.prompt_tokens and state.sent is not None:
            state.counted = CountedPrompt(state.sent.messages, reply.prompt_tokens)
        try:
            return reply, parse_reply(reply, self._schema)
        except TruncatedError as error:
            self._after_truncation(state, reply, error)
            raise
        except BadOutputError as error:
            budget = ChatRequest(state.first.messages, state.request.max_tokens)
            state.request = reask_request(budget, error)
            raise

    def _after_truncation(self, state: RecordState, reply: Reply, error: TruncatedError) -> None:
        """The next request after a cut-off answer: the same, fitted to the server's count, when only
        the estimate cut its budget (``too_long`` when the context did); another way after a loop; or
        with a larger budget."""
        assert state.sent is not None  # it was answered
        assert state.endpoint is not None
        context, sent = state.endpoint.context_length, state.sent
        prompt = prompt_count(sent.messages, state.counted)
        if cut_by_the_estimate(reply, sent, state.first.max_tokens, context, prompt, state.parts):
            log.info(
                "answer cut off with a budget the estimate cut: asking again with what the server's "
                "count leaves",
                record_id=state.record_id,
                budget=sent.max_tokens,
                prompt_tokens=prompt.tokens,
            )
        elif isinstance(error, RepetitionLoopError):
            state.request = loop_reask_request(state.first, error, state.sent_max_tokens)
            log.info(
                "repetition loop: asking again for a shorter answer, with penalties on repetition",
                record_id=state.record_id,
                endpoint=state.endpoint.name,
                error=str(error),
            )
        elif context is not None and no_room_to_grow(sent, context, prompt):
            raise ContextFullError(cut_off_at_context(reply, sent, prompt, context)) from error
        else:
            state.request = larger_budget_request(sent, self._growth.factor, self._growth.ceiling)

    async def _refused_for_context(self, state: RecordState, error: ContextLengthError) -> None:
        """The server refused the request for its context (the client now uses the length it named):
        retried once when a smaller budget fits, or may (a prompt only its floor says fits); a prompt
        that alone does not fit is ``too_long``; anything else fails with the numbers."""
        assert state.sent is not None  # it was sent
        assert state.endpoint is not None
        state.refused_for_context = True
        context = error.context_length
        prompt = await self._refused_prompt(state, state.endpoint, error)
        room = context - prompt.tokens
        if room < 1:
            raise too_long(prompt, context, state.parts, state.sent.messages) from error
        if room >= state.sent_max_tokens and prompt.floor is None:  # the 400 is not about the budget
            raise PermanentRecordError(
                f"{error} (by these numbers the request fits: prompt {prompt} + budget "
                f"{state.sent_max_tokens} of a context of {context})"
            ) from error
        log.info(
            "the server's context is shorter than the request: retrying with a budget that fits",
            record_id=state.record_id,
            context_length=context,
            prompt_tokens=prompt.tokens,
            budget=min(room, state.request.max_tokens),
        )

    async def _refused_prompt(
        self, state: RecordState, endpoint: Endpoint, error: ContextLengthError
    ) -> PromptCount:
        """The prompt's tokens after a 400 about the context: as the 400 names them (kept for the
        retry), else the server's count or the estimate, else (both past the context) the floor."""
        assert state.sent is not None
        messages = state.sent.messages
        if error.prompt_tokens is not None and error.prompt_at_least:
            return PromptCount(error.prompt_tokens, exact=False, floor="the server's count")
        if error.prompt_tokens is not None:
            state.counted = CountedPrompt(messages, error.prompt_tokens)
            return PromptCount(error.prompt_tokens, exact=True)
        prompt = prompt_count(messages, state.counted)
        if prompt.exact or prompt.tokens < error.context_length:
            return prompt
        return await self._counted(state, endpoint, messages) or prompt_floor(messages, state.counted)

    async def _send(self, state: RecordState) -> Reply:
        """One attempt, on an endpoint with room. A request that never reached a server (refused),
        lost its connection to a server that is gone, was taken off a stalled endpoint, or was refused
        for its response_format goes again, elsewhere or without it: that costs the record nothing."""
        sent_once = False
        while True:
            async with self._router.slot() as endpoint:
                state.endpoint = endpoint
                with_format = endpoint.client.settings.response_format is not None
                try:
                    state.sent = await self._fitted(state, endpoint)
                    if not sent_once:  # an attempt is a request that goes: a prompt too long is none
                        state.attempts += 1
                        sent_once = True
                    return await self._send_once(endpoint, state.sent, state.usage)
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

    async def _fitted(self, state: RecordState, endpoint: Endpoint) -> ChatRequest:
        """The next request as it may go to ``endpoint``: its budget within what the context leaves,
        the prompt counted by the server first when the estimate puts it near the context; a budget
        only the estimate starves waits for the run to learn the server's rate first."""
        context, request, calibration = endpoint.context_length, state.request, self.calibration
        if needs_count(request, context, prompt_count(request.messages, state.counted)):
            await self._counted(state, endpoint, request.messages)
        need = calibration.answer_need(state.first.max_tokens, state.answer_cut_at)
        if starved(request, context, state.counted, calibration, need):
            await calibration.wait_to_learn()
        refusable = not state.refused_for_context
        return fitted(
            request, context, state.counted, state.parts, calibration, need, may_be_refused=refusable
        )

    async def _counted(
        self, state: RecordState, endpoint: Endpoint, messages: tuple[ChatMessage, ...]
    ) -> PromptCount | None:
        """The server's count of ``messages`` (kept for the record's later requests), or ``None`` from a
        server that cannot count."""
        tokens = await endpoint.client.count_tokens(messages)
        if tokens is None:
            return None
        state.counted = CountedPrompt(messages, tokens)
        self.calibration.counted(estimated_tokens(messages), tokens)
        return PromptCount(tokens, exact=True)

    async def _send_once(self, endpoint: Endpoint, request: ChatRequest, usage: Usage) -> Reply:
        stats = self._stats
        ticket = stats.request_sent()
        answered = False
        started = time.perf_counter()
        try:
            with endpoint.request(), self.calibration.sending():
                reply = await self._learning(endpoint, request)
            answered = True
            usage.add_reply(reply)
            endpoint.answered(reply, time.perf_counter() - started)
        except TransientError as error:
            if error.timed_out:
                stats.timed_out()
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
        stats.replied(reply)
        return reply

    async def _learning(self, endpoint: Endpoint, request: ChatRequest) -> Reply:
        """The server's reply, its count of the prompt (the reply's, or its 400's) taught to the run
        before the request stops being in flight."""
        try:
            reply = await endpoint.client.complete(request)
        except ContextLengthError as error:
            if error.prompt_tokens is not None and not error.prompt_at_least:
                self.calibration.counted(estimated_tokens(request.messages), error.prompt_tokens)
            raise
        self.calibration.counted(estimated_tokens(request.messages), reply.prompt_tokens)
        return reply

    def _finished(self, state: RecordState, error: RecordError | None) -> None:
        if state.endpoint is not None:
            server_side = error is not None and error.failure_class in _SERVER_SIDE
            self._router.record_finished(state.endpoint, server_side_failure=server_side, error=str(error))

    def _model(self, state: RecordState) -> str | None:
        return state.endpoint.config.model if state.endpoint is not None else None

    def _failed(self, record: SourceRecord, state: RecordState, error: RecordError) -> Failed:
        failure_class = error.failure_class
        log.info("record failed", record_id=record.id, failure_class=str(failure_class), error=str(error))
        self._finished(state, error)
        counted, cut_at = state.fit_kept(error) if isinstance(error, TooLongError) else (None, None)
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
            counted_prompt_tokens=counted,
            answer_cut_at=cut_at,
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
