"""One factory for every HTTP client: its settings, and the route tests give it."""

from __future__ import annotations

import anyio
import httpx2
import pytest

from pipeline.servers.client import ChatRequest, ClientSettings, LLMClient
from pipeline.servers.http import (
    CONNECT_TIMEOUT_S,
    KEEPALIVE_EXPIRY_S,
    POOL_HEADROOM,
    http_client,
    text_if_ok,
)
from tests.support.fakes import good_completion, respond
from tests.support.http import aiohttp_transport, routed_to

pytestmark = pytest.mark.anyio


def test_a_small_client_times_out_as_a_whole_and_drops_idle_connections_before_vllm() -> None:
    client = http_client(timeout_s=5.0)
    assert client.timeout == httpx2.Timeout(5.0)
    transport = client._transport
    assert isinstance(transport, httpx2.AsyncHTTPTransport)  # httpx's own stack
    pool = transport._pool
    assert pool._keepalive_expiry == KEEPALIVE_EXPIRY_S < 5.0  # vLLM (uvicorn) closes them at 5 s
    assert (pool._max_connections, pool._max_keepalive_connections) == (100, 20)  # httpx's own
    assert not client.follow_redirects and client.trust_env


def test_the_pool_holds_the_concurrency_with_long_reads_over_aiohttp() -> None:
    client = http_client(timeout_s=600.0, concurrency=300)
    assert client.timeout == httpx2.Timeout(
        connect=CONNECT_TIMEOUT_S, read=600.0, write=CONNECT_TIMEOUT_S, pool=600.0
    )
    transport = aiohttp_transport(client)
    assert transport.limits.max_connections == 300 + POOL_HEADROOM
    assert transport.limits.max_keepalive_connections == 300
    assert transport.limits.keepalive_expiry == KEEPALIVE_EXPIRY_S


async def test_text_if_ok_is_the_body_of_a_200_and_none_otherwise() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/down":
            raise httpx2.ConnectError("refused", request=request)
        return respond(
            "up" if request.url.path == "/health" else "no", 200 if request.url.path == "/health" else 404
        )

    with routed_to(answer) as seen:
        async with http_client(timeout_s=5.0) as client:
            assert await text_if_ok(client, "http://server/health") == "up"
            assert await text_if_ok(client, "http://server/metrics") is None
            assert await text_if_ok(client, "http://server/down") is None
    assert [request.url.path for request in seen] == ["/health", "/metrics", "/down"]


async def test_the_llm_clients_pool_takes_the_route_too() -> None:
    settings = ClientSettings(base_url="http://nowhere.invalid/v1", model="test-model")
    request = ChatRequest(messages=({"role": "user", "content": "A posting."},), max_tokens=30)
    with routed_to(lambda _: respond(good_completion())) as seen:
        async with LLMClient(settings) as client:
            reply = await client.complete(request)
    assert reply.finish_reason == "stop"
    assert [str(request.url) for request in seen] == ["http://nowhere.invalid/v1/chat/completions"]


async def test_without_a_route_clients_reach_the_network() -> None:
    """The route is the test's alone: outside the block the clients connect for real (and here fail)."""
    with routed_to(lambda _: respond("up")):
        pass
    async with http_client(timeout_s=5.0) as client:
        assert await text_if_ok(client, "http://127.0.0.1:9/health") is None  # port 9: refused
    with anyio.fail_after(5):
        async with http_client(timeout_s=5.0, concurrency=1) as pool:
            with pytest.raises(httpx2.TransportError):
                await pool.get("http://127.0.0.1:9/health")
