"""The simulator served from a thread of the test's own process, on a real socket on 127.0.0.1.

A state machine changes the server between steps (its faults, its context, whether it counts tokens,
whether it is there at all) and reads what it received, hundreds of times a test: a `pipeline sim`
process per change would cost a second each, and its requests could only be read through /metrics.
Here the test holds the :class:`SimServer` itself. Every client still reaches it over HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.sim import SimConfig, SimServer
from pipeline.sim.http import HttpRequest, HttpResponse, serve


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """One chat request as the server received it, and the status it answered."""

    max_tokens: int | None
    user: str  # the last user message: the record, as the prompt put it
    status: int


class ThreadedSim:
    """A :class:`SimServer` on its own event loop in a daemon thread; :meth:`close` ends both."""

    def __init__(self, config: SimConfig) -> None:
        self.server = SimServer(config)
        self.seen: list[SeenRequest] = []
        self._loop = asyncio.new_event_loop()
        self._listener: asyncio.Server | None = None
        self.port = 0
        threading.Thread(target=self._loop.run_forever, daemon=True, name="threaded-sim").start()
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def alive(self) -> bool:
        return self._listener is not None

    def reconfigure(self, **changes: Any) -> None:
        """Change its settings for the requests that come from now on (faults, context, tokenize)."""
        self.server.config = dataclasses.replace(self.server.config, **changes)

    def start(self) -> None:
        """Listen again on the same port (the first time, on a free one)."""
        if self._listener is None:
            self._listener = self._call(serve(self._handle, "127.0.0.1", self.port))
            self.port = self._listener.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop listening and drop every open connection: an endpoint that is gone."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            self._call(_closed(listener))

    def close(self) -> None:
        """Stop listening, end what the engine still runs, and end the thread."""
        self.stop()
        self._call(_cancel_others())
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _call(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=30)

    async def _handle(self, request: HttpRequest) -> HttpResponse:
        response = await self.server.handle(request)
        if request.method == "POST" and request.path.rstrip("/").endswith("/chat/completions"):
            self.seen.append(_seen(request, response))
        return response


async def _closed(listener: asyncio.Server) -> None:
    # Between a state machine's steps no client holds a connection (each run closes its own); where
    # asyncio can (3.13), any left is dropped too, as a server that goes away drops them.
    close_clients = getattr(listener, "close_clients", None)
    if close_clients is not None:
        close_clients()
    await listener.wait_closed()


async def _cancel_others() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _seen(request: HttpRequest, response: HttpResponse) -> SeenRequest:
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        return SeenRequest(None, "", response.status)
    users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
    text = users[-1] if users and isinstance(users[-1], str) else ""
    return SeenRequest(body.get("max_tokens") or body.get("max_completion_tokens"), text, response.status)
