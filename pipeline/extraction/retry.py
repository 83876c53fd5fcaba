"""The only retry policy: which errors are retried, how often, and how long to wait in between.

* transient (timeouts, resets, 408/429/5xx): exponential backoff with jitter, never sooner than the
  server's ``Retry-After``;
* bad output (invalid JSON, schema-invalid, empty): re-ask at once; the caller builds the new request;
* truncated: retry at once; the caller enlarges the token budget (never past what the context leaves);
* truncated in a repetition loop: retry at once another way (the caller re-asks for a shorter answer,
  with penalties on repetition); it spends the truncation budget, being a truncation too;
* refused for the context length (a 400 naming it): retry once at once; the caller fits the budget;
* anything else (permanent for the record, fatal for the run) is raised at once.

A server that stops accepting connections mid-run (a restart; vLLM loading a 120B model takes
minutes) is not a per-record problem: the :mod:`pipeline.servers.router` holds that endpoint until a
probe sees it answer again, and a request that could not even connect is not counted as an attempt.

Each kind has its own budget of retries per record. Sleeping and randomness are injected, so tests
never wait for real.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

import anyio
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from pipeline.errors import (
    BadOutputError,
    ContextLengthError,
    RecordError,
    RepetitionLoopError,
    TransientError,
    TruncatedError,
)
from pipeline.job.spec import RetrySpec

log = structlog.get_logger("pipeline.extraction.retry")

MAX_RETRY_AFTER_S = 3600.0


class RetryKind(StrEnum):
    TRANSIENT = "transient"
    REASK = "reask"
    TRUNCATION = "truncation"
    REPETITION = "repetition"
    CONTEXT = "context"


#: A 400 naming the context is retried once: the retry asks for what the context leaves.
CONTEXT_RETRIES = 1
# Kinds whose retries come out of another kind's budget.
_BUDGET_OF = {RetryKind.REPETITION: RetryKind.TRUNCATION}


def retry_kind(error: BaseException | None) -> RetryKind | None:
    """How an error is retried, or ``None`` if it is not."""
    if isinstance(error, TransientError):
        return RetryKind.TRANSIENT
    if isinstance(error, RepetitionLoopError):
        return RetryKind.REPETITION
    if isinstance(error, TruncatedError):
        return RetryKind.TRUNCATION
    if isinstance(error, ContextLengthError):
        return RetryKind.CONTEXT
    if isinstance(error, BadOutputError):
        return RetryKind.REASK
    return None


RetryObserver = Callable[[RetryKind, RecordError, int, float], None]
"""Called before each retry with the kind, the error, the attempt number and the wait in seconds."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    limits: RetrySpec
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    jitter: Callable[[], float] = random.random
    observer: RetryObserver | None = None

    def retries_allowed(self, kind: RetryKind) -> int:
        return {
            RetryKind.TRANSIENT: self.limits.transient_retries,
            RetryKind.REASK: self.limits.reasks,
            RetryKind.TRUNCATION: self.limits.truncation_retries,
            RetryKind.REPETITION: self.limits.truncation_retries,
            RetryKind.CONTEXT: CONTEXT_RETRIES,
        }[kind]

    def backoff_s(self, transient_failures: int, retry_after: float | None) -> float:
        """Exponential backoff with "equal jitter" (half fixed, half random), at least Retry-After."""
        ceiling = min(
            self.limits.backoff_max_s, self.limits.backoff_initial_s * 2.0 ** (transient_failures - 1)
        )
        wait = ceiling / 2 + self.jitter() * ceiling / 2
        if retry_after is not None:
            wait = max(wait, min(retry_after, MAX_RETRY_AFTER_S))
        return wait

    def attempts(self) -> AsyncRetrying:
        """A fresh retry loop for one record: ``async for attempt in policy.attempts(): with attempt:``."""
        budget = _RecordBudget(self)
        return AsyncRetrying(
            sleep=self.sleep,
            retry=retry_if_exception(lambda error: retry_kind(error) is not None),
            after=budget.count,
            stop=budget.exhausted,
            wait=budget.wait_s,
            before_sleep=budget.notify,
            reraise=True,
        )


class _RecordBudget:
    """Counts one record's failures per kind, to stop and to size the backoff."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._failures: Counter[RetryKind] = Counter()

    @staticmethod
    def _error(state: RetryCallState) -> BaseException | None:
        return state.outcome.exception() if state.outcome is not None else None

    def count(self, state: RetryCallState) -> None:
        """Runs first after each retryable failure (tenacity: after, then wait, then stop)."""
        kind = retry_kind(self._error(state))
        if kind is not None:
            self._failures[_BUDGET_OF.get(kind, kind)] += 1

    def exhausted(self, state: RetryCallState) -> bool:
        kind = retry_kind(self._error(state))
        if kind is None:
            return True
        return self._failures[_BUDGET_OF.get(kind, kind)] > self._policy.retries_allowed(kind)

    def wait_s(self, state: RetryCallState) -> float:
        error = self._error(state)
        if not isinstance(error, TransientError):
            return 0.0
        return self._policy.backoff_s(self._failures[RetryKind.TRANSIENT], error.retry_after)

    def notify(self, state: RetryCallState) -> None:
        error = self._error(state)
        kind = retry_kind(error)
        if self._policy.observer is not None and kind is not None and isinstance(error, RecordError):
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            self._policy.observer(kind, error, state.attempt_number, wait)
