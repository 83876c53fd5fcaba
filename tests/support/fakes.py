"""Fake servers for unit tests, reached through the production client.

A fake is a function from an ``httpx2.Request`` to an answer: a response, or a fault on the wire
(:data:`DROP`, :data:`HANG`). :func:`serving` puts it on a real socket on 127.0.0.1 (aiohttp's
server), so every request goes through the SDK over aiohttp exactly as against vLLM: the same
connection pool, the same errors. A refused connection is a real one: a stopped fake, or
:func:`dead_url`."""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import httpx2
import orjson
from aiohttp import web

GOOD_ITEM = {"title": "Data Engineer", "skills": ["SQL", "Python"], "years": 3, "low": 1, "high": 2}


def completion(
    content: str | None,
    *,
    finish_reason: str = "stop",
    reasoning: str | None = None,
    reasoning_field: str = "reasoning",
    completion_tokens: int = 40,
    reasoning_tokens: int | None = 10,
    prompt_tokens: int = 100,
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
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
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


class WireFault(Enum):
    DROP = "drop"  # the server drops the connection mid-request: a reset, a crash
    HANG = "hang"  # the server never answers: only the client's timeout ends the request


DROP = WireFault.DROP
HANG = WireFault.HANG
Answer = httpx2.Response | WireFault
Handler = Callable[[httpx2.Request], Answer | Awaitable[Answer]]
Step = Answer | Callable[[httpx2.Request], Answer]


@dataclass
class ScriptedServer:
    """Answers chat completions from a script, in order (the last step repeats), and records bodies.
    ``max_model_len``: the context length ``/v1/models`` lists for each model, as vLLM does.
    ``count_tokens``: how its ``POST /tokenize`` counts a message list, as vLLM's does (its bodies are
    kept in ``tokenize_bodies``); without it, that route is a 404, as on servers that have none."""

    steps: Sequence[Step]
    models: Iterable[str] = ("test-model",)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    max_model_len: int | None = None
    count_tokens: Callable[[list[dict[str, Any]]], int] | None = None
    tokenize_bodies: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> Answer:
        if request.url.path.endswith("/models"):
            listed = {} if self.max_model_len is None else {"max_model_len": self.max_model_len}
            return respond({"object": "list", "data": [{"id": name, **listed} for name in self.models]})
        if request.url.path == "/tokenize":
            if self.count_tokens is None:
                return error(404, "Not Found")
            self.tokenize_bodies.append(orjson.loads(request.content))
            count = self.count_tokens(self.tokenize_bodies[-1]["messages"])
            return respond({"count": count, "max_model_len": self.max_model_len, "tokens": [0] * count})
        self.bodies.append(orjson.loads(request.content))
        step = self.steps[min(len(self.bodies) - 1, len(self.steps) - 1)]
        if isinstance(step, httpx2.Response | WireFault):
            return step
        return step(request)


class LoopbackServer:
    """``handler`` listening on 127.0.0.1 (aiohttp's server). :meth:`stop` closes the listener and every
    open connection, so the next connection is refused; :meth:`start` listens again on the same port:
    a server restart."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._runner: web.ServerRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        # A short shutdown: a request left hanging (HANG) must not hold up a test's end.
        runner = web.ServerRunner(web.Server(self._answer), shutdown_timeout=0.02)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._runner, self.port = runner, runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        outgoing = httpx2.Request(
            request.method, str(request.url), headers=dict(request.headers), content=await request.read()
        )
        answer = self._handler(outgoing)
        if inspect.isawaitable(answer):
            answer = await answer
        if answer is DROP and request.transport is not None:
            request.transport.abort()
        if answer is HANG:
            await asyncio.Event().wait()  # until the client gives up, or the server stops
        if not isinstance(answer, httpx2.Response):
            return web.Response(status=503)  # never sent: the connection is gone
        headers = {name: value for name, value in answer.headers.items() if name not in _FRAMING}
        return web.Response(status=answer.status_code, body=answer.content, headers=headers)


_FRAMING = frozenset({"content-length", "transfer-encoding", "content-encoding", "connection"})


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[LoopbackServer]:
    """``handler`` on a real socket on 127.0.0.1 for the block."""
    server = LoopbackServer(handler)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def dead_url() -> str:
    """A base URL where nothing listens: connecting is refused, as to a server that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
