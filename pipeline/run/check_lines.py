"""The lines ``pipeline check`` (and, without the probes, a run's preflight) says of one server: each an
ok / warn / fail / unknown verdict with one sentence, from numbers already read and measured. Pure
functions: the reading and the fit are :mod:`pipeline.servers.capacity`'s, the probing and the prompts
fitted to the context :mod:`pipeline.run.probes`'s.

What could not be checked is ``unknown``, neither ok nor a problem: a server that does not say something
(a proxy without ``/metrics`` or ``/tokenize``), or what only a probe's answer shows when none answered.
It changes no exit code (a probe that failed has its own fail line) and a run's preflight does not warn
of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pipeline.errors import TooLongError
from pipeline.extraction.budget import FIXED_PART_ADVICE, FIXED_PART_FULL, PromptCount
from pipeline.servers.cache_counters import reachable_hit_rate
from pipeline.servers.capacity import RequestFit
from pipeline.servers.client import ChatRequest
from pipeline.source.reader import RecordId
from pipeline.wording import counted, duration, model_time

Status = Literal["ok", "warn", "fail", "unknown"]
#: The widest status word: the lines' names start in one column.
STATUS_WIDTH = len("unknown")
#: A reply this share of the timeout or more is close to being killed.
TIMEOUT_MARGIN = 0.6
#: Reasoning tokens past this share of max_tokens leave the answer little room.
REASONING_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    message: str

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "message": self.message}

    @property
    def is_problem(self) -> bool:
        """A warning or a failure: what a run's preflight says and what sets the exit code."""
        return self.status in ("warn", "fail")

    def line(self) -> str:
        return f"{self.status:<{STATUS_WIDTH}}  {self.name}: {self.message}"


@dataclass(frozen=True, slots=True)
class PromptFit:
    """One record's prompt against a server's context as a run sends it
    (:func:`pipeline.run.probes.fit_as_run`): its tokens (the server's count, else the estimate) and its
    request with the budget the run asks for, or ``refused``: the ``too_long`` failure a run ends the
    record with, unsent."""

    record_id: RecordId | None  # None: a record sampled for a probe, whose id is not read
    prompt: PromptCount
    request: ChatRequest | None
    refused: TooLongError | None = None


def context_check(
    context: int | None, longest: Sequence[PromptFit], max_tokens: int, answer: float | None = None
) -> Check:
    """Whether the pending records with the longest prompts fit ``context`` as a run sends them: one a
    run refuses unsent fails, one sent with less than ``max_tokens`` warns (``answer``: what the probes'
    answers took, said beside what is left), all sent whole are ok; a prompt the server did not count
    is unknown, unless even its floor does not fit (refused)."""
    if context is None:
        return Check("context", "unknown", "the server lists no max_model_len")
    if not longest:
        return Check("context", "unknown", f"{context:,} tokens; whether a prompt fits: no pending record")
    ranked = longest_first(longest)
    of_them = f"{context:,} tokens: of the {len(ranked)} pending records with the longest prompts, a run"
    cut = _cut(ranked, max_tokens, answer)
    if any(fit.refused is not None for fit in ranked):
        return _refused(context, ranked, cut, of_them)
    first = ranked[0]
    said = f"the longest pending prompt is {_tokens(first.prompt)} (record {first.record_id})"
    if not all(fit.prompt.exact for fit in ranked):
        return Check("context", "unknown", f"{context:,} tokens; {said}: the server does not count prompts")
    if cut:
        return Check("context", "warn", f"{of_them} {cut}")
    return Check("context", "ok", f"{context:,} tokens; {said}, with max_tokens {max_tokens:,}")


def longest_first(fits: Sequence[PromptFit]) -> list[PromptFit]:
    """``fits`` by their prompts' tokens, longest first (their fields' bytes ranked them before)."""
    return sorted(fits, key=lambda fit: fit.prompt.tokens, reverse=True)


def _refused(context: int, ranked: Sequence[PromptFit], cut: str, of_them: str) -> Check:
    """The fail line of records a run refuses unsent: how many of those counted, the longest's numbers,
    those sent with less than max_tokens (``cut``), and what to do."""
    refused = [fit for fit in ranked if fit.refused is not None]
    first, many = refused[0], len(refused)
    error = first.refused
    assert error is not None
    which = str(many) if many < len(ranked) else f"all {many} (more may not fit: {many} were counted)"
    prompt = f"{'' if error.exact else 'at least '}{error.tokens:,} tokens"
    short = "" if error.tokens >= context else ", too few left for an answer"
    if FIXED_PART_FULL in str(error):
        advice = f"{FIXED_PART_FULL}: {FIXED_PART_ADVICE}"
    else:
        chunking = f"chunking: {{field: {error.field}}}" if error.field else "chunking:"
        advice = f"use {chunking}, a longer context (the server's --max-model-len), or shorter records"
    return Check(
        "context",
        "fail",
        f"{of_them} fails {which} as too_long, unsent (record {first.record_id}: {prompt}{short})"
        f"{f' and {cut}' if cut else ''}; {advice}",
    )


def _cut(ranked: Sequence[PromptFit], max_tokens: int, answer: float | None) -> str:
    """Of the records a run sends, those with less than ``max_tokens``: how many, the least left, and
    how many leave less than the probes' answers took (``answer``)."""
    cut = [fit for fit in ranked if fit.request is not None and fit.request.max_tokens < max_tokens]
    budgets = [fit.request.max_tokens for fit in cut if fit.request is not None]
    if not cut:
        return ""
    least = cut[budgets.index(min(budgets))]
    said = (
        f"sends {len(cut)} with less than max_tokens {max_tokens:,} (the least left: {min(budgets):,}, "
        f"beside record {least.record_id}'s {_tokens(least.prompt)})"
    )
    if answer is not None:
        short = sum(1 for budget in budgets if budget < answer)
        said += f", {short} of them less than the ~{answer:,.0f} the probes' answers took"
    return f"{said}: an answer cut off there fails its record as too_long"


def _tokens(prompt: PromptCount) -> str:
    return f"{prompt.tokens:,} tokens" if prompt.exact else f"~{prompt.tokens:,} tokens, estimated"


def fixed_part_check(context: int | None, fixed_tokens: int | None, max_tokens: int) -> Check:
    """Whether the prompt's fixed part (system prompt, examples, template: what every record sends, as
    the server counts it) leaves the context room for ``max_tokens``: a run's preflight, which reads
    no record."""
    if context is None:
        return Check("context", "unknown", "the server lists no max_model_len")
    if fixed_tokens is None:
        return Check("context", "unknown", f"{context:,} tokens; the prompt's fixed part was not counted")
    fixed = f"the prompt's fixed part (system prompt, examples, template: {fixed_tokens:,} tokens)"
    if fixed_tokens + max_tokens > context:
        return Check(
            "context",
            "warn",
            f"{context:,} tokens: {fixed} leaves {context - fixed_tokens:,} of max_tokens "
            f"{max_tokens:,}; every request asks for less",
        )
    return Check("context", "ok", f"{context:,} tokens; {fixed}")


def kv_check(
    kv_tokens: int | None,
    fit: RequestFit | None,
    concurrency: int | None,
    basis: str = "as the probes measured",
) -> Check:
    """The KV cache in tokens and how many of the job's requests fit at once (``fit``, the one count),
    against its concurrency (None: ``auto``, which starts from the fit); ``basis`` says what the
    request's numbers are."""
    if kv_tokens is None:
        return Check("kv_cache", "unknown", "the server's /metrics give no vllm:cache_config_info")
    if fit is None:
        return Check(
            "kv_cache", "unknown", f"{kv_tokens:,} tokens; how many requests fit: no request measured"
        )
    count, held = fit.requests, f"{fit.held}; {basis}"
    if count < 1:
        return Check(
            "kv_cache", "fail", f"{kv_tokens:,} tokens: not one of this job's requests fits ({held})"
        )
    if concurrency is None:
        return Check(
            "kv_cache",
            "ok",
            f"{kv_tokens:,} tokens: about {counted(count, 'request')} fit ({held}); auto starts there",
        )
    if count < concurrency:
        return Check(
            "kv_cache",
            "warn",
            f"{kv_tokens:,} tokens, c={concurrency}, about {count:,} fit ({held}): expect preemption and a "
            f"collapse past ~{count:,}; use `concurrency: auto` or <= {count:,}",
        )
    return Check(
        "kv_cache",
        "ok",
        f"{kv_tokens:,} tokens: about {counted(count, 'request')} fit ({held}), c={concurrency}",
    )


def prefix_check(
    prefix_caching: bool | None,
    shared_tokens: int | None,
    pending: int | None,
    prompt_tokens: float | None = None,
) -> Check:
    """Prefix caching on or off, and what off costs this job: its shared prefix computed per record; on,
    with a prompt's mean ``prompt_tokens``, the hit rate this job can reach (what a run's is held to)."""
    shared = f"{shared_tokens:,}" if shared_tokens is not None else "the shared"
    if prefix_caching is None:
        return Check("prefix_caching", "unknown", "the server's /metrics do not say")
    if prefix_caching:
        reachable = reachable_hit_rate(shared_tokens, prompt_tokens)
        reach = ""
        if reachable is not None and prompt_tokens:
            reach = (
                f" ({reachable:.0%} of a ~{prompt_tokens:,.0f}-token prompt: the hit rate a run can reach)"
            )
        return Check(
            "prefix_caching", "ok", f"on: {shared} prefix tokens computed once, not per record{reach}"
        )
    cost = ""
    if shared_tokens is not None and pending:
        total = f"{shared_tokens * pending:,} tokens of prefill"
        cost = f" ({shared_tokens:,} x {counted(pending, 'record')} = {total})"
    return Check(
        "prefix_caching",
        "warn",
        f"off: every request computes the {shared} shared prefix tokens again{cost}; "
        "start vLLM with --enable-prefix-caching",
    )


def answer_check(probes: int, in_reasoning: int, truncated: int, empty: int) -> Check:
    """Where the probes' answers landed: content, JSON in ``reasoning`` with content null, cut, nothing."""
    if probes == 0:
        return Check("answer", "unknown", "no probe answered")
    if empty == probes:
        return Check(
            "answer",
            "fail",
            f"none of {counted(probes, 'probe')} got an answer (content and reasoning empty)",
        )
    notes = []
    if in_reasoning:
        notes.append(
            f"{in_reasoning} of {counted(probes, 'probe')} put the JSON in `reasoning` with content null "
            "(vLLM issue 23694): the run recovers it from there"
        )
    if truncated:
        notes.append(
            f"{truncated} of {probes} were cut at max_tokens: the run retries them with a larger budget"
        )
    if notes:
        return Check("answer", "warn", "; ".join(notes))
    return Check("answer", "ok", f"in content ({probes} of {counted(probes, 'probe')})")


def effort_check(
    effort: str | None,
    honored: bool | None,
    tokens: dict[str, int],
    reasoning_max: int | None,
    max_tokens: int,
) -> Check:
    """Whether ``reasoning_effort`` changes the reasoning (``tokens``: reasoning tokens by effort), and
    the reasoning's share of ``max_tokens``."""
    by_effort = ", ".join(f"{name}: {count:,}" for name, count in tokens.items())
    share = reasoning_max / max_tokens if reasoning_max is not None else None
    share_text = (
        f"reasoning takes up to {share:.0%} of max_tokens {max_tokens:,}" if share is not None else ""
    )
    if honored is False:
        return Check(
            "reasoning_effort",
            "warn",
            f"not honoured: reasoning tokens {by_effort}; the server ignores reasoning_effort {effort}",
        )
    if share is not None and share > REASONING_SHARE:
        return Check(
            "reasoning_effort",
            "warn",
            f"{share_text}: the answer shares the budget (raise max_tokens or lower reasoning_effort)",
        )
    if effort is None:
        return Check("reasoning_effort", "ok", f"not sent; {share_text or 'no reasoning reported'}")
    if honored is None:
        return Check(
            "reasoning_effort",
            "unknown",
            f"whether it is honoured: no reasoning tokens reported{'; ' if share_text else ''}{share_text}",
        )
    return Check("reasoning_effort", "ok", f"honoured ({by_effort}); {share_text}")


def format_check(sent: bool, refused: bool, answered: bool) -> Check:
    """Whether the server takes ``response_format``: seen only in a probe's answer (``answered``), or
    in its refusal."""
    if not sent:
        return Check(
            "response_format", "ok", "not sent (structured_output: false): the schema is in the prompt"
        )
    if refused:
        return Check(
            "response_format",
            "warn",
            "refused: the run sends the schema in the prompt instead and validates every answer",
        )
    if not answered:
        return Check("response_format", "unknown", "whether it is accepted: no probe answered")
    return Check("response_format", "ok", "accepted")


def timeout_check(
    concurrency: int,
    predicted_s: float | None,
    timeout_s: float,
    busy: float | None = None,
    speed: float = 1.0,
) -> Check:
    """The probes' latency scaled to the job's concurrency against ``request_timeout_s``; ``busy``: the
    requests the server was running besides the probes (their latency was not a reply's alone);
    ``speed``: a simulator's --speed (the latency is the model's time, said with the wall time)."""
    if predicted_s is None:
        return Check("timeout", "unknown", f"request_timeout_s {timeout_s:g}: no probe latency to compare")
    said = f"at c={concurrency} a reply takes {model_time(predicted_s, speed)}"
    if busy:
        said += f" (measured beside {busy:.0f} other requests: an overestimate)"
    safer = f"{_round_up(predicted_s * 2):g}"
    if predicted_s > timeout_s:
        return Check(
            "timeout",
            "fail",
            f"{said}; request_timeout_s {timeout_s:g} would kill them: set it to {safer} or more",
        )
    if predicted_s > TIMEOUT_MARGIN * timeout_s:
        return Check(
            "timeout",
            "warn",
            f"{said}; request_timeout_s {timeout_s:g} leaves little margin: {safer} is safer",
        )
    return Check("timeout", "ok", f"{said}; request_timeout_s {timeout_s:g}")


def backlog_check(
    pending: int | None,
    tokens_per_record: float | None,
    throughputs: list[float],
    speeds: list[float] | None = None,
) -> Check:
    """The ETA of the backlog: pending records x tokens per record / the expected throughput, here and
    (with one server) on two. ``speeds``: each server's --speed if it is a simulator (1 otherwise): the
    throughputs are the model's, and so is the ETA, said with the wall time the simulators take."""
    if pending is None:
        return Check("backlog", "unknown", "a run holds the job's database and has written no read copy yet")
    if pending == 0:
        return Check("backlog", "ok", "nothing pending")
    total = sum(throughputs)
    records = counted(pending, "record")
    if tokens_per_record is None or total <= 0:
        return Check("backlog", "unknown", f"{records} pending; how fast: no throughput measured")
    eta = pending * tokens_per_record / total
    wall = sum(
        rate * speed for rate, speed in zip(throughputs, speeds or [1.0] * len(throughputs), strict=True)
    )
    on_two = f", ~{duration(eta / 2)} on two" if len(throughputs) == 1 else ""
    return Check(
        "backlog",
        "ok",
        f"{records} x ~{tokens_per_record:,.0f} output tokens / ~{total:,.0f} tok/s: "
        f"{model_time(eta, wall / total, ' here')}{on_two}",
    )


def backlog_eta_s(
    pending: int | None, tokens_per_record: float | None, throughputs: list[float]
) -> float | None:
    total = sum(throughputs)
    if pending is None or tokens_per_record is None or total <= 0:
        return None
    return pending * tokens_per_record / total


def _round_up(seconds: float) -> float:
    """A timeout a person would write: up to the next minute (or 30 s below a minute)."""
    step = 30.0 if seconds < 60 else 60.0
    return float(-(-seconds // step) * step)
