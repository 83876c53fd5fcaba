from __future__ import annotations

import pytest

from pipeline.errors import ContextFullError
from pipeline.extraction.budget import (
    CHARS_PER_TOKEN,
    TOKENS_PER_MESSAGE,
    BudgetGrowth,
    CountedPrompt,
    PromptCount,
    estimated_tokens,
    fitted,
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
        (50, PromptCount(90, exact=False), 50),  # only an estimate fills it: the server counts
    ],
)
def test_a_request_asks_for_at_most_what_the_context_leaves(
    context: int | None, prompt: PromptCount, budget: int
) -> None:
    sent = fitted(REQUEST, context, prompt)
    assert sent.max_tokens == budget
    assert sent.messages is REQUEST.messages


@pytest.mark.parametrize("context", [90, 10])
def test_a_counted_prompt_that_fills_the_context_is_truncated_with_the_numbers(context: int) -> None:
    with pytest.raises(ContextFullError) as caught:
        fitted(REQUEST, context, PromptCount(90, exact=True))
    assert str(caught.value).startswith(
        f"the prompt alone does not fit the context: 90 tokens against a context of {context} tokens"
    )


def test_room_to_grow() -> None:
    prompt = PromptCount(700, exact=True)
    assert no_room_to_grow(ChatRequest(REQUEST.messages, 300), 1000, prompt)
    assert not no_room_to_grow(ChatRequest(REQUEST.messages, 299), 1000, prompt)
    assert not no_room_to_grow(ChatRequest(REQUEST.messages, 10**6), None, prompt)


def test_budget_growth() -> None:
    growth = BudgetGrowth(2.0, 16384)
    assert [growth.after(budget) for budget in (4096, 8192, 16384)] == [8192, 16384, 16384]
