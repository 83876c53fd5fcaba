"""A small HTTP/1.1 server on asyncio protocols, for the simulator.

Written on ``asyncio.Protocol`` rather than a framework because it must answer thousands of requests
a second on one core next to the client under test. It supports what OpenAI clients use: keep-alive,
``Content-Length`` bodies, one request at a time per connection. Like uvicorn (vLLM's server) it
closes connections idle for ``KEEPALIVE_S``, and a client that disconnects cancels its request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

KEEPALIVE_S = 5.0
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    abort: bool = field(default=False)  # drop the connection instead of answering (a "reset")
    stream: AsyncIterator[bytes] | None = None  # sent with chunked transfer encoding (server-sent events)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def encode_head(response: HttpResponse) -> bytes:
    reason = HTTPStatus(response.status).phrase
    length = (
        "transfer-encoding: chunked"
        if response.stream is not None
        else f"content-length: {len(response.body)}"
    )
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"content-type: {response.content_type}",
        length,
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def encode_response(response: HttpResponse) -> bytes:
    return encode_head(response) + response.body


class _Connection(asyncio.Protocol):
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._task is not None:
            self._task.cancel()  # the client went away: abort its request, as vLLM does
        if self._idle is not None:
            self._idle.cancel()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is None:
            self._next_request()

    def _arm_idle_timer(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(KEEPALIVE_S, self._close_idle)

    def _close_idle(self) -> None:
        if self._task is None and self._transport is not None:
            self._transport.close()

    def _next_request(self) -> None:
        request = self._parse()
        if request is None:
            return
        if self._idle is not None:
            self._idle.cancel()
        self._task = asyncio.get_running_loop().create_task(self._serve(request))

    def _parse(self) -> HttpRequest | None:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEADER_BYTES and self._transport is not None:
                self._transport.close()
            return None
        head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        method, path, _ = [*head[0].split(" ", 2), "", ""][:3]
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length > MAX_BODY_BYTES or len(self._buffer) < end + 4 + length:
            return None
        body = bytes(self._buffer[end + 4 : end + 4 + length])
        del self._buffer[: end + 4 + length]
        return HttpRequest(method.upper(), path, headers, body)

    async def _serve(self, request: HttpRequest) -> None:
        try:
            response = await self._handler(request)
            if response.stream is not None and self._transport is not None and not response.abort:
                await self._send_stream(self._transport, response)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # a bug in a handler must not take the server down
            response = HttpResponse(500, f'{{"error": {{"message": "{type(exc).__name__}"}}}}'.encode())
        transport = self._transport
        self._task = None
        if transport is None:
            return
        if response.abort:
            transport.abort()
            return
        if response.stream is None:
            transport.write(encode_response(response))
        if request.headers.get("connection", "").lower() == "close":
            transport.close()
            return
        self._arm_idle_timer()
        if self._buffer:
            self._next_request()

    @staticmethod
    async def _send_stream(transport: asyncio.Transport, response: HttpResponse) -> None:
        assert response.stream is not None
        transport.write(encode_head(response))
        async for chunk in response.stream:
            if chunk:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        transport.write(b"0\r\n\r\n")


async def serve(handler: Handler, host: str, port: int) -> asyncio.Server:
    """Start listening; the caller owns the returned server (``close()`` / ``serve_forever()``)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _Connection(handler), host, port, backlog=4096, reuse_address=True
    )
