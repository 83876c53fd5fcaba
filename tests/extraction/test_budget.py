from __future__ import annotations

import pytest

from pipeline.errors import FailureClass, TooLongError
from pipeline.extraction.budget import (
    CHARS_PER_TOKEN,
    FIXED_PART_ADVICE,
    FIXED_PART_FULL,
    ONE_A_WORD,
    TOKENS_PER_MESSAGE,
    BudgetGrowth,
    CountedPrompt,
    LongestField,
    PromptCount,
    PromptParts,
    cut_by_the_estimate,
    cut_off_below_the_job,
    estimated_text_tokens,
    estimated_tokens,
    fewest_tokens,
    fitted,
    longest_field,
    needs_count,
    no_room_to_grow,
    prompt_count,
    prompt_floor,
    starved,
    too_long,
)
from pipeline.extraction.calibration import AnswerNeed, Calibration
from pipeline.servers.client import ChatMessage, ChatRequest
from pipeline.servers.replies import Reply

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


def test_a_prompt_never_counted_is_estimated_at_the_rate_the_run_learned() -> None:
    calibration = Calibration()
    estimate = estimated_tokens(REQUEST.messages)  # 127
    assert prompt_count(REQUEST.messages, None, calibration) == PromptCount(estimate, exact=False)
    calibration.counted(200, 150)  # another prompt, counted by the server at 3/4 of its estimate
    scaled = calibration.scaled(estimate)
    assert scaled == 98  # 127 x 0.75, and the margin
    assert prompt_count(REQUEST.messages, None, calibration) == PromptCount(scaled, exact=False)
    counted = CountedPrompt(REQUEST.messages, 90)  # what the server counted stays its count
    assert prompt_count(REQUEST.messages, counted, calibration) == PromptCount(90, exact=True)
    assert fitted(REQUEST, 400, None, calibration=calibration).max_tokens == 400 - scaled


def test_the_fewest_tokens_are_one_a_word_whatever_its_characters() -> None:
    """A tokenizer splits text at whitespace before it merges (byte-level BPE's pre-tokenizer, and
    SentencePiece's default): no token spans two words, whatever their characters. A run of 500 '='
    or of spaces may be one token, so characters alone bound nothing."""
    prose: ChatMessage = {"role": "user", "content": "We need SQL, and Python.\n\n  Apply now!"}
    assert fewest_tokens([prose]) == 7
    assert fewest_tokens([{"role": "user", "content": "=" * 500 + "\n" + " " * 300}]) == 1
    assert fewest_tokens([SYSTEM, USER]) == 2  # and nothing for the chat template: it may add none


def test_the_floor_uses_the_servers_count_for_what_it_counted() -> None:
    counted = CountedPrompt(REQUEST.messages, 90)
    assert prompt_floor(REQUEST.messages, counted) == PromptCount(90, exact=True)
    added: tuple[ChatMessage, ...] = ({"role": "assistant", "content": "two words"}, USER)
    assert prompt_floor((*REQUEST.messages, *added), counted) == PromptCount(93, False, floor=ONE_A_WORD)
    assert prompt_floor(REQUEST.messages, None) == PromptCount(2, exact=False, floor=ONE_A_WORD)


@pytest.mark.parametrize(
    ("context", "counted", "budget"),
    [
        (None, 90, 500),  # unknown context: the request as it is
        (1000, 90, 500),  # room enough
        (400, 90, 310),  # capped at what the context leaves
        (91, 90, 1),
        (1000, None, 500),  # the estimate (127 tokens) leaves room enough
        (400, None, 273),  # capped at what the estimate leaves
        # The estimate leaves no room, but the prompt may fit: its floor is 2 tokens (one a word). It is
        # sent with what the floor leaves, and the server's answer says the rest.
        (100, None, 98),
    ],
)
def test_a_request_asks_for_at_most_what_the_context_leaves(
    context: int | None, counted: int | None, budget: int
) -> None:
    count = CountedPrompt(REQUEST.messages, counted) if counted is not None else None
    sent = fitted(REQUEST, context, count)
    assert sent.max_tokens == budget
    assert sent.messages is REQUEST.messages


NEED = AnswerNeed(200, "what the job's answers take")


def learned() -> Calibration:
    """A run that has learned the server's rate, one at which (with its margin) an estimate stays what
    it is."""
    calibration = Calibration()
    calibration.counted(102, 100)
    assert calibration.learned and calibration.scaled(estimated_tokens(REQUEST.messages)) == 127
    return calibration


def test_a_budget_only_the_estimate_cuts_below_what_an_answer_needs_goes_with_what_the_floor_leaves() -> None:
    """The estimate (127) leaves 100 of a context of 227; an answer needs 200. The prompt may be
    shorter (its floor is 2 tokens): sent with what the floor leaves, the server's answer or its 400
    counts it. Without a need, the same 100 would go."""
    assert starved(REQUEST, 227, None, learned(), NEED)
    assert fitted(REQUEST, 227, None, need=NEED).max_tokens == 225
    assert fitted(REQUEST, 227, None, calibration=learned(), need=NEED).max_tokens == 225
    assert fitted(REQUEST, 227, None).max_tokens == 100
    assert not starved(REQUEST, 327, None, learned(), NEED)  # 200 left: enough
    assert not starved(REQUEST, None, None, learned(), NEED)
    small = ChatRequest(REQUEST.messages, max_tokens=150)  # asks for less than an answer needs: all of it
    assert (
        starved(small, 227, None, learned(), NEED) and fitted(small, 227, None, need=NEED).max_tokens == 150
    )
    assert not starved(ChatRequest(REQUEST.messages, max_tokens=100), 227, None, learned(), NEED)


def test_before_the_run_has_learned_the_rate_no_budget_the_estimate_cuts_is_sent() -> None:
    """The plain estimate errs towards more tokens (the LinkedIn job's prompts, 1,080 tokens short of a
    4,096 context, got budgets of 26 to 175 and their answers were cut off). Before the server has
    counted a prompt of the run, a budget it cuts waits for the rate, however much it leaves (here 200,
    what an answer needs); nothing to wait for, it goes with what its floor leaves, so that the server's
    answer or its 400 counts the prompt. A budget the estimate does not cut goes as it is."""
    unlearned = Calibration()
    assert starved(REQUEST, 327, None, unlearned, NEED)
    assert fitted(REQUEST, 327, None, calibration=unlearned, need=NEED).max_tokens == 325
    assert not starved(REQUEST, 1000, None, unlearned, NEED)  # 127 + 500 fit: nothing cut
    assert fitted(REQUEST, 1000, None, calibration=unlearned, need=NEED) is REQUEST
    counted = CountedPrompt(REQUEST.messages, 127)  # the server's count: no rate needed
    assert not starved(REQUEST, 327, counted, unlearned, NEED)
    assert fitted(REQUEST, 327, counted, calibration=unlearned, need=NEED).max_tokens == 200
    assert not starved(REQUEST, 327, None, learned(), NEED)
    assert fitted(REQUEST, 327, None, calibration=learned(), need=NEED).max_tokens == 200


def test_a_budget_the_servers_count_cuts_below_what_an_answer_needs_is_too_long_with_both_numbers() -> None:
    counted = CountedPrompt(REQUEST.messages, 150)
    assert not starved(REQUEST, 300, counted, Calibration(), NEED)  # the count: nothing to wait for
    parts = PromptParts(LongestField("description", 9_000))
    with pytest.raises(TooLongError) as caught:
        fitted(REQUEST, 300, counted, parts, need=NEED)
    error = caught.value
    assert (error.failure_class, error.tokens, error.context, error.exact) == (
        FailureClass.TOO_LONG,
        150,
        300,
        True,
    )
    assert str(error) == (
        "the prompt leaves too little of the context for an answer: 150 tokens of a context of 300 "
        "tokens (the server's max_model_len) leaves 150 tokens for the answer, and an answer needs 200 "
        "tokens (what the job's answers take); most of it is field 'description' (9,000 characters): "
        "enable chunking (chunking: field: description), raise the context (the server's "
        "--max-model-len), or shorten the field"
    )
    assert fitted(REQUEST, 350, counted, parts, need=NEED).max_tokens == 200


def test_a_floor_that_leaves_less_than_an_answer_needs_is_too_long_saying_at_most() -> None:
    with pytest.raises(TooLongError) as caught:
        fitted(WORDY, 300, None, need=NEED)
    assert str(caught.value).startswith(
        f"the prompt leaves too little of the context for an answer: at least 201 tokens ({ONE_A_WORD}) "
        "of a context of 300 tokens (the server's max_model_len) leaves at most 99 tokens for the answer"
    )
    with pytest.raises(TooLongError) as alone:  # no room at all: the prompt alone does not fit
        fitted(WORDY, 200, None, need=NEED)
    assert str(alone.value).startswith("the prompt alone does not fit the context: at least 201 tokens")


def test_an_answer_cut_off_with_a_budget_the_context_cut_is_asked_again_or_too_long() -> None:
    reply = Reply(None, "x" * 10, "length", 700, 250, 10, 1.0)
    sent = ChatRequest(REQUEST.messages, max_tokens=250)
    exact = PromptCount(700, exact=True)
    parts = PromptParts(LongestField("description", 9_000))
    assert not cut_by_the_estimate(reply, sent, 250, 1000, exact, parts)  # the job's budget: the answer's
    assert not cut_by_the_estimate(reply, sent, 500, None, exact, parts)  # no context: nothing cut it
    assert cut_by_the_estimate(reply, sent, 500, 1000, exact, parts)  # 300 left, 250 sent: ask again
    with pytest.raises(TooLongError) as caught:  # 250 left and had: an answer does not fit beside it
        cut_by_the_estimate(reply, sent, 500, 950, exact, parts)
    assert caught.value.failure_class is FailureClass.TOO_LONG
    assert caught.value.answer_cut_at == 250  # kept, so that a later run does not send it for nothing
    assert str(caught.value).startswith(
        "the prompt leaves too little of the context for an answer: 700 tokens of a context of 950 tokens "
        "(the server's max_model_len) leaves 250 tokens for the answer, and the answer was cut off there "
        "(250 completion tokens, 10 of them reasoning, finish_reason=length), short of the job's "
        "max_tokens 500"
    )


def test_an_answer_cut_off_below_the_jobs_budget_says_how() -> None:
    reply = Reply(None, "x" * 10, "length", 3050, 1046, 1000, 1.0)
    assert cut_off_below_the_job(reply, 4096) == (
        "and the answer was cut off there (1046 completion tokens, 1000 of them reasoning, "
        "finish_reason=length), short of the job's max_tokens 4,096"
    )


WORDY = ChatRequest(({"role": "system", "content": "word " * 200}, USER), max_tokens=500)


def test_a_count_kept_from_an_earlier_run_refuses_unsent_and_says_so() -> None:
    """The server counted the prompt in an earlier run (its too_long failure kept the count): the same
    prompt from the same text has as many tokens, so it is judged as if counted now, and the message
    says where the count comes from."""
    earlier = CountedPrompt(REQUEST.messages, 4108, earlier=True)
    assert prompt_count(REQUEST.messages, earlier) == PromptCount(4108, exact=True, earlier=True)
    assert prompt_floor(REQUEST.messages, earlier) == PromptCount(4108, exact=True, earlier=True)
    with pytest.raises(TooLongError) as caught:
        fitted(REQUEST, 4096, earlier, calibration=Calibration(), need=NEED)
    assert str(caught.value).startswith(
        "the prompt alone does not fit the context: 4108 tokens (the server's count in an earlier run) "
        "against a context of 4096 tokens"
    )
    assert caught.value.exact
    assert fitted(REQUEST, 8192, earlier, calibration=Calibration(), need=NEED).max_tokens == 500
    added: tuple[ChatMessage, ...] = ({"role": "assistant", "content": "a"}, USER)  # a re-ask: estimated
    assert not prompt_count((*REQUEST.messages, *added), earlier).earlier


@pytest.mark.parametrize(
    ("request_", "context", "counted", "tokens", "said"),
    [
        (REQUEST, 90, 90, 90, "90 tokens"),  # the server's count fills the context
        (REQUEST, 10, 90, 90, "90 tokens"),
        (WORDY, 201, None, 201, f"at least 201 tokens ({ONE_A_WORD})"),  # the floor alone fills it
    ],
)
def test_a_prompt_that_certainly_fills_the_context_is_too_long_with_the_numbers_and_the_field(
    request_: ChatRequest, context: int, counted: int | None, tokens: int, said: str
) -> None:
    longest = LongestField("description", 41_000)
    count = CountedPrompt(request_.messages, counted) if counted is not None else None
    with pytest.raises(TooLongError) as caught:
        fitted(request_, context, count, PromptParts(longest))
    error = caught.value
    assert error.failure_class is FailureClass.TOO_LONG
    assert (error.tokens, error.context, error.exact, error.field) == (
        tokens,
        context,
        counted is not None,
        "description",
    )
    assert str(error) == (
        f"the prompt alone does not fit the context: {said} against a context of {context} tokens "
        "(the server's max_model_len); most of it is field 'description' (41,000 characters): enable "
        "chunking (chunking: field: description), raise the context (the server's --max-model-len), or "
        "shorten the field"
    )


def test_a_fixed_part_that_leaves_no_room_says_chunking_cannot_help() -> None:
    """The system prompt and the examples are sent with every record (and every chunk): when they
    leave less than the smallest chunk, no split of the record fits. The prompt's count is the
    server's, so the fixed part's share of it is the server's rate applied to its text. `failures`
    looks for the words early in the message (it shows 200 characters)."""
    fixed: tuple[ChatMessage, ...] = (SYSTEM, {"role": "user", "content": ""})
    whole = ChatRequest((SYSTEM, USER), max_tokens=500)
    parts = PromptParts(LongestField("description", 31), fixed)
    error = too_long(PromptCount(254, exact=True), 200, parts, whole.messages)
    assert str(error) == (
        "the prompt alone does not fit the context: 254 tokens against a context of 200 tokens (the "
        f"server's max_model_len), and {FIXED_PART_FULL}: its fixed part (system prompt, examples, "
        f"template: what every record sends) is about 232 tokens (estimated) of it; {FIXED_PART_ADVICE}"
    )
    assert str(error).index(FIXED_PART_FULL) < 200
    assert FIXED_PART_ADVICE.startswith("shorten the system prompt or the examples, or use a larger context")
    room_left = too_long(PromptCount(254, exact=True), 400, parts, whole.messages)
    assert FIXED_PART_FULL not in str(room_left) and "enable chunking" in str(room_left)


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
