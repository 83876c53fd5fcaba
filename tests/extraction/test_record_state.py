"""A record's state across its attempts, and what its too_long failure keeps for a later run."""

from __future__ import annotations

from pipeline.errors import TooLongError
from pipeline.extraction.budget import CountedPrompt, PromptParts
from pipeline.extraction.record_state import RecordState
from pipeline.servers.client import ChatMessage, ChatRequest
from pipeline.source.reader import SourceRecord

FIRST = ChatRequest(({"role": "system", "content": "Extract."}, {"role": "user", "content": "A post."}), 512)
REASK: tuple[ChatMessage, ...] = (
    *FIRST.messages,
    {"role": "assistant", "content": "{"},
    {"role": "user", "content": "Again."},
)


def too_long(answer_cut_at: int | None = None) -> TooLongError:
    return TooLongError("x", tokens=3788, context=4096, exact=True, answer_cut_at=answer_cut_at)


def test_a_record_starts_from_what_its_earlier_too_long_failure_knew() -> None:
    record = SourceRecord(1, {}, 9, counted_prompt_tokens=3788, answer_cut_at=308)
    state = RecordState.of(record, FIRST, PromptParts(None))
    assert state.counted == CountedPrompt(FIRST.messages, 3788, earlier=True)
    assert (state.answer_cut_at, state.first, state.request) == (308, FIRST, FIRST)
    plain = RecordState.of(SourceRecord(2, {}, 9), FIRST, PromptParts(None))
    assert (plain.counted, plain.answer_cut_at) == (None, None)


def test_a_too_long_failure_keeps_the_count_of_the_first_request_and_the_latest_cut_answer() -> None:
    state = RecordState.of(SourceRecord(1, {}, 9), FIRST, PromptParts(None))
    assert state.fit_kept(too_long()) == (None, None)  # nothing counted: a floor refused it
    state.counted = CountedPrompt(FIRST.messages, 3788)
    assert state.fit_kept(too_long(308)) == (3788, 308)
    state.counted = CountedPrompt(REASK, 3800)  # a re-ask's count is not the record's prompt
    assert state.fit_kept(too_long()) == (None, None)
    earlier = RecordState.of(
        SourceRecord(1, {}, 9, counted_prompt_tokens=3788, answer_cut_at=308), FIRST, PromptParts(None)
    )
    assert earlier.fit_kept(too_long()) == (3788, 308)  # refused unsent: what it knew stays known
    assert earlier.fit_kept(too_long(400)) == (3788, 400)  # a larger context, cut off again further
