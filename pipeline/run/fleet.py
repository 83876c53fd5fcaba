"""The servers of one run: each endpoint of the job with its client, behind one router, checked before
the first request. The bundled local vLLM server is one such endpoint, started only here, so only when
there is work to do."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import httpx2
import structlog

from pipeline.errors import ModelNotServedError
from pipeline.extraction.prompt import client_settings
from pipeline.run.context import RunContext
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.router import Router

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions

log = structlog.get_logger("pipeline.run.fleet")


@asynccontextmanager
async def open_fleet(
    context: RunContext,
    *,
    transport: httpx2.AsyncBaseTransport | None = None,
    local: LocalServerOptions | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    knees: Mapping[str, int] | None = None,
) -> AsyncIterator[tuple[RunContext, Router]]:
    """Start what must be started (the local server), open a client per endpoint, check every server,
    and yield the run's context as it runs (the local server's URL and model in its spec) and the
    router. ``knees``: where earlier runs found each server's best level, for `concurrency: auto` to
    start from."""
    async with AsyncExitStack() as stack:
        spec = context.spec
        if spec.endpoint.is_local and not spec.endpoints:
            from pipeline.local import local_endpoint  # the local extra: only when asked for

            address = await stack.enter_async_context(local_endpoint(local))
            context = context.running(spec.with_overrides(base_url=address.base_url, model=address.model))
            spec = context.spec
        endpoints = []
        for config in context.endpoints:
            client = await stack.enter_async_context(
                LLMClient(client_settings(spec, config), transport=transport)
            )
            endpoints.append(
                Endpoint(
                    config,
                    client,
                    abort_after_failures=spec.retry.abort_after_consecutive_failures,
                    timeout_s=spec.request_timeout_s,
                    known_knee=_known_knee(config, knees or {}),
                    clock=anyio.current_time,
                )
            )
        router = Router(
            endpoints,
            give_up_after_s=spec.operations.server_down_abort_s,
            stall_after_s=spec.operations.stall_warning_s,
            probe_sleep=sleep,
        )
        try:
            await router.check_servers()
        except ModelNotServedError as error:
            raise ModelNotServedError(f"{spec.source_file}: key 'model': {error}") from error
        yield context, router


def _known_knee(config: EndpointConfig, knees: Mapping[str, int]) -> int | None:
    level = knees.get(config.knee_key) if config.concurrency is None else None
    if level is not None:
        log.info(
            "concurrency auto starts at the knee an earlier run found", endpoint=config.name, level=level
        )
    return level
