from __future__ import annotations

import pytest

from pipeline.errors import FailureClass, TooLongError
from pipeline.extraction.budget import (
    CHARS_PER_TOKEN,
    TOKENS_PER_MESSAGE,
    BudgetGrowth,
    CountedPrompt,
    LongestField,
    PromptCount,
    estimated_text_tokens,
    estimated_tokens,
    fitted,
    longest_field,
    needs_count,
    no_room_to_grow,
    prompt_count,
)
from pipeline.servers.client import ChatMessage, ChatRequest

SYSTEM: ChatMessage = {"role": "system", "content": "s" * 300}
USER: ChatMessage = {"role": "user", "content": "u" * 31}
REQUEST = ChatRequest((SYSTEM, USER), max_tokens=500)


def test_the_estimate_rounds_every_message_up_and_adds_the_template() -> None:
    assert estimated_tokens([SYSTEM, USER]) == 100 + 11 + 2 * TOKENS_PER_MESSAGE
    assert CHARS_PER_TOKEN < 3.7  # below what tokenizers use on English and JSON: errs towards more tokens


def test_the_estimate_counts_bytes_so_text_outside_ascii_weighs_more() -> None:
    """A CJK character is three bytes of UTF-8 and often a token of its own: estimated as one, not a
    third of one; an accent costs a byte more."""
    assert estimated_text_tokens("求人" * 30) == 60
    assert estimated_text_tokens("café") == 2 and estimated_text_tokens("cafe") == 2
    assert estimated_text_tokens("é" * 3) == 2


def test_only_a_request_the_estimate_puts_past_the_context_is_counted() -> None:
    estimate = PromptCount(400, exact=False)
    assert not needs_count(REQUEST, None, estimate)  # no context known: nothing to decide
    assert not needs_count(REQUEST, 900, estimate)  # 400 + 500 fit: the estimate will do
    assert needs_count(REQUEST, 899, estimate)  # its budget would be cut, or it may not fit
    assert not needs_count(REQUEST, 899, PromptCount(400, exact=True))  # counted already


def test_the_servers_count_is_used_for_what_it_counted() -> None:
    counted = CountedPrompt(REQUEST.messages, 90)
    assert prompt_count(REQUEST.messages, counted) == PromptCount(90, exact=True)
    added: tuple[ChatMessage, ...] = ({"role": "assistant", "content": "a" * 30}, USER)
    assert prompt_count((*REQUEST.messages, *added), counted) == PromptCount(
        90 + estimated_tokens(added), exact=False
    )
    other: tuple[ChatMessage, ...] = ({"role": "system", "content": "another prompt"}, USER)
    assert prompt_count(other, counted) == PromptCount(estimated_tokens(other), exact=False)
    assert prompt_count(REQUEST.messages, None) == PromptCount(estimated_tokens(REQUEST.messages), False)


@pytest.mark.parametrize(
    ("context", "prompt", "budget"),
    [
        (None, PromptCount(90, exact=True), 500),  # unknown context: the request as it is
        (1000, PromptCount(90, exact=True), 500),  # room enough
        (400, PromptCount(90, exact=True), 310),  # capped at what the context leaves
        (91, PromptCount(90, exact=True), 1),
        (91, PromptCount(90, exact=False), 1),  # the estimate, where the server cannot count
    ],
)
def test_a_request_asks_for_at_most_what_the_context_leaves(
    context: int | None, prompt: PromptCount, budget: int
) -> None:
    sent = fitted(REQUEST, context, prompt)
    assert sent.max_tokens == budget
    assert sent.messages is REQUEST.messages


@pytest.mark.parametrize(("context", "exact"), [(90, True), (10, True), (50, False)])
def test_a_prompt_that_fills_the_context_is_too_long_with_the_numbers_and_the_field(
    context: int, exact: bool
) -> None:
    longest = LongestField("description", 41_000)
    with pytest.raises(TooLongError) as caught:
        fitted(REQUEST, context, PromptCount(90, exact=exact), longest)
    error = caught.value
    assert error.failure_class is FailureClass.TOO_LONG
    assert (error.tokens, error.context, error.exact, error.field) == (90, context, exact, "description")
    counted = "90 tokens" if exact else "about 90 tokens (estimated)"
    assert str(error) == (
        f"the prompt alone does not fit the context: {counted} against a context of {context} tokens "
        "(the server's max_model_len); most of it is field 'description' (41,000 characters): enable "
        "chunking (chunking: field: description), raise the context (the server's --max-model-len), or "
        "shorten the field"
    )


def test_the_longest_field_is_the_one_with_the_most_text() -> None:
    texts = {"title": "Data Engineer", "description": "x" * 50}
    assert longest_field(texts) == LongestField("description", 50)
    assert longest_field({}) is None


def test_room_to_grow() -> None:
    prompt = PromptCount(700, exact=True)
    assert no_room_to_grow(ChatRequest(REQUEST.messages, 300), 1000, prompt)
    assert not no_room_to_grow(ChatRequest(REQUEST.messages, 299), 1000, prompt)
    assert not no_room_to_grow(ChatRequest(REQUEST.messages, 10**6), None, prompt)


def test_budget_growth() -> None:
    growth = BudgetGrowth(2.0, 16384)
    assert [growth.after(budget) for budget in (4096, 8192, 16384)] == [8192, 16384, 16384]
