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

from pipeline.endpoint import Endpoint
from pipeline.endpoint_spec import EndpointConfig
from pipeline.errors import ModelNotServedError
from pipeline.job import JobSpec
from pipeline.llm import ClientSettings, LLMClient
from pipeline.prompt import PromptBuilder, response_format_for
from pipeline.router import Router

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions

log = structlog.get_logger("pipeline.fleet")


def client_settings(spec: JobSpec, config: EndpointConfig | None = None) -> ClientSettings:
    """Everything about a request to this endpoint (default: the job's first) that is the same for
    every record."""
    config = config or spec.endpoint_configs()[0]
    return ClientSettings(
        base_url=config.base_url,
        model=config.model,
        api_key=spec.api_key(config.api_key_env),
        api_key_env=config.api_key_env,
        concurrency=config.most_in_flight,
        request_timeout_s=spec.request_timeout_s,
        temperature=spec.temperature,
        reasoning_effort=spec.reasoning_effort,
        response_format=response_format_for(spec.schema_class) if config.structured_output else None,
        extra_body=spec.extra_body,
        preflight_timeout_s=spec.operations.preflight_timeout_s,
        system_with_schema=None if spec.prompt.include_schema else PromptBuilder.schema_system(spec),
    )


@asynccontextmanager
async def open_fleet(
    spec: JobSpec,
    *,
    transport: httpx2.AsyncBaseTransport | None = None,
    local: LocalServerOptions | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    knees: Mapping[str, int] | None = None,
) -> AsyncIterator[tuple[JobSpec, Router]]:
    """Start what must be started (the local server), open a client per endpoint, check every server,
    and yield the spec as it runs (the local server's URL and model in it) and the router. ``knees``:
    where earlier runs found each server's best level, for `concurrency: auto` to start from."""
    async with AsyncExitStack() as stack:
        if spec.endpoint.is_local and not spec.endpoints:
            from pipeline.local import local_endpoint  # the local extra: only when asked for

            spec = await stack.enter_async_context(local_endpoint(spec, local))
        endpoints = []
        for config in spec.endpoint_configs():
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
        yield spec, router


def _known_knee(config: EndpointConfig, knees: Mapping[str, int]) -> int | None:
    level = knees.get(config.knee_key) if config.concurrency is None else None
    if level is not None:
        log.info(
            "concurrency auto starts at the knee an earlier run found", endpoint=config.name, level=level
        )
    return level
