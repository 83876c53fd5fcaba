from __future__ import annotations

from collections.abc import Sequence

import pytest

from pipeline.errors import (
    ContextFullError,
    ContextLengthError,
    FatalRunError,
    InvalidJSONError,
    PermanentRecordError,
    PipelineError,
    RepetitionLoopError,
    SchemaInvalidError,
    TransientError,
    TruncatedError,
)
from pipeline.extraction.retry import RetryKind, RetryPolicy, retry_kind
from pipeline.job.spec import RetrySpec
from tests.support.clock import FakeSleep

pytestmark = pytest.mark.anyio


async def run_script(policy: RetryPolicy, script: Sequence[PipelineError | str]) -> tuple[str, int]:
    """Raise the scripted errors in turn; return the first string reached and the attempts used."""
    calls = 0
    async for attempt in policy.attempts():
        with attempt:
            step = script[calls]
            calls += 1
            if isinstance(step, PipelineError):
                raise step
            return step, calls
    raise AssertionError("unreachable")


def policy(sleep: FakeSleep, jitter: float = 0.0, **limits: float) -> RetryPolicy:
    return RetryPolicy(RetrySpec.model_validate(limits), sleep=sleep, jitter=lambda: jitter)


def loop(message: str = "repetition loop") -> RepetitionLoopError:
    return RepetitionLoopError(message, raw_output="[1,1,1", unit="1,")


def test_retry_kinds() -> None:
    assert retry_kind(TransientError("x")) is RetryKind.TRANSIENT
    assert retry_kind(InvalidJSONError("x")) is RetryKind.REASK
    assert retry_kind(SchemaInvalidError("x")) is RetryKind.REASK
    assert retry_kind(TruncatedError("x")) is RetryKind.TRUNCATION
    assert retry_kind(loop()) is RetryKind.REPETITION
    assert retry_kind(ContextLengthError("x", context_length=8192)) is RetryKind.CONTEXT
    assert retry_kind(ContextFullError("x")) is None
    assert retry_kind(PermanentRecordError("x")) is None
    assert retry_kind(FatalRunError("x")) is None


async def test_transient_backs_off_exponentially_with_jitter() -> None:
    sleep = FakeSleep()
    errors = [TransientError("503")] * 4
    result = await run_script(
        policy(sleep, jitter=0.0, backoff_initial_s=2, backoff_max_s=10), [*errors, "ok"]
    )
    assert result == ("ok", 5)
    assert sleep.waits == [
        1.0,
        2.0,
        4.0,
        5.0,
    ]  # half of 2, 4, 8, min(16, 10): the fixed half of "equal jitter"
    sleep_full = FakeSleep()
    await run_script(policy(sleep_full, jitter=1.0, backoff_initial_s=2, backoff_max_s=10), [*errors, "ok"])
    assert sleep_full.waits == [2.0, 4.0, 8.0, 10.0]


async def test_retry_after_is_a_floor() -> None:
    sleep = FakeSleep()
    await run_script(policy(sleep, backoff_initial_s=1), [TransientError("429", retry_after=30), "ok"])
    assert sleep.waits == [30.0]


async def test_transient_gives_up_after_its_budget() -> None:
    sleep = FakeSleep()
    with pytest.raises(TransientError, match="last"):
        await run_script(
            policy(sleep, transient_retries=2),
            [TransientError("a"), TransientError("b"), TransientError("last"), "ok"],
        )
    assert len(sleep.waits) == 2


async def test_bad_output_is_retried_at_once_within_its_budget() -> None:
    sleep = FakeSleep()
    assert await run_script(
        policy(sleep, reasks=2), [InvalidJSONError("x"), SchemaInvalidError("y"), "ok"]
    ) == ("ok", 3)
    assert sleep.waits == [0.0, 0.0]
    with pytest.raises(SchemaInvalidError):
        await run_script(
            policy(FakeSleep(), reasks=1), [InvalidJSONError("x"), SchemaInvalidError("y"), "ok"]
        )


async def test_budgets_are_per_kind() -> None:
    script: list[PipelineError | str] = [
        TransientError("t"),
        InvalidJSONError("j"),
        TransientError("t"),
        TruncatedError("l"),
        "ok",
    ]
    assert await run_script(
        policy(FakeSleep(), transient_retries=2, reasks=1, truncation_retries=1), script
    ) == ("ok", 5)


async def test_truncation_budget() -> None:
    with pytest.raises(TruncatedError):
        await run_script(
            policy(FakeSleep(), truncation_retries=1), [TruncatedError("a"), TruncatedError("b"), "ok"]
        )


@pytest.mark.parametrize("error", [PermanentRecordError("400"), FatalRunError("401")])
async def test_not_retried(error: PipelineError) -> None:
    sleep = FakeSleep()
    with pytest.raises(type(error)):
        await run_script(policy(sleep), [error, "ok"])
    assert sleep.waits == []


async def test_observer_sees_each_retry() -> None:
    seen: list[tuple[RetryKind, str, int]] = []
    observed = RetryPolicy(
        RetrySpec(),
        sleep=FakeSleep(),
        jitter=lambda: 0.5,
        observer=lambda kind, error, attempt, wait: seen.append((kind, str(error), attempt)),
    )
    await run_script(observed, [TransientError("t"), InvalidJSONError("j"), "ok"])
    assert seen == [(RetryKind.TRANSIENT, "t", 1), (RetryKind.REASK, "j", 2)]


async def test_repetition_loops_spend_the_truncation_budget() -> None:
    with pytest.raises(RepetitionLoopError, match="second loop"):
        await run_script(
            policy(FakeSleep(), truncation_retries=2),
            [loop(), TruncatedError("cut"), loop("second loop"), "ok"],
        )
    assert await run_script(policy(FakeSleep(), truncation_retries=2), [loop(), loop(), "ok"]) == ("ok", 3)


async def test_a_400_naming_the_context_is_retried_once_at_once() -> None:
    sleep = FakeSleep()
    refused = ContextLengthError("context", context_length=8192)
    assert await run_script(policy(sleep, truncation_retries=0), [refused, "ok"]) == ("ok", 2)
    with pytest.raises(ContextLengthError):
        await run_script(policy(sleep), [refused, refused, "ok"])
    assert sleep.waits == [0.0, 0.0]
