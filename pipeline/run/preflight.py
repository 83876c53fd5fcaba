"""The cheap part of ``pipeline check`` as a run's preflight: no probes, only what each server says of
itself (context, KV cache, prefix caching, the shared prefix's tokens) and the arithmetic over it, said
once at the start as one warning line each. It never stops a run and never delays it more than
:data:`PREFLIGHT_BUDGET_S`: what a server has not said by then is left unsaid.

Without probes a request's answer is unknown: the KV cache's fit counts each at ``max_tokens`` (an
upper bound, so the fit is a lower bound) and its prompt at the fixed part (system prompt, examples,
template); ``pipeline check JOB`` measures both on real records.

Only a server that gives its context (vLLM lists ``max_model_len`` in ``/v1/models``; or the job says
it) is read: one that does not (another OpenAI-compatible server, a proxy) is sent nothing but its model
list and chat completions, as before, and ``pipeline check`` says what it cannot see.
"""

from __future__ import annotations

import anyio
import structlog

from pipeline.extraction.context import RunContext
from pipeline.job.spec import JobSpec
from pipeline.run.check_lines import Check, context_check, kv_check, prefix_check
from pipeline.servers.capacity import ServerReading, read_server
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.router import Router
from pipeline.servers.sharing import RequestFit

log = structlog.get_logger("pipeline.run.preflight")

#: The most a run's start waits for its servers' word.
PREFLIGHT_BUDGET_S = 1.0


async def warn_before_start(
    context: RunContext, router: Router, pending: int | None, check: str
) -> list[Check]:
    """Read every endpoint at once, log each warning or failure (one warning line each; what the server
    does not say is not one) and return them. ``check``: the command that measures what this guesses."""
    spec = context.spec
    fixed = context.prompts.fixed_messages
    found: list[Check] = []

    async def read(endpoint: Endpoint) -> None:
        reading = await read_server(endpoint.client, fixed, timeout_s=PREFLIGHT_BUDGET_S, check_model=False)
        for line in preflight_checks(spec, endpoint.config.concurrency, reading, pending, check):
            if line.is_problem:
                found.append(line)
                log.warning(f"server check: {line.name}: {line.message}", endpoint=endpoint.name)

    with anyio.move_on_after(PREFLIGHT_BUDGET_S):
        async with anyio.create_task_group() as group:
            for endpoint in router.endpoints:
                if endpoint.client.context_length is not None:
                    group.start_soon(read, endpoint)
    return found


def preflight_checks(
    spec: JobSpec, concurrency: int | None, reading: ServerReading, pending: int | None, check: str
) -> list[Check]:
    """The lines a server's own word gives for this job, without a probe (``check``: the command that
    measures, which the KV cache's line names)."""
    basis = f"each, its answer counted at max_tokens; `{check}` measures"
    prompt = reading.prefix_tokens  # the fixed part, as the server counts it
    fit = RequestFit.of_reading(reading, answer_tokens=spec.max_tokens)
    per_request = None
    if fit is not None and prompt is not None:
        per_request = spec.max_tokens + (0 if reading.prefix_caching else prompt)
    return [
        context_check(reading.context, prompt, None, spec.max_tokens),
        kv_check(reading.kv_tokens, None if fit is None else fit.requests, concurrency, per_request, basis),
        prefix_check(reading.prefix_caching, prompt, pending),
    ]
