"""``pipeline check JOB``: what is wrong with the server for this job, in 30 seconds, before a night.

Per endpoint: the server's own word (:func:`~pipeline.servers.capacity.read_server`: context, KV cache,
prefix caching, the shared prefix's tokens), then a few probes made from a seeded sample of the job's
own records, sent as the run sends them (the job's prompt and settings, the budget the run's rule leaves
them in this context, the production client, the one retry policy with a probe's smaller budget of
transient retries, so a server answering only errors fails the check in seconds), one at a time so
each measures a reply alone; then the prompts of the pending records with the longest prompt fields,
counted by the server and fitted to its context as a run fits them (a record a run refuses, the check
says it refuses); then the lines of :mod:`pipeline.run.check_lines`. Exit 0 all ok, 1 a warning, 3 the
server cannot serve the job.

With several endpoints, the top-level numbers are the first endpoint's, ``endpoints`` has each one's,
``checks`` has all of them (each with its ``endpoint``), and the backlog's ETA is over all of them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Awaitable, Callable, Sequence
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
from pipeline.extraction.budget import estimated_tokens
from pipeline.extraction.calibration import LEARNED_WINDOW, Calibration, fewest_answer_tokens
from pipeline.extraction.prompt import PromptBuilder, client_settings
from pipeline.extraction.retry import RetryPolicy
from pipeline.job.spec import JobSpec
from pipeline.reports.status import blank_as_read, pending_as_read
from pipeline.run.check_lines import (
    Check,
    PromptFit,
    answer_check,
    backlog_check,
    backlog_eta_s,
    context_check,
    effort_check,
    format_check,
    kv_check,
    longest_first,
    prefix_check,
    timeout_check,
)
from pipeline.run.probes import (
    LONGEST_COUNTED,
    PROMPTS_COUNTED,
    Measured,
    Probe,
    counted_prompt,
    effort_probes,
    fit_as_run,
    honored,
    probe_policy,
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
from pipeline.source.blank import BlankRecords
from pipeline.source.pending import PendingQueries, sampled_fields
from pipeline.source.reader import SourceRecord, longest_pending
from pipeline.source.versions import version_of
from pipeline.store.opening import open_for_reading
from pipeline.store.read_copy import ReadCopy
from pipeline.store.writer import recent_answers


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
    longest_prompt: dict[str, Any] | None = None  # the longest pending prompt, counted and fitted
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
    "longest_prompt",
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
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> CheckReport:
    """Check every endpoint of ``spec`` for this job; raises :class:`ConfigError` for a source that is
    not there or has no record to probe with (none, or only blank ones), as a run says it. The backlog
    is said once, after the last endpoint, unless no endpoint could be read at all (its fail line says
    why). ``sleep`` is the probes' wait between retries."""
    pending, copy = await _pending(spec)  # first: it loads a job's seed file, as a run would
    blank = await anyio.to_thread.run_sync(blank_as_read, spec)
    records = await anyio.to_thread.run_sync(read_records, spec, probes, seed)
    if not records.probed:
        raise ConfigError(f"{spec.source_file}: {_nothing_to_probe(blank)}")
    policy = probe_policy(spec, sleep)
    reports = [
        await check_endpoint(spec, config, records, pending, probe_timeout_s, policy)
        for config in spec.endpoint_configs()
    ]
    throughputs = [r.throughput_tok_s for r in reports]
    tokens = next((r.tokens_per_record for r in reports if r.tokens_per_record is not None), None)
    eta = backlog_eta_s(pending, tokens, throughputs)
    if not all(report.unreachable for report in reports):
        speeds = [r.speed for r in reports]
        reports[-1].checks.append(backlog_check(pending, tokens, throughputs, speeds))
    if blank:  # records a run never sends: a file loaded with a column mapped wrong makes them all so
        reports[-1].checks.append(Check("blank", "warn", blank.not_sent()))
    return CheckReport(reports, pending, eta, copy)


@dataclass(frozen=True, slots=True)
class JobRecords:
    """What a check reads of the job's records: the fields of those probed (a seeded sample), of those
    whose prompts are counted (a larger one), the pending records with the longest prompts, and what
    earlier runs' answers took (a run's calibration starts from them). A blank record (every prompt
    field empty) is in none of them: a run never sends one."""

    probed: Sequence[dict[str, object]]
    counted: Sequence[dict[str, object]]
    longest: Sequence[SourceRecord]
    answered_before: Sequence[int]


def read_records(spec: JobSpec, probes: int, seed: int) -> JobRecords:
    """The records a check sends and counts, read at once (``--sample N --seed S``'s sample for the
    probes); blocking. None to probe when the source has none, or only blank ones."""
    connection = open_for_reading(spec)
    try:
        probed = sampled_fields(connection, spec, probes, seed)
        counted = sampled_fields(connection, spec, PROMPTS_COUNTED, seed)
        longest = longest_pending(connection, PendingQueries(spec, version_of(spec)), LONGEST_COUNTED)
        answered = recent_answers(connection, spec, LEARNED_WINDOW)
    finally:
        connection.close()
    return JobRecords(probed, counted, longest, answered)


def _nothing_to_probe(blank: BlankRecords | None) -> str:
    """Why a check has no record to probe the server with: the source has none, or every one is blank."""
    if not blank:
        return "the source has no records to probe the server with"
    return (
        f"every record of the source is blank ({blank.describe()}), so there is nothing to probe the "
        "server with and nothing a run would send: load records with text in those fields"
    )


async def _pending(spec: JobSpec) -> tuple[int | None, ReadCopy | None]:
    """What a plain run would take; while a run holds the database, as its read copy counts it (None
    before it has written one)."""
    try:
        return await count_pending(spec), None
    except DatabaseLockedError:
        return await anyio.to_thread.run_sync(pending_as_read, spec)


@dataclass(frozen=True, slots=True)
class Probed:
    """What one server's probes and counts gave: the probes, whether it refused ``response_format``, a
    probe's fail line, reasoning tokens by effort, and the longest pending prompts as a run fits them."""

    measured: Measured
    refused: bool
    failure: Check | None
    efforts: dict[str, int]
    longest: list[PromptFit]


async def check_endpoint(
    spec: JobSpec,
    config: EndpointConfig,
    records: JobRecords,
    pending: int | None,
    probe_timeout_s: float,
    policy: RetryPolicy,
) -> EndpointReport:
    """One server's report: its reading, the probes (retried under ``policy``), and every line but the
    backlog's."""
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
        probed = await _probe(client, spec, policy, prompts, records, timeout)
    _fill(report, spec, config, reading, probed, pending)
    answered = bool(probed.measured.probes)
    report.checks.insert(5, format_check(settings.response_format is not None, probed.refused, answered))
    if probed.failure is not None:
        report.checks.insert(0, probed.failure)
    return report


async def _probe(
    client: LLMClient,
    spec: JobSpec,
    policy: RetryPolicy,
    prompts: PromptBuilder,
    records: JobRecords,
    timeout_s: float,
) -> Probed:
    """The sample's prompts counted, the probes sent with the budget a run gives them here (a record a
    run refuses is not sent), the contrasting effort's probe, and the longest pending prompts fitted:
    what an answer needs and the server's rate start where a run's do and learn as a run's learn."""
    calibration = Calibration(fewest_answer_tokens(spec.schema_class), records.answered_before)
    counted = await counted_prompt(client, [prompts.request_for(fields) for fields in records.counted])
    fits = [await fit_as_run(client, prompts, calibration, fields) for fields in records.probed]
    requests = [fit.request for fit in fits if fit.request is not None]
    measured, refused, failure = await send_probes(client, policy, requests, timeout_s)
    for request, probe in zip(requests, measured, strict=False):  # a reply's count teaches it too
        calibration.counted(estimated_tokens(request.messages), probe.prompt_tokens)
    efforts = await effort_probes(client, spec, policy, requests[0], measured, timeout_s) if measured else {}
    longest = [
        await fit_as_run(client, prompts, calibration, record.fields, record.id) for record in records.longest
    ]
    return Probed(Measured(measured, counted, len(records.counted)), refused, failure, efforts, longest)


def _fill(
    report: EndpointReport,
    spec: JobSpec,
    config: EndpointConfig,
    reading: ServerReading,
    probed: Probed,
    pending: int | None,
) -> None:
    """The numbers and the lines (all but response_format's, the probe's and the backlog's)."""
    measured, efforts = probed.measured, probed.efforts
    probes, answer = measured.probes, measured.answer
    fit = RequestFit.of_reading(reading, answer_tokens=answer, prompt_tokens=measured.prompt)
    report.context, report.kv_tokens = reading.context, reading.kv_tokens
    report.requests_that_fit = None if fit is None else fit.requests
    report.prefix_caching = reading.prefix_caching
    report.answer_in_reasoning = any(p.lands == "reasoning" for p in probes) if probes else None
    report.reasoning_effort_honored = honored(efforts)
    report.tokens_per_record = answer
    report.longest_prompt = _longest_json(probed.longest)
    report.speed = reading.time_scale
    level = _level(config, report.requests_that_fit)
    predicted = _predict(report, level, reading.time_scale, probes)
    reasoning = [p.reasoning_tokens for p in probes if p.reasoning_tokens is not None]
    lands = [p.lands for p in probes]
    report.checks += [
        context_check(reading.context, probed.longest, spec.max_tokens, answer),
        kv_check(reading.kv_tokens, fit, config.concurrency, measured.basis),
        prefix_check(reading.prefix_caching, reading.prefix_tokens, pending, measured.prompt),
        answer_check(len(lands), lands.count("reasoning"), lands.count("cut"), lands.count("none")),
        effort_check(
            spec.reasoning_effort, honored(efforts), efforts, max(reasoning, default=None), spec.max_tokens
        ),
        timeout_check(level, predicted, spec.request_timeout_s, reading.running, reading.time_scale),
    ]


def _longest_json(fits: Sequence[PromptFit]) -> dict[str, Any] | None:
    """The longest of the pending prompts counted: its record, tokens (``counted``: by the server),
    the budget a run asks for it (``max_tokens``; null: a run refuses it, unsent, as ``too_long``)."""
    if not fits:
        return None
    longest = longest_first(fits)[0]
    refused = longest.refused
    return {
        "record_id": longest.record_id,
        "tokens": longest.prompt.tokens if refused is None else refused.tokens,
        "counted": longest.prompt.exact if refused is None else refused.exact,
        "max_tokens": None if longest.request is None else longest.request.max_tokens,
    }


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
