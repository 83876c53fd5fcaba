"""A round-robin HTTP proxy on 127.0.0.1 in front of several servers: what vLLM's router, its
production stack or a LiteLLM proxy does for a fleet, in a few lines, to show that a run sees one
endpoint. In front of one server, it can answer some paths late (a busy server's ``/tokenize``)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import aiohttp
from aiohttp import web

_FORWARDED_HEADERS = ("content-type", "authorization")


def _application(upstreams: list[str], late: Mapping[str, float]) -> web.Application:
    targets = itertools.cycle([url.removesuffix("/v1") for url in upstreams])
    session: dict[str, aiohttp.ClientSession] = {}

    async def forward(request: web.Request) -> web.Response:
        await asyncio.sleep(late.get(request.rel_url.path, 0.0))
        if "client" not in session:
            session["client"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        headers = {name: request.headers[name] for name in _FORWARDED_HEADERS if name in request.headers}
        async with session["client"].request(
            request.method,
            next(targets) + request.rel_url.path_qs,
            data=await request.read(),
            headers=headers,
        ) as upstream:
            answer = await upstream.read()
            return web.Response(status=upstream.status, body=answer, content_type=upstream.content_type)

    async def close(_: web.Application) -> None:
        if "client" in session:
            await session["client"].close()

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", forward)
    application.on_cleanup.append(close)
    return application


@contextmanager
def round_robin_proxy(upstreams: list[str], *, late: Mapping[str, float] | None = None) -> Iterator[str]:
    """Serve the proxy in a thread of its own and yield its base URL (…/v1); stopped at the end.
    ``late``: seconds to wait before forwarding a request for each of these paths."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_application(upstreams, late or {}))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]  # (host, port) of the one socket the site listens on
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()
