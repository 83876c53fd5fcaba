from __future__ import annotations

import math

import anyio
import pytest

from pipeline.extraction.calibration import (
    ANSWERS_TO_MEASURE,
    LEARNED_WINDOW,
    RATE_MARGIN,
    AnswerNeed,
    Calibration,
    fewest_answer_tokens,
)
from schemas.linkedin import JobPosting
from tests.support.schemas import Item

pytestmark = pytest.mark.anyio


def test_an_estimate_is_as_it_is_until_the_server_has_counted_a_prompt() -> None:
    calibration = Calibration()
    assert not calibration.learned and calibration.scaled(4000) == 4000
    calibration.counted(4000, 3000)  # the server counts 3 tokens where the estimate says 4
    assert calibration.learned and calibration.scaled(4000) == 3000 * (1 + RATE_MARGIN)
    assert calibration.scaled(401) == math.ceil(401 * 0.75 * (1 + RATE_MARGIN))
    calibration.counted(4000, None)  # a reply without usage, or a 400 without the count: nothing
    calibration.counted(0, 10)
    assert calibration.scaled(4000) == 3000 * (1 + RATE_MARGIN)


def test_the_rate_is_that_of_all_but_the_densest_prompts() -> None:
    """A prompt of figures or code takes more tokens a character than prose: one such prompt among
    many does not raise every later estimate, and the rate of the rest errs upwards."""
    calibration = Calibration()
    for tokens in range(700, 800):  # rates 0.70 .. 0.79 of an estimate of 1000
        calibration.counted(1000, tokens)
    calibration.counted(1000, 1300)
    assert calibration.scaled(100_000) == 79_500 * (1 + RATE_MARGIN)  # the 96th of 101 rates: 0.795
    for _ in range(10):
        calibration.counted(1000, 1300)
    assert calibration.scaled(100_000) == 130_000 * (1 + RATE_MARGIN)  # no longer a few: the run's


def test_only_the_latest_rates_are_learned_from() -> None:
    calibration = Calibration()
    calibration.counted(1000, 900)
    for _ in range(LEARNED_WINDOW):
        calibration.counted(1000, 600)
    assert calibration.scaled(100_000) == 60_000 * (1 + RATE_MARGIN)


def test_until_answers_are_measured_an_answer_needs_the_fewest_tokens_its_schema_allows() -> None:
    assert fewest_answer_tokens(Item) == 5  # braces, and title and skills (the rest have defaults)
    assert fewest_answer_tokens(JobPosting) == 1 + 2 * sum(
        field.is_required() for field in JobPosting.model_fields.values()
    )
    calibration = Calibration(fewest_answer_tokens(Item))
    assert calibration.answer_need(4096) == AnswerNeed(
        5, f"the fewest an answer of the schema can be, until {ANSWERS_TO_MEASURE} answers are measured"
    )
    assert calibration.answer_need(3).tokens == 3  # never more than the job's budget
    assert Calibration(0).answer_need(100).tokens == 1  # nor nothing


def test_once_answers_are_measured_an_answer_needs_what_nearly_all_of_them_took() -> None:
    """Not the longest: a budget most answers fit is worth a request (one cut off is `too_long`);
    one that hardly any answer fits is not."""
    calibration = Calibration(5)
    for tokens in range(ANSWERS_TO_MEASURE - 1):
        calibration.answered(300 + tokens)
    calibration.answered(None)  # a reply without usage says nothing
    assert calibration.answer_need(4096).tokens == 5
    calibration.answered(100)  # one short answer among ten: what 99% took at least is still 100
    need = calibration.answer_need(4096)
    assert need == AnswerNeed(100, "what 99% of the 10 answers measured took at least")
    assert str(need) == "100 tokens (what 99% of the 10 answers measured took at least)"
    for tokens in range(300, 400):
        calibration.answered(tokens)
    assert calibration.answer_need(4096).tokens == 300  # the 2nd of 110: 100, 300
    assert calibration.answer_need(250).tokens == 250


def test_a_record_whose_answer_an_earlier_run_saw_cut_off_needs_more_than_that() -> None:
    """Its answer took every token the context left (308) and did not end: at temperature 0 it takes as
    many again, so a context that leaves no more refuses it unsent; what the run's answers need decides
    when that is more, and nothing past the job's budget is needed."""
    calibration = Calibration(5, [250] * ANSWERS_TO_MEASURE)
    assert calibration.answer_need(4096, cut_before=308) == AnswerNeed(
        309, "its answer was cut off at 308 tokens in an earlier run"
    )
    assert calibration.answer_need(4096, cut_before=200).tokens == 250
    assert calibration.answer_need(4096, cut_before=None).tokens == 250
    assert calibration.answer_need(300, cut_before=308).tokens == 250


def test_a_run_starts_from_what_earlier_runs_answers_took_until_its_own_push_them_out() -> None:
    before = [0, *range(400, 400 + LEARNED_WINDOW)]  # oldest first; a row without usage says nothing
    calibration = Calibration(5, before)
    assert calibration.answer_need(4096) == AnswerNeed(  # the 10th of 1,000 (nearest rank)
        409, f"what 99% of the {LEARNED_WINDOW:,} answers measured took at least, all of them by earlier runs"
    )
    for _ in range(LEARNED_WINDOW // 2):
        calibration.answered(100)  # this run's answers are shorter
    half = LEARNED_WINDOW // 2
    assert calibration.answer_need(4096).why.endswith(f", {half:,} of them by earlier runs")
    assert calibration.answer_need(4096).tokens == 100
    for _ in range(half):
        calibration.answered(100)
    assert (
        calibration.answer_need(4096).why
        == f"what 99% of the {LEARNED_WINDOW:,} answers measured took at least"
    )
    few = Calibration(5, [300] * (ANSWERS_TO_MEASURE - 1))  # too few, even with the run's first
    assert few.answer_need(4096).tokens == 5
    few.answered(310)
    assert few.answer_need(4096) == AnswerNeed(
        300, "what 99% of the 10 answers measured took at least, 9 of them by earlier runs"
    )


async def test_waiting_to_learn_ends_at_once_with_nothing_in_flight() -> None:
    calibration = Calibration()
    assert await calibration.wait_to_learn() is False  # nothing will teach it: the caller asks itself
    calibration.counted(100, 80)
    assert await calibration.wait_to_learn() is True


async def test_waiting_to_learn_ends_when_a_request_in_flight_teaches_the_rate() -> None:
    calibration = Calibration()
    sent, answer = anyio.Event(), anyio.Event()
    learned: list[bool] = []

    async def in_flight() -> None:
        with calibration.sending():
            sent.set()
            await answer.wait()
            calibration.counted(1000, 750)  # taught before the request stops being in flight

    async def waiting() -> None:
        await sent.wait()
        learned.append(await calibration.wait_to_learn())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(in_flight)
            tasks.start_soon(waiting)
            await sent.wait()
            assert learned == []  # still waiting for the answer
            answer.set()
    assert learned == [True]


async def test_waiting_to_learn_ends_when_every_request_in_flight_ended_without_teaching() -> None:
    """A request that timed out or lost its connection counted nothing: the waiting one goes itself."""
    calibration = Calibration()
    learned: list[bool] = []
    first_done, second_done = anyio.Event(), anyio.Event()

    async def in_flight(done: anyio.Event) -> None:
        with calibration.sending():
            await done.wait()

    async def waiting() -> None:
        learned.append(await calibration.wait_to_learn())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(in_flight, first_done)
            tasks.start_soon(in_flight, second_done)
            await anyio.wait_all_tasks_blocked()
            tasks.start_soon(waiting)
            await anyio.wait_all_tasks_blocked()
            first_done.set()
            await anyio.wait_all_tasks_blocked()
            assert learned == []  # the second may still teach it
            second_done.set()
    assert learned == [False]
