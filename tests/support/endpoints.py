"""Endpoints and a running router over fake servers, for unit tests of what sends requests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import anyio

from pipeline.errors import first_error
from pipeline.extraction.prompt import client_settings
from pipeline.job.spec import JobSpec
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.router import Router
from tests.support.runs import no_sleep


def endpoint_for(spec: JobSpec, config: EndpointConfig | None = None) -> Endpoint:
    """An endpoint of ``spec`` (its first, or ``config``) with its own client: serve a fake first and
    point the spec at it (:func:`tests.support.runs.served`)."""
    config = config or spec.endpoint_configs()[0]
    client = LLMClient(client_settings(spec, config))
    return Endpoint(
        config,
        client,
        abort_after_failures=spec.retry.abort_after_consecutive_failures,
        timeout_s=spec.request_timeout_s,
        clock=anyio.current_time,
    )


@asynccontextmanager
async def running_router(
    endpoints: Sequence[Endpoint],
    *,
    give_up_after_s: float = 60.0,
    stall_after_s: float = 600.0,
    probe_sleep: Callable[[float], Awaitable[None]] = no_sleep,
) -> AsyncIterator[Router]:
    """A router over ``endpoints`` with its background running, stopped at the end. An error of the
    body comes out as itself, not in an exception group."""
    router = Router(
        endpoints, give_up_after_s=give_up_after_s, stall_after_s=stall_after_s, probe_sleep=probe_sleep
    )
    try:
        async with anyio.create_task_group() as background:
            await background.start(router.run)
            try:
                yield router
            finally:
                background.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise first_error(group) from None
