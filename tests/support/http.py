"""Every HTTP client the pipeline makes, routed to a transport of the test's (no server needed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx2
import pytest
from openai._vendor.httpx_aiohttp import AiohttpTransport

from pipeline.servers import http

Handler = Callable[[httpx2.Request], httpx2.Response]


@contextmanager
def routed_to(handler: Handler) -> Iterator[list[httpx2.Request]]:
    """Within the block, every client from :func:`pipeline.servers.http.http_client` (the LLM
    client's pool too) is answered by ``handler``; yields the requests it saw, in order."""
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return handler(request)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http, "routed_transport", httpx2.MockTransport(answer))
        yield seen


def aiohttp_transport(client: httpx2.AsyncClient) -> AiohttpTransport:
    """The transport of a client made with a concurrency (the LLM client's pool): the SDK's aiohttp one."""
    transport = client._transport
    assert isinstance(transport, AiohttpTransport), type(transport)
    return transport
