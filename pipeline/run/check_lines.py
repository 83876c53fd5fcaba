"""The lines ``pipeline check`` (and, without the probes, a run's preflight) says of one server: each an
ok / warn / fail / unknown verdict with one sentence, from numbers already read and measured. Pure
functions: the reading and the fit are :mod:`pipeline.servers.capacity`'s, the probing
:mod:`pipeline.run.check`'s.

What could not be checked is ``unknown``, neither ok nor a problem: a server that does not say something
(a proxy without ``/metrics`` or ``/tokenize``), or what only a probe's answer shows when none answered.
It changes no exit code (a probe that failed has its own fail line) and a run's preflight does not warn
of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.servers.cache_counters import reachable_hit_rate
from pipeline.servers.capacity import RequestFit
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


def context_check(
    context: int | None, longest_prompt: int | None, answer: int | None, max_tokens: int
) -> Check:
    """Whether the longest sampled prompt fits the context with its answer (as measured) and its budget."""
    if context is None:
        return Check("context", "unknown", "the server lists no max_model_len")
    if longest_prompt is None:
        return Check("context", "unknown", f"{context:,} tokens; whether a prompt fits: no prompt measured")
    if answer is not None and longest_prompt + answer > context:
        return Check(
            "context",
            "fail",
            f"{context:,} tokens: the longest sampled prompt ({longest_prompt:,}) and its answer "
            f"({answer:,}) do not fit; such records fail as too_long (use chunking:, or a longer context)",
        )
    if longest_prompt + max_tokens > context:
        return Check(
            "context",
            "warn",
            f"{context:,} tokens: the longest sampled prompt ({longest_prompt:,}) leaves "
            f"{context - longest_prompt:,} of max_tokens {max_tokens:,}; such requests ask for less",
        )
    return Check("context", "ok", f"{context:,} tokens; the longest sampled prompt is {longest_prompt:,}")


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
