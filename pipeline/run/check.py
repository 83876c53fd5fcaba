"""``pipeline check JOB``: what is wrong with the server for this job, in 30 seconds, before a night.

Per endpoint: the server's own word (:func:`~pipeline.servers.capacity.read_server`: context, KV cache,
prefix caching, the shared prefix's tokens), then a few probes made from a seeded sample of the job's
own records, sent as the run sends them (the job's prompt and settings, the production client, the one
retry policy), one at a time so each measures a reply alone; then the lines of
:mod:`pipeline.run.check_lines`. Exit 0 all ok, 1 a warning, 3 the server cannot serve the job.

With several endpoints, the top-level numbers are the first endpoint's, ``endpoints`` has each one's,
``checks`` has all of them (each with its ``endpoint``), and the backlog's ETA is over all of them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from pipeline.defaults import DEFAULT_PROBE_TIMEOUT_S, DEFAULT_PROBES
from pipeline.errors import (
    ConfigError,
    DatabaseLockedError,
    Ending,
    FatalRunError,
    exit_code_for,
)
from pipeline.extraction.prompt import PromptBuilder, client_settings
from pipeline.job.spec import JobSpec
from pipeline.reports.status import pending_as_read
from pipeline.run.check_lines import (
    Check,
    answer_check,
    backlog_check,
    backlog_eta_s,
    context_check,
    effort_check,
    format_check,
    kv_check,
    prefix_check,
    timeout_check,
)
from pipeline.run.probes import (
    PROMPTS_COUNTED,
    Measured,
    Probe,
    counted_prompt,
    effort_probes,
    honored,
    send_probes,
)
from pipeline.run.runner import count_pending
from pipeline.servers.capacity import (
    RequestFit,
    ServerReading,
    aggregate_tokens_per_s,
    effective_concurrency,
    read_server,
    reply_latency_s,
)
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.source.pending import sampled_fields
from pipeline.store.opening import open_for_reading
from pipeline.store.read_copy import ReadCopy


@dataclass(slots=True)
class EndpointReport:
    base_url: str
    model: str
    context: int | None = None
    kv_tokens: int | None = None
    requests_that_fit: int | None = None
    prefix_caching: bool | None = None
    answer_in_reasoning: bool | None = None
    reasoning_effort_honored: bool | None = None
    throughput_tok_s: float = 0.0  # expected at the job's concurrency, for the backlog (the model's)
    speed: float = 1.0  # a simulator's --speed (its seconds are this many of the model's), else 1
    tokens_per_record: float | None = None
    checks: list[Check] = field(default_factory=list)
    unreachable: bool = False  # the server could not be read: its one line is the fail that says why

    def as_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _JSON_KEYS if name not in ("eta_s", "checks")}
        return {
            "base_url": self.base_url,
            "model": self.model,
            **data,
            "checks": [c.as_json() for c in self.checks],
        }


_JSON_KEYS = (
    "context",
    "kv_tokens",
    "requests_that_fit",
    "prefix_caching",
    "answer_in_reasoning",
    "reasoning_effort_honored",
    "eta_s",
    "checks",
)


@dataclass(frozen=True, slots=True)
class CheckReport:
    endpoints: list[EndpointReport]
    pending: int | None
    eta_s: float | None
    read_copy: ReadCopy | None = None  # a run holds the database: the backlog is its read copy's

    @property
    def checks(self) -> list[Check]:
        return [check for endpoint in self.endpoints for check in endpoint.checks]

    @property
    def exit_code(self) -> int:
        """A failure's, else a warning's, else 0: what could not be checked (unknown) counts for neither."""
        statuses = {check.status for check in self.checks}
        if "fail" in statuses:
            return exit_code_for(Ending.CHECK_FAILED)
        return exit_code_for(Ending.CHECK_WARNED if "warn" in statuses else Ending.DONE)

    def as_json(self) -> dict[str, Any]:
        first = self.endpoints[0].as_json()
        several = len(self.endpoints) > 1
        checks = [
            {**check.as_json(), **({"endpoint": e.base_url} if several else {})}
            for e in self.endpoints
            for check in e.checks
        ]
        data = {key: first.get(key) for key in _JSON_KEYS} | {"eta_s": self.eta_s, "checks": checks}
        copy = self.read_copy.to_json() if self.read_copy else None
        return data | {
            "pending": self.pending,
            "read_copy": copy,
            "endpoints": [e.as_json() for e in self.endpoints],
        }

    def lines(self) -> list[str]:
        several = len(self.endpoints) > 1
        out = []
        for endpoint in self.endpoints:
            if several:
                out.append(f"{endpoint.base_url} ({endpoint.model})")
            out += [f"{'  ' if several else ''}{check.line()}" for check in endpoint.checks]
        return out


async def check_job(
    spec: JobSpec,
    *,
    probes: int = DEFAULT_PROBES,
    seed: int = 0,
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
) -> CheckReport:
    """Check every endpoint of ``spec`` for this job; raises :class:`ConfigError` for a source that is
    not there or has no records (nothing to probe with), as a run says it. The backlog is said once,
    after the last endpoint, unless no endpoint could be read at all (its fail line says why)."""
    pending, copy = await _pending(spec)  # first: it loads a job's seed file, as a run would
    records = await anyio.to_thread.run_sync(sample_fields, spec, probes, seed)
    counted = await anyio.to_thread.run_sync(sample_fields, spec, PROMPTS_COUNTED, seed)
    reports = [
        await check_endpoint(spec, config, Sampled(records, counted), pending, probe_timeout_s)
        for config in spec.endpoint_configs()
    ]
    throughputs = [r.throughput_tok_s for r in reports]
    tokens = next((r.tokens_per_record for r in reports if r.tokens_per_record is not None), None)
    eta = backlog_eta_s(pending, tokens, throughputs)
    if not all(report.unreachable for report in reports):
        speeds = [r.speed for r in reports]
        reports[-1].checks.append(backlog_check(pending, tokens, throughputs, speeds))
    return CheckReport(reports, pending, eta, copy)


def sample_fields(spec: JobSpec, records: int, seed: int) -> list[dict[str, object]]:
    """The fields of a seeded sample of ``records`` source records (``--sample N --seed S``'s)."""
    connection = open_for_reading(spec)
    try:
        fields = sampled_fields(connection, spec, records, seed)
    finally:
        connection.close()
    if not fields:
        raise ConfigError(f"{spec.source_file}: the source has no records to probe the server with")
    return fields


async def _pending(spec: JobSpec) -> tuple[int | None, ReadCopy | None]:
    """What a plain run would take; while a run holds the database, as its read copy counts it (None
    before it has written one)."""
    try:
        return await count_pending(spec), None
    except DatabaseLockedError:
        return await anyio.to_thread.run_sync(pending_as_read, spec)


@dataclass(frozen=True, slots=True)
class Sampled:
    """The sampled records' fields: those probed, and those whose prompts are counted."""

    probed: Sequence[dict[str, object]]
    counted: Sequence[dict[str, object]]


async def check_endpoint(
    spec: JobSpec, config: EndpointConfig, sampled: Sampled, pending: int | None, probe_timeout_s: float
) -> EndpointReport:
    """One server's report: its reading, the probes, and every line but the backlog's."""
    report = EndpointReport(config.base_url, config.model)
    settings = client_settings(spec, config)
    timeout = min(spec.request_timeout_s, probe_timeout_s)
    prompts = PromptBuilder(spec)
    async with LLMClient(dataclasses.replace(settings, request_timeout_s=timeout)) as client:
        try:
            fixed, wait_s = prompts.fixed_messages, spec.operations.preflight_timeout_s
            reading = await read_server(client, fixed, timeout_s=wait_s)
        except FatalRunError as error:
            report.checks.append(Check("server", "fail", str(error)))
            report.unreachable = True
            return report
        counted = await counted_prompt(client, [prompts.request_for(fields) for fields in sampled.counted])
        requests = [prompts.request_for(fields) for fields in sampled.probed]
        measured, refused, failure = await send_probes(client, spec, requests, timeout)
        efforts = await effort_probes(client, spec, requests[0], measured, timeout) if measured else {}
    _fill(report, spec, config, reading, Measured(measured, counted, len(sampled.counted)), efforts, pending)
    report.checks.insert(5, format_check(settings.response_format is not None, refused, bool(measured)))
    if failure is not None:
        report.checks.insert(0, failure)
    return report


def _fill(
    report: EndpointReport,
    spec: JobSpec,
    config: EndpointConfig,
    reading: ServerReading,
    measured: Measured,
    efforts: dict[str, int],
    pending: int | None,
) -> None:
    """The numbers and the lines (all but response_format's, the probe's and the backlog's)."""
    probes, answer = measured.probes, measured.answer
    fit = RequestFit.of_reading(reading, answer_tokens=answer, prompt_tokens=measured.prompt)
    report.context, report.kv_tokens = reading.context, reading.kv_tokens
    report.requests_that_fit = None if fit is None else fit.requests
    report.prefix_caching = reading.prefix_caching
    report.answer_in_reasoning = any(p.lands == "reasoning" for p in probes) if probes else None
    report.reasoning_effort_honored = honored(efforts)
    report.tokens_per_record = answer
    report.speed = reading.time_scale
    level = _level(config, report.requests_that_fit)
    predicted = _predict(report, level, reading.time_scale, probes)
    longest = max(((p.prompt_tokens, p.completion_tokens) for p in probes), default=(None, None))
    reasoning = [p.reasoning_tokens for p in probes if p.reasoning_tokens is not None]
    lands = [p.lands for p in probes]
    report.checks += [
        context_check(reading.context, longest[0], longest[1], spec.max_tokens),
        kv_check(reading.kv_tokens, fit, config.concurrency, measured.basis),
        prefix_check(reading.prefix_caching, reading.prefix_tokens, pending, measured.prompt),
        answer_check(len(lands), lands.count("reasoning"), lands.count("cut"), lands.count("none")),
        effort_check(
            spec.reasoning_effort, honored(efforts), efforts, max(reasoning, default=None), spec.max_tokens
        ),
        timeout_check(level, predicted, spec.request_timeout_s, reading.running, reading.time_scale),
    ]


def _level(config: EndpointConfig, fit: int | None) -> int:
    """The requests the job keeps in flight here: its concurrency, or with ``auto`` as many as fit (auto
    backs off where the server queues), at most ``max_concurrency``."""
    if config.concurrency is not None:
        return config.concurrency
    return min(config.max_concurrency, fit) if fit else config.max_concurrency


def _predict(report: EndpointReport, concurrency: int, scale: float, measured: list[Probe]) -> float | None:
    """The throughput to expect at ``concurrency`` (into ``report``) and a reply's latency there, from
    the probes' replies alone (in the model's seconds: the simulator's time compression undone)."""
    if not measured:
        return None
    alone = statistics.mean(p.latency_s for p in measured) * scale
    single = statistics.mean(p.completion_tokens / max(p.latency_s * scale, 1e-9) for p in measured)
    fit = report.requests_that_fit
    report.throughput_tok_s = aggregate_tokens_per_s(single, effective_concurrency(concurrency, fit))
    return reply_latency_s(alone, concurrency, fit)
