from __future__ import annotations

import copy

import orjson
import pytest

from pipeline.errors import (
    EmptyOutputError,
    FailureClass,
    InvalidJSONError,
    RepetitionLoopError,
    SchemaInvalidError,
    TruncatedError,
)
from pipeline.extraction.parse import (
    LOOP_ECHO_HEAD_CHARS,
    LOOP_SAMPLING,
    MAX_ECHOED_OUTPUT_CHARS,
    answer_in_reasoning,
    from_reasoning,
    larger_budget_request,
    loop_reask_request,
    parse_reply,
    reask_request,
)
from pipeline.servers.client import ChatRequest
from pipeline.servers.replies import Reply
from tests.support.fakes import GOOD_ITEM
from tests.support.schemas import Item

GOOD = orjson.dumps(GOOD_ITEM).decode()


def reply(
    content: str | None,
    finish_reason: str = "stop",
    reasoning: str | None = None,
    completion_tokens: int | None = 50,
    reasoning_tokens: int | None = None,
) -> Reply:
    return Reply(content, reasoning, finish_reason, 100, completion_tokens, reasoning_tokens, 0.1)


def test_ok() -> None:
    item = parse_reply(reply(GOOD), Item)
    assert isinstance(item, Item)
    assert item.skills == ["SQL", "Python"]


def test_ok_inside_a_markdown_fence() -> None:
    item = parse_reply(reply(f"```json\n{GOOD}\n```"), Item)
    assert isinstance(item, Item) and item.title == "Data Engineer"


def test_complete_json_with_length_finish_is_accepted() -> None:
    assert isinstance(parse_reply(reply(GOOD, finish_reason="length"), Item), Item)


def test_invalid_json() -> None:
    with pytest.raises(InvalidJSONError, match="not valid JSON") as caught:
        parse_reply(reply('{"title": "x", skills'), Item)
    assert caught.value.failure_class is FailureClass.INVALID_JSON
    assert caught.value.raw_output == '{"title": "x", skills'


def test_schema_invalid_names_fields_without_quoting_input() -> None:
    bad = orjson.dumps({"title": "SECRET-TEXT", "skills": "not a list", "years": -1}).decode()
    with pytest.raises(SchemaInvalidError) as caught:
        parse_reply(reply(bad), Item)
    message = str(caught.value)
    assert "skills: Input should be a valid list" in message
    assert "years: Input should be greater than or equal to 0" in message
    assert "SECRET-TEXT" not in message
    assert caught.value.failure_class is FailureClass.SCHEMA_INVALID


def test_schema_invalid_from_a_model_validator() -> None:
    with pytest.raises(SchemaInvalidError, match="low is larger than high"):
        parse_reply(reply(orjson.dumps({**GOOD_ITEM, "low": 5, "high": 1}).decode()), Item)


def test_json_that_is_not_an_object() -> None:
    with pytest.raises(SchemaInvalidError, match="expected a JSON object, got list"):
        parse_reply(reply("[1, 2]"), Item)


def test_truncated_by_length() -> None:
    with pytest.raises(TruncatedError, match="finish_reason=length") as caught:
        parse_reply(
            reply(GOOD[:20], finish_reason="length", completion_tokens=256, reasoning_tokens=200), Item
        )
    message = str(caught.value)
    assert "256 completion tokens, 200 of them reasoning" in message
    assert "raise max_tokens or lower reasoning_effort" in message
    assert caught.value.failure_class is FailureClass.TRUNCATED


def test_truncated_when_content_is_null_but_reasoning_has_text() -> None:
    with pytest.raises(TruncatedError, match="content null") as caught:
        parse_reply(reply(None, finish_reason="length", reasoning="I think" * 50), Item)
    assert "350 characters of reasoning" in str(caught.value)


def test_null_content_with_reasoning_is_truncated_even_with_stop() -> None:
    with pytest.raises(TruncatedError):
        parse_reply(reply(None, finish_reason="stop", reasoning="thinking"), Item)


@pytest.mark.parametrize("content", [None, "", " \n"])
@pytest.mark.parametrize("reasoning", [GOOD, f"  {GOOD}\n", f"```json\n{GOOD}\n```"])
def test_an_answer_in_the_reasoning_with_content_empty_and_stop_is_taken(
    content: str | None, reasoning: str
) -> None:
    """gpt-oss under structured output (vLLM issue 23694): the JSON in reasoning, content null."""
    answered = reply(content, finish_reason="stop", reasoning=reasoning)
    item = parse_reply(answered, Item)
    assert item == Item.model_validate(GOOD_ITEM) == answer_in_reasoning(answered, Item)
    assert from_reasoning(answered) and not from_reasoning(reply(GOOD, reasoning="thinking"))


@pytest.mark.parametrize(
    ("finish_reason", "reasoning"),
    [
        ("stop", "The posting asks for SQL. " * 20),  # thinking, as gpt-oss thinks: prose
        ("stop", '{"title": "Data Engineer"}'),  # JSON the schema refuses
        ("stop", GOOD[:-5]),  # not whole JSON
        ("length", GOOD),  # cut at the budget: not an answer it finished
    ],
)
def test_reasoning_that_is_not_a_whole_valid_answer_stays_a_truncated_reply(
    finish_reason: str, reasoning: str
) -> None:
    answered = reply(None, finish_reason=finish_reason, reasoning=reasoning)
    assert answer_in_reasoning(answered, Item) is None
    with pytest.raises(TruncatedError):
        parse_reply(answered, Item)


def test_content_wins_over_json_in_the_reasoning() -> None:
    other = orjson.dumps({**GOOD_ITEM, "title": "Thinking about it"}).decode()
    item = parse_reply(reply(GOOD, reasoning=other), Item)
    assert isinstance(item, Item) and item.title == "Data Engineer"
    assert answer_in_reasoning(reply(GOOD, reasoning=other), Item) is None


def test_truncated_schema_invalid_json_with_length_is_truncation() -> None:
    with pytest.raises(TruncatedError):
        parse_reply(reply('{"title": "x"}', finish_reason="length"), Item)


@pytest.mark.parametrize("content", [None, "", "   \n"])
def test_empty(content: str | None) -> None:
    with pytest.raises(EmptyOutputError, match="empty reply") as caught:
        parse_reply(reply(content), Item)
    assert caught.value.failure_class is FailureClass.EMPTY


FIRST = ChatRequest(
    messages=({"role": "system", "content": "Extract."}, {"role": "user", "content": "A posting."}),
    max_tokens=512,
)


def test_reask_appends_the_rejected_answer_and_the_reason() -> None:
    original = copy.deepcopy(FIRST)
    error = SchemaInvalidError("skills: Input should be a valid list", raw_output='{"title": "x"}')
    again = reask_request(FIRST, error)
    assert again.messages[:2] == FIRST.messages
    assert again.messages[2] == {"role": "assistant", "content": '{"title": "x"}'}
    assert again.messages[3]["role"] == "user"
    assert "skills: Input should be a valid list" in again.messages[3]["content"]
    assert "exactly one JSON object" in again.messages[3]["content"]
    assert again.max_tokens == 512
    assert original == FIRST  # the caller's request and messages are untouched
    assert again.messages is not FIRST.messages


def test_reask_never_grows_beyond_one_exchange() -> None:
    first_error = InvalidJSONError("not valid JSON", raw_output="{")
    second_error = InvalidJSONError("not valid JSON again", raw_output="{{")
    again = reask_request(FIRST, first_error)
    twice = reask_request(FIRST, second_error)
    assert len(again.messages) == len(twice.messages) == 4
    assert twice.messages[2]["content"] == "{{"


def test_reask_echo_is_bounded() -> None:
    error = InvalidJSONError("not valid JSON", raw_output="x" * (MAX_ECHOED_OUTPUT_CHARS * 2))
    assert len(reask_request(FIRST, error).messages[2]["content"]) == MAX_ECHOED_OUTPUT_CHARS


def test_empty_output_retries_the_same_request() -> None:
    assert reask_request(FIRST, EmptyOutputError("empty", raw_output=None)) is FIRST


def test_larger_budget_grows_up_to_the_ceiling() -> None:
    grown = larger_budget_request(FIRST, 2.0, 2000)
    assert grown.max_tokens == 1024
    assert grown.messages == FIRST.messages
    assert larger_budget_request(grown, 2.0, 2000).max_tokens == 2000
    assert larger_budget_request(FIRST, 2.0, 100).max_tokens == 512
    assert FIRST.max_tokens == 512


LOOP_HEAD = '{"title":"x","skills":['
LOOPING = LOOP_HEAD + '"Python scripting",' * 30


def test_an_answer_cut_off_in_a_loop_is_a_repetition_loop() -> None:
    with pytest.raises(RepetitionLoopError) as caught:
        parse_reply(reply(LOOPING, finish_reason="length", completion_tokens=4096), Item)
    error = caught.value
    assert error.failure_class is FailureClass.TRUNCATED
    assert str(error).startswith(
        "repetition loop: the same 19-character stretch repeated 30 times in 'skills' at the end of the "
        "cut-off answer (finish_reason=length, 4096 completion tokens"
    )
    assert (error.unit, error.loop_start) == ('"Python scripting",', len(LOOP_HEAD))
    assert error.raw_output == LOOPING


def test_reasoning_cut_off_in_a_loop_is_a_repetition_loop() -> None:
    with pytest.raises(RepetitionLoopError) as caught:
        parse_reply(reply(None, finish_reason="length", reasoning="We need to check. " * 20), Item)
    assert caught.value.loop_start is None  # nothing of the answer to show


def test_the_retry_after_a_loop_shows_the_cut_off_and_asks_for_less_with_penalties() -> None:
    original = copy.deepcopy(FIRST)
    error = RepetitionLoopError(
        "loop", raw_output=LOOPING, unit='"Python scripting",', loop_start=len(LOOP_HEAD)
    )
    again = loop_reask_request(FIRST, error, 300)
    assert again.messages[:2] == FIRST.messages and again.messages is not FIRST.messages
    assert again.messages[2] == {
        "role": "assistant",
        "content": '{"title":"x","skills":["Python scripting","Python scripting",…',
    }
    assert again.messages[3]["role"] == "user"
    assert "kept repeating '\"Python scripting\",'" in again.messages[3]["content"]
    assert again.max_tokens == 300
    assert again.sampling == LOOP_SAMPLING and again.sampling is not LOOP_SAMPLING
    assert original == FIRST and FIRST.sampling == {}


def test_the_echo_of_a_loop_is_bounded() -> None:
    long_head = '{"title":"' + "y" * 5000 + '","skills":['
    raw = long_head + "ab" * 500
    error = RepetitionLoopError("loop", raw_output=raw, unit="ab", loop_start=len(long_head))
    shown = loop_reask_request(FIRST, error, 300).messages[2]["content"]
    assert len(shown) < LOOP_ECHO_HEAD_CHARS + 20 and shown.endswith(" … abab…")


def test_a_loop_in_the_reasoning_retries_the_first_messages_with_penalties() -> None:
    error = RepetitionLoopError("loop", raw_output=None, unit="We need to check. ")
    again = loop_reask_request(FIRST, error, 300)
    assert again.messages == FIRST.messages and again.sampling == LOOP_SAMPLING
