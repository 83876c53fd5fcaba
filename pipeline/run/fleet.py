"""The servers of one run: each endpoint of the job with its client, behind one router, checked before
the first request. The bundled local vLLM server is one such endpoint, started only here, so only when
there is work to do."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import structlog

from pipeline.errors import ModelNotServedError
from pipeline.extraction.context import RunContext
from pipeline.job.spec import JobSpec
from pipeline.servers.capacity import RequestFit, read_server
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.http import http_client
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.router import METRICS_EVERY_S, Router
from pipeline.servers.scrape import server_load
from pipeline.servers.sharing import others_in_flight
from pipeline.servers.window import ServerLoad

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions

log = structlog.get_logger("pipeline.run.fleet")

#: The most a run's start waits for its servers' word (KV cache, counters, the prefix's tokens) before it
#: starts without it.
FIT_BUDGET_S = 1.0
COUNTERS_READ_S = 2.0  # the most a scrape of the servers' counters takes at the run's start or end


@asynccontextmanager
async def open_fleet(
    context: RunContext,
    *,
    local: LocalServerOptions | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    knees: Mapping[str, KneeMemory] | None = None,
) -> AsyncIterator[tuple[RunContext, Router]]:
    """Start what must be started (the local server), open a client per endpoint, check every server,
    and yield the run's context as it runs (the local server's URL and model in its spec) and the
    router. ``knees``: what earlier runs learned of each server's best level, for `concurrency: auto`
    to start from."""
    async with AsyncExitStack() as stack:
        spec = context.spec
        if spec.runs_locally:
            from pipeline.local import local_endpoint  # the local extra: only when asked for

            address = await stack.enter_async_context(local_endpoint(local))
            context = context.running(spec.with_overrides(base_url=address.base_url, model=address.model))
            spec = context.spec
        endpoints = [
            await _open_endpoint(stack, context, config, knees or {}) for config in context.endpoints
        ]
        router = _router(spec, endpoints, sleep)
        await _check_servers(spec, router)
        for endpoint in endpoints:  # before the first request, and before others may join it
            await endpoint.join_pool(METRICS_EVERY_S)
        await _read_servers(context, endpoints)
        yield context, router


async def check_fleet(context: RunContext) -> None:
    """What a run with nothing to do can still check, raising what :func:`open_fleet` raises before a
    run's first request: the local extra is installed (the local server is not started), and every
    server answers as an OpenAI API and serves the model. A nightly job whose setup broke says so on a
    quiet night, not on the next night with records."""
    if context.spec.runs_locally:
        from pipeline.local import check_installed  # the local extra: only when asked for

        check_installed()
        return
    async with AsyncExitStack() as stack:
        endpoints = [await _open_endpoint(stack, context, config, {}) for config in context.endpoints]
        await _check_servers(context.spec, _router(context.spec, endpoints, anyio.sleep))


def _router(spec: JobSpec, endpoints: list[Endpoint], sleep: Callable[[float], Awaitable[None]]) -> Router:
    return Router(
        endpoints,
        give_up_after_s=spec.operations.server_down_abort_s,
        stall_after_s=spec.operations.stall_warning_s,
        probe_sleep=sleep,
    )


async def _check_servers(spec: JobSpec, router: Router) -> None:
    """Every server answers and serves the model (:meth:`Router.check_servers`); a model not served is
    said with the key or option that named it."""
    try:
        await router.check_servers()
    except ModelNotServedError as error:
        raise ModelNotServedError(f"{spec.said_of('model')}: {error}") from error


async def _open_endpoint(
    stack: AsyncExitStack, context: RunContext, config: EndpointConfig, knees: Mapping[str, KneeMemory]
) -> Endpoint:
    """One server of the run: its client (closed with the fleet), its limit, its health."""
    spec = context.spec
    client = await stack.enter_async_context(LLMClient(context.client_settings(config)))
    endpoint = Endpoint(
        config,
        client,
        abort_after_failures=spec.retry.abort_after_consecutive_failures,
        timeout_s=spec.request_timeout_s,
        known_knee=_known_knee(config, knees),
        clock=anyio.current_time,
        pooled=True,
    )
    stack.callback(endpoint.leave_pool)
    return endpoint


async def read_counters_at_end(router: Router, timeout_s: float = COUNTERS_READ_S) -> None:
    """One last scrape of each server that has shown its /metrics, so the run's prefix-cache and
    preemption counts reach its end (the scrapes come every few seconds; a server without them is not
    asked). Never an error: a server gone by now leaves the counts of the last scrape."""
    await _scrape(
        [e for e in router.endpoints if e.metrics_available and e.server_counters.scrapes], timeout_s
    )


async def _scrape(endpoints: list[Endpoint], timeout_s: float) -> None:
    """One scrape of each of ``endpoints`` at once, within ``timeout_s``, shielded from cancelling."""
    if not endpoints:
        return
    with anyio.move_on_after(timeout_s, shield=True):
        async with http_client(timeout_s=timeout_s) as http, anyio.create_task_group() as tasks:
            for endpoint in endpoints:
                tasks.start_soon(endpoint.read_server_load, http)


async def _read_servers(context: RunContext, endpoints: list[Endpoint]) -> None:
    """Each server's word before the first request, read once at once for every endpoint that gives its
    context (vLLM does; one that does not is no vLLM and is sent nothing more), within
    :data:`FIT_BUDGET_S`: the endpoint keeps it (its counters start there; the preflight says its
    lines), and with `concurrency: auto` a first run starts where this job's requests fit (the prompt's
    fixed part and answers of max_tokens: the sharing module says why). A server that does not say by
    then starts as before."""
    spec = context.spec
    fixed = context.prompts.fixed_messages

    async def read(endpoint: Endpoint) -> None:
        reading = await read_server(endpoint.client, fixed, timeout_s=FIT_BUDGET_S, check_model=False)
        endpoint.read_before_start(reading)
        fit = RequestFit.of_reading(reading, answer_tokens=spec.max_tokens)
        controller = endpoint.deciding  # None: another job on this machine decides for the pool
        if controller is None or fit is None:
            return
        load = server_load(dict(reading.values)) if reading.metrics else None  # other jobs' requests
        level = controller.start_at_fit(fit, load)
        if level is not None:
            endpoint.adapt()
            beside = _beside_words(load) if level < fit.requests else ""
            log.info(
                f"concurrency auto starts where this job's requests fit in the KV cache{beside}: {level}",
                endpoint=endpoint.name,
                fit=fit.requests,  # as first counted (at max_tokens): a share is of it
                kv_tokens=fit.kv_tokens,
                held=fit.held,  # the request it counts: the fixed part and max_tokens, until replies come
            )

    readable = [endpoint for endpoint in endpoints if endpoint.client.context_length is not None]
    with anyio.move_on_after(FIT_BUDGET_S):
        async with anyio.create_task_group() as group:
            for endpoint in readable:
                group.start_soon(read, endpoint)
    # A reading cut short kept no counters: a run shorter than the scrapes' interval then had nothing to
    # count from at its end, and said no hit rate and no preemptions. Its counters are read alone.
    await _scrape([endpoint for endpoint in readable if endpoint.reading is None], COUNTERS_READ_S)


def _beside_words(load: ServerLoad | None) -> str:
    """Why a run starts below its fit: other jobs' requests run there (on other machines)."""
    others = others_in_flight(load, 0) if load is not None else None
    return f" (its share: {others:.0f} other requests there)" if others else ""


def _known_knee(config: EndpointConfig, knees: Mapping[str, KneeMemory]) -> KneeMemory | None:
    known = knees.get(config.knee_key) if config.concurrency is None else None
    if known is not None:
        found = "the knee an earlier run found" if known.bracketed else "the best level an earlier run saw"
        log.info(f"concurrency auto starts at {found}", endpoint=config.name, level=known.level)
    return known


def knees_to_store(router: Router) -> dict[str, KneeMemory]:
    """What `concurrency: auto` learned of each server in this run, for the next run to start from; a
    knee found while the client was the bottleneck is the client's, not the server's: not stored, and
    said (the knee an earlier run stored stays)."""
    for endpoint in router.endpoints:
        bound = endpoint.controller.client_bound if endpoint.controller is not None else None
        if bound is not None:
            log.warning(
                "concurrency auto: the knee found is not stored as the server's: the client was the "
                f"bottleneck ({bound.words}); the next run starts where an earlier one left",
                endpoint=endpoint.name,
            )
    return {e.config.knee_key: e.found_knee for e in router.endpoints if e.found_knee is not None}
