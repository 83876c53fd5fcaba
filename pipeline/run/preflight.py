"""The cheap part of ``pipeline check`` as a run's preflight: no probes, only what each server said of
itself before the first request (context, KV cache, prefix caching, the shared prefix's tokens: the
fleet's one reading, :meth:`~pipeline.servers.endpoint.Endpoint.read_before_start`) and the arithmetic
over it, said once at the start as one warning line each. It never stops a run and never delays it: what
a server did not say within the fleet's budget is left unsaid.

Without probes a request's answer is unknown: the KV cache's fit counts each at ``max_tokens`` (the
most it may take) and its prompt at the fixed part (system prompt, examples, template), by the one count
(:class:`~pipeline.servers.capacity.RequestFit`); ``pipeline check JOB`` measures both on real records.

Only a server that gives its context (vLLM lists ``max_model_len`` in ``/v1/models``; or the job says
it) is read: one that does not (another OpenAI-compatible server, a proxy) is sent nothing but its model
list and chat completions, as before, and ``pipeline check`` says what it cannot see.
"""

from __future__ import annotations

import structlog

from pipeline.extraction.context import RunContext
from pipeline.job.spec import JobSpec
from pipeline.run.check_lines import Check, fixed_part_check, kv_check, prefix_check
from pipeline.servers.capacity import RequestFit, ServerReading
from pipeline.servers.router import Router

log = structlog.get_logger("pipeline.run.preflight")


async def warn_before_start(
    context: RunContext, router: Router, pending: int | None, check: str
) -> list[Check]:
    """Log each warning or failure of every endpoint's reading (one warning line each; what the server
    does not say is not one) and return them. ``check``: the command that measures what this guesses."""
    found: list[Check] = []
    for endpoint in router.endpoints:
        if endpoint.reading is None:
            continue
        for line in preflight_checks(
            context.spec, endpoint.config.concurrency, endpoint.reading, pending, check
        ):
            if line.is_problem:
                found.append(line)
                log.warning(f"server check: {line.name}: {line.message}", endpoint=endpoint.name)
    return found


def preflight_checks(
    spec: JobSpec, concurrency: int | None, reading: ServerReading, pending: int | None, check: str
) -> list[Check]:
    """The lines a server's own word gives for this job, without a probe (``check``: the command that
    measures, which the KV cache's line names)."""
    fit = RequestFit.of_reading(reading, answer_tokens=spec.max_tokens)
    basis = f"its answer counted at max_tokens; `{check}` measures"
    return [
        fixed_part_check(reading.context, reading.prefix_tokens, spec.max_tokens),
        kv_check(reading.kv_tokens, fit, concurrency, basis),
        prefix_check(reading.prefix_caching, reading.prefix_tokens, pending),
    ]
