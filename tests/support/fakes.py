"""A scripted fake network for unit tests: httpx2.MockTransport with recorded request bodies."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

GOOD_ITEM = {"title": "Data Engineer", "skills": ["SQL", "Python"], "years": 3, "low": 1, "high": 2}


def completion(
    content: str | None,
    *,
    finish_reason: str = "stop",
    reasoning: str | None = None,
    reasoning_field: str = "reasoning",
    completion_tokens: int = 40,
    reasoning_tokens: int | None = 10,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message[reasoning_field] = reasoning
    details = {"reasoning_tokens": reasoning_tokens} if reasoning_tokens is not None else None
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": completion_tokens,
            "total_tokens": 100 + completion_tokens,
            "completion_tokens_details": details,
        },
    }


def good_completion(**overrides: Any) -> dict[str, Any]:
    return completion(orjson.dumps({**GOOD_ITEM, **overrides}).decode())


def respond(
    body: dict[str, Any] | str, status: int = 200, headers: dict[str, str] | None = None
) -> httpx2.Response:
    content = body.encode() if isinstance(body, str) else orjson.dumps(body)
    return httpx2.Response(
        status, content=content, headers={"content-type": "application/json", **(headers or {})}
    )


def error(status: int, message: str = "boom", headers: dict[str, str] | None = None) -> httpx2.Response:
    return respond({"error": {"message": message, "type": "Error", "code": status}}, status, headers)


Step = httpx2.Response | Exception | Callable[[httpx2.Request], httpx2.Response]


@dataclass
class ScriptedServer:
    """Answers chat completions from a script, in order (the last step repeats), and records bodies."""

    steps: Sequence[Step]
    models: Iterable[str] = ("test-model",)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"object": "list", "data": [{"id": name} for name in self.models]})
        self.bodies.append(orjson.loads(request.content))
        step = self.steps[min(len(self.bodies) - 1, len(self.steps) - 1)]
        if isinstance(step, Exception):
            raise step
        if callable(step) and not isinstance(step, httpx2.Response):
            return step(request)
        return step

    @property
    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self)
