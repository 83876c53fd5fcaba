"""Pure functions: turn a reply into a validated object, or say precisely why it cannot be used; and
build the next request after a bad reply (always a new message list, never the caller's)."""

from __future__ import annotations

import re
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from pipeline.errors import (
    BadOutputError,
    EmptyOutputError,
    InvalidJSONError,
    SchemaInvalidError,
    TruncatedError,
    summarize_validation_error,
)
from pipeline.servers.client import ChatMessage, ChatRequest, Reply

# Models asked for JSON without constrained decoding often wrap it in a Markdown code fence.
_CODE_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)
MAX_ECHOED_OUTPUT_CHARS = 8000

REASK_INSTRUCTION = (
    "Your previous reply was rejected: {reason}\n"
    "Reply again with exactly one JSON object that matches the schema, and nothing else."
)


def parse_reply(reply: Reply, schema: type[BaseModel]) -> BaseModel:
    """The validated object, or a :class:`BadOutputError` subclass naming what is wrong."""
    content = (reply.content or "").strip()
    if not content:
        if reply.reasoning:
            raise TruncatedError(_truncation_reason(reply), raw_output=reply.content)
        raise EmptyOutputError(f"empty reply (finish_reason={reply.finish_reason})", raw_output=reply.content)
    try:
        return schema.model_validate(_load_json(content, reply))
    except ValidationError as exc:
        if reply.finish_reason == "length":
            raise TruncatedError(_truncation_reason(reply), raw_output=reply.content) from exc
        raise SchemaInvalidError(summarize_validation_error(exc), raw_output=reply.content) from exc


def _load_json(content: str, reply: Reply) -> dict[str, Any]:
    fenced = _CODE_FENCE.match(content)
    if fenced:
        content = fenced.group(1).strip()
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        if reply.finish_reason == "length":
            raise TruncatedError(_truncation_reason(reply), raw_output=reply.content) from exc
        raise InvalidJSONError(f"not valid JSON ({exc})", raw_output=reply.content) from exc
    if not isinstance(value, dict):
        raise SchemaInvalidError(
            f"expected a JSON object, got {type(value).__name__}", raw_output=reply.content
        )
    return value


def _truncation_reason(reply: Reply) -> str:
    """Why the answer is incomplete, in numbers, so the fix (budget or effort) is obvious."""
    parts = [f"finish_reason={reply.finish_reason}"]
    if reply.completion_tokens is not None:
        parts.append(f"{reply.completion_tokens} completion tokens")
    if reply.reasoning_tokens is not None:
        parts.append(f"{reply.reasoning_tokens} of them reasoning")
    elif reply.reasoning:
        parts.append(f"{len(reply.reasoning)} characters of reasoning")
    answer = "content null" if reply.content is None else f"{len(reply.content)} characters of content"
    parts.append(answer)
    return (
        "answer truncated: " + ", ".join(parts) + "; the reasoning shares max_tokens with the answer: "
        "raise max_tokens or lower reasoning_effort"
    )


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


def grown_budget(max_tokens: int, growth: float, ceiling: int) -> int:
    """``max_tokens`` grown once (by at least one token), never above ``ceiling`` (nor below itself)."""
    grown = min(ceiling, max(max_tokens + 1, int(max_tokens * growth)))
    return max(grown, max_tokens)


def larger_budget_request(current: ChatRequest, growth: float, ceiling: int) -> ChatRequest:
    """The same messages with a larger ``max_tokens`` (never above ``ceiling``)."""
    return ChatRequest(
        messages=current.messages, max_tokens=grown_budget(current.max_tokens, growth, ceiling)
    )
