"""Reading what a server answers: a chat completion, the model list, a token count. Pure functions over
the body's bytes (:mod:`pipeline.servers.client` sends and receives them); a body that cannot be read
is a :class:`TransientError`, as a garbled answer on the wire would be."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from pipeline.errors import TransientError


@dataclass(frozen=True, slots=True)
class Reply:
    content: str | None
    reasoning: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    latency_s: float


def parse_completion_body(content: bytes, latency_s: float) -> Reply:
    """Read the fields we use from a chat-completion body; reasoning may be in either field name."""
    try:
        body = orjson.loads(content)
        choice = body["choices"][0]
        message = choice["message"]
        usage = body.get("usage") or {}
        details = usage.get("completion_tokens_details") or {}
        return Reply(
            content=message.get("content"),
            reasoning=message.get("reasoning") or message.get("reasoning_content"),
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            reasoning_tokens=details.get("reasoning_tokens"),
            latency_s=latency_s,
        )
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise TransientError("the server sent a malformed chat completion body") from exc


def tokenize_url(base_url: str) -> str:
    """vLLM serves ``/tokenize`` beside ``/v1``, not under it."""
    return base_url.rstrip("/").removesuffix("/v1") + "/tokenize"


def token_count(content: bytes) -> int | None:
    """vLLM's ``count`` from a ``/tokenize`` answer; ``None`` for a body without one (a server whose
    route of that name is something else)."""
    try:
        count = orjson.loads(content)["count"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return count if type(count) is int and count >= 0 else None


def served_models(content: bytes) -> dict[str, int | None] | None:
    """The models ``/v1/models`` lists, each with the context length it gives (vLLM: max_model_len)."""
    try:
        entries = orjson.loads(content)["data"]
        return {str(entry["id"]): _positive(entry.get("max_model_len")) for entry in entries}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


def _positive(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None
