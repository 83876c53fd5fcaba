"""Pure functions: turn a reply into a validated object, or say precisely why it cannot be used; and
build the next request after a bad reply (always a new message list, never the caller's)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from pipeline.errors import (
    BadOutputError,
    EmptyOutputError,
    InvalidJSONError,
    RepetitionLoopError,
    SchemaInvalidError,
    TruncatedError,
    summarize_validation_error,
)
from pipeline.extraction.repetition import find_loop
from pipeline.servers.client import ChatMessage, ChatRequest
from pipeline.servers.replies import Reply

# Models asked for JSON without constrained decoding often wrap it in a Markdown code fence.
_CODE_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)
MAX_ECHOED_OUTPUT_CHARS = 8000

REASK_INSTRUCTION = (
    "Your previous reply was rejected: {reason}\n"
    "Reply again with exactly one JSON object that matches the schema, and nothing else."
)
LOOP_INSTRUCTION = (
    "Your previous reply was cut off at the token limit because it kept repeating {unit}. Reply again "
    "with one complete, shorter JSON object that matches the schema: give each item once, never repeat "
    "an item or a phrase, leave out what is not in the posting, and close the JSON."
)
LOOP_ECHO_HEAD_CHARS = 1500  # of the cut-off answer before its loop, shown back to the model
#: Sampling for the retry after a loop, that request only: OpenAI's penalties, which vLLM takes too.
#: Counted per token of the answer, so a unit repeated again costs more each time.
LOOP_SAMPLING = {"frequency_penalty": 0.5, "presence_penalty": 0.5}


def parse_reply(reply: Reply, schema: type[BaseModel]) -> BaseModel:
    """The validated object, or a :class:`BadOutputError` subclass naming what is wrong. An answer
    that came in the reasoning field (:func:`answer_in_reasoning`) is taken: :func:`from_reasoning`
    says so of the reply."""
    content = (reply.content or "").strip()
    if not content:
        recovered = answer_in_reasoning(reply, schema)
        if recovered is not None:
            return recovered
        if reply.reasoning:
            raise truncated(reply)
        raise EmptyOutputError(f"empty reply (finish_reason={reply.finish_reason})", raw_output=reply.content)
    try:
        return schema.model_validate(_load_json(content, reply))
    except ValidationError as exc:
        if reply.finish_reason == "length":
            raise truncated(reply) from exc
        raise SchemaInvalidError(summarize_validation_error(exc), raw_output=reply.content) from exc


def answer_in_reasoning(reply: Reply, schema: type[BaseModel]) -> BaseModel | None:
    """The answer of a reply whose JSON came in the reasoning field, content empty, finish ``stop``:
    gpt-oss under structured output may do that (vLLM issue 23694), and the answer is whole and valid.
    None for anything else: reasoning that is thinking (prose), cut short, or JSON the schema refuses
    stays a truncated or empty reply, as before."""
    if reply.finish_reason != "stop" or (reply.content or "").strip() or not reply.reasoning:
        return None
    text = reply.reasoning.strip()
    fenced = _CODE_FENCE.match(text)
    text = fenced.group(1).strip() if fenced else text
    if not text.startswith("{"):  # thinking, not an answer: not worth a JSON parse
        return None
    try:
        return schema.model_validate(orjson.loads(text))
    except (orjson.JSONDecodeError, ValidationError):
        return None


def from_reasoning(reply: Reply) -> bool:
    """Whether a reply :func:`parse_reply` took an answer from had it in its reasoning: its content
    was empty, so the answer can only have come from there."""
    return not (reply.content or "").strip()


def _load_json(content: str, reply: Reply) -> dict[str, Any]:
    fenced = _CODE_FENCE.match(content)
    if fenced:
        content = fenced.group(1).strip()
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        if reply.finish_reason == "length":
            raise truncated(reply) from exc
        raise InvalidJSONError(f"not valid JSON ({exc})", raw_output=reply.content) from exc
    if not isinstance(value, dict):
        raise SchemaInvalidError(
            f"expected a JSON object, got {type(value).__name__}", raw_output=reply.content
        )
    return value


def truncated(reply: Reply) -> TruncatedError:
    """A cut-off answer: a :class:`RepetitionLoopError` when it ends in a loop (its content, or its
    reasoning when there is no content), else a :class:`TruncatedError` with the numbers."""
    in_content = bool(reply.content and reply.content.strip())
    loop = find_loop((reply.content if in_content else reply.reasoning) or "")
    if loop is None:
        return TruncatedError(_truncation_reason(reply), raw_output=reply.content)
    return RepetitionLoopError(
        f"repetition loop: {loop.describe()} at the end of the cut-off answer ({_numbers(reply)}); a "
        "larger budget only makes the loop longer",
        raw_output=reply.content,
        unit=loop.unit,
        loop_start=loop.start if in_content else None,
    )


def _truncation_reason(reply: Reply) -> str:
    """Why the answer is incomplete, in numbers, so the fix (budget or effort) is obvious."""
    return (
        f"answer truncated: {_numbers(reply)}; the reasoning shares max_tokens with the answer: "
        "raise max_tokens or lower reasoning_effort"
    )


def _numbers(reply: Reply) -> str:
    parts = [f"finish_reason={reply.finish_reason}"]
    if reply.completion_tokens is not None:
        parts.append(f"{reply.completion_tokens} completion tokens")
    if reply.reasoning_tokens is not None:
        parts.append(f"{reply.reasoning_tokens} of them reasoning")
    elif reply.reasoning:
        parts.append(f"{len(reply.reasoning)} characters of reasoning")
    answer = "content null" if reply.content is None else f"{len(reply.content)} characters of content"
    parts.append(answer)
    return ", ".join(parts)


def reask_request(first: ChatRequest, error: BadOutputError) -> ChatRequest:
    """The first request plus the rejected answer and what was wrong with it: a brand-new list.

    Re-asks always start from the record's first request, so a prompt grows by one exchange at most
    and keeps the shared system-prompt prefix.
    """
    if isinstance(error, EmptyOutputError) or not error.raw_output:
        return first
    rejected: ChatMessage = {"role": "assistant", "content": error.raw_output[:MAX_ECHOED_OUTPUT_CHARS]}
    instruction: ChatMessage = {"role": "user", "content": REASK_INSTRUCTION.format(reason=error)}
    return ChatRequest(messages=(*first.messages, rejected, instruction), max_tokens=first.max_tokens)


def loop_reask_request(first: ChatRequest, error: RepetitionLoopError, max_tokens: int) -> ChatRequest:
    """After an answer cut off in a loop: the first request plus the start of that answer and the
    loop's first two turns, an instruction to answer shorter without repeating, and penalties on
    repetition, for this request only (a new message list). A loop in the reasoning, with no answer
    to show, gets the first messages and the penalties."""
    messages = first.messages
    if error.raw_output and error.loop_start is not None:
        head = error.raw_output[: error.loop_start]
        if len(head) > LOOP_ECHO_HEAD_CHARS:
            head = head[:LOOP_ECHO_HEAD_CHARS] + " … "
        shown: ChatMessage = {"role": "assistant", "content": f"{head}{error.unit * 2}…"}
        unit = error.unit if len(error.unit) <= 80 else error.unit[:80] + "…"
        instruction: ChatMessage = {"role": "user", "content": LOOP_INSTRUCTION.format(unit=repr(unit))}
        messages = (*messages, shown, instruction)
    return ChatRequest(messages=messages, max_tokens=max_tokens, sampling=dict(LOOP_SAMPLING))


def grown_budget(max_tokens: int, growth: float, ceiling: int) -> int:
    """``max_tokens`` grown once (by at least one token), never above ``ceiling`` (nor below itself)."""
    grown = min(ceiling, max(max_tokens + 1, int(max_tokens * growth)))
    return max(grown, max_tokens)


def larger_budget_request(current: ChatRequest, growth: float, ceiling: int) -> ChatRequest:
    """The same request with a larger ``max_tokens`` (never above ``ceiling``)."""
    return dataclasses.replace(current, max_tokens=grown_budget(current.max_tokens, growth, ceiling))
