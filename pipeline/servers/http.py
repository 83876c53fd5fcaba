"""Where every HTTP client of the pipeline comes from, with its settings decided once.

The LLM client's pool (:func:`pipeline.servers.client.build_http_client`), the router's ``/metrics``
scrapes, the capacity reading, the local server's readiness checks and the bench observer all call
:func:`http_client`. Whatever the use, a connection idle for :data:`KEEPALIVE_EXPIRY_S` is dropped
before vLLM (uvicorn) closes it at 5 s: reusing one it is closing gives a reset. The environment's
proxy settings apply, as httpx's do by default.

Tests route every client made here to a transport of theirs (``tests/support/http.py``:
``routed_to``), reaching a client the code under test builds deep inside without a server.
"""

from __future__ import annotations

import ssl
from functools import cache

import httpx2
import openai

# vLLM (uvicorn) closes idle keep-alive connections after 5 s; expiring ours first avoids the race.
KEEPALIVE_EXPIRY_S = 4.0
CONNECT_TIMEOUT_S = 30.0
#: A ``/health`` or ``/metrics`` GET: a server answers it at once, even with 256 requests running.
SMALL_REQUEST_TIMEOUT_S = 5.0
# Connections a pool holds beyond its concurrency: the preflight and the metrics scrapes.
POOL_HEADROOM = 16
# httpx's own defaults, for clients that send a few small requests.
_SMALL_POOL_CONNECTIONS, _SMALL_POOL_KEPT = 100, 20

#: When set, every client made here sends its requests to this transport instead of the network;
#: only tests set it (``tests/support/http.py``). None in production.
routed_transport: httpx2.AsyncBaseTransport | None = None


def http_client(*, timeout_s: float, concurrency: int | None = None) -> httpx2.AsyncClient:
    """A client whose replies may take ``timeout_s`` (the whole request, for a small one).

    With ``concurrency`` it is the pool for that many long requests at once (the LLM client's): it
    never makes a request wait for a connection, connecting waits :data:`CONNECT_TIMEOUT_S`, and it
    goes through aiohttp under the SDK (openai's ``aiohttp`` extra), because httpcore2's pool scans
    every pooled connection on each request and each close, which at 256 connections cost over twice
    the client CPU per request (benchmarks/compare_clients.py). Each request gets aiohttp timeouts
    built from the read timeout with no total, so aiohttp's 5-minute session default never applies.
    Without it, a client for a few small requests on httpx's own stack, whose errors are all
    ``httpx2.HTTPError``."""
    if concurrency is None:
        limits = httpx2.Limits(
            max_connections=_SMALL_POOL_CONNECTIONS,
            max_keepalive_connections=_SMALL_POOL_KEPT,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        return httpx2.AsyncClient(
            timeout=timeout_s, limits=limits, transport=routed_transport, verify=_tls_context()
        )
    limits = httpx2.Limits(
        max_connections=concurrency + POOL_HEADROOM,
        max_keepalive_connections=concurrency,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    timeout = httpx2.Timeout(
        connect=CONNECT_TIMEOUT_S, read=timeout_s, write=CONNECT_TIMEOUT_S, pool=timeout_s
    )
    return openai.DefaultAioHttpClient(
        limits=limits, timeout=timeout, transport=routed_transport, verify=_tls_context()
    )


@cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default context, built once: each build reads the system's certificates again (0.1 s),
    and a run makes several clients, against an http:// server too."""
    return httpx2.create_ssl_context()


async def text_if_ok(client: httpx2.AsyncClient, url: str) -> str | None:
    """The body of ``GET url`` when it answers 200; None when the server cannot be reached, the
    connection fails, or it answers anything else."""
    try:
        response = await client.get(url)
    except httpx2.HTTPError:
        return None
    return response.text if response.status_code == 200 else None
