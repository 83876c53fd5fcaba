"""The requests ``pipeline check`` sends: the probes (a few of the job's own records, each sent alone as the
run sends it: its budget fitted to the server's context by the run's own rule, under the one retry
policy with a probe's smaller budget of transient retries), a contrasting effort's probe, and the
counts of prompts (``/tokenize``: nothing generated) of a larger sample and of the pending records with
the longest prompts (:func:`fit_as_run`); and what they measured (:class:`Measured`), which
:mod:`pipeline.run.check` turns into its lines.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio
import orjson

from pipeline.errors import (
    PipelineError,
    RecordError,
    StructuredOutputRejectedError,
    TooLongError,
    TransientError,
)
from pipeline.extraction.budget import (
    CountedPrompt,
    PromptParts,
    estimated_tokens,
    fitted,
    longest_field,
    prompt_count,
)
from pipeline.extraction.calibration import Calibration
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.retry import RetryPolicy
from pipeline.job.spec import JobSpec
from pipeline.run.check_lines import Check, PromptFit
from pipeline.servers.client import ChatMessage, ChatRequest, LLMClient
from pipeline.servers.replies import Reply
from pipeline.source.reader import RecordId
from pipeline.wording import counted

#: Records whose prompts are counted (``/tokenize``: nothing generated) for the KV cache's fit: behind a
#: long shared prefix a record's own part is a small share of its prompt, which three probes' mean
#: misses by 15% (the Adzuna ads: ~355 of ~3,230 tokens, a sample mean's spread ~105 for 3, ~26 for 50).
PROMPTS_COUNTED = 50
#: The pending records with the longest prompt fields whose prompts are counted and fitted to the
#: context: ranked by their bytes, which tokenizers turn into tokens at rates that differ a little.
LONGEST_COUNTED = 5
_EFFORTS = ("minimal", "low", "medium", "high")
#: The most of a server's answer a line quotes.
QUOTED_ANSWER = 160
#: A probe's retries of an error a run retries (an HTTP 5xx, a reset): a check is a quick look, and one
#: request alone answered with such an error three times in a row (a few seconds of backoff) is a server
#: that errs, not a blip. Under a run's six retries, with their backoff, a check took 106 s to say so.
PROBE_TRANSIENT_RETRIES = 2


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe's reply, measured: tokens, latency (in the model's seconds), where the answer landed."""

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None
    latency_s: float
    lands: str  # content | reasoning | cut | none


@dataclass(frozen=True, slots=True)
class Measured:
    """What the probes measured, and the prompts the server counted (None: it does not count them)."""

    probes: list[Probe]
    counted_prompt: float | None
    counted: int  # the records whose prompts were counted

    @property
    def prompt(self) -> float | None:
        """A prompt's mean tokens: as counted over the sample, else as the probes' replies said."""
        if self.counted_prompt is not None:
            return self.counted_prompt
        return statistics.mean(p.prompt_tokens for p in self.probes) if self.probes else None

    @property
    def answer(self) -> float | None:
        return statistics.mean(p.completion_tokens for p in self.probes) if self.probes else None

    @property
    def basis(self) -> str:
        """What the KV cache's line counts a request by."""
        answers = f"as {counted(len(self.probes), 'probe')} measured"
        if self.counted_prompt is None:
            return answers
        return f"answers {answers}, prompts as counted over {counted(self.counted, 'record')}"


async def counted_prompt(client: LLMClient, requests: Sequence[ChatRequest]) -> float | None:
    """The mean prompt tokens of ``requests`` as the server counts them (``/tokenize``, nothing
    generated); None from a server that does not count them (the probes' prompts will do)."""
    counts: list[int] = []
    for request in requests:
        try:
            count = await client.count_tokens(request.messages)
        except PipelineError:  # it does not count in time: what it counted so far, if anything
            break
        if count is None:
            break
        counts.append(count)
    return statistics.mean(counts) if counts else None


async def fit_as_run(
    client: LLMClient,
    prompts: PromptBuilder,
    calibration: Calibration,
    fields: Mapping[str, object],
    record_id: RecordId | None = None,
) -> PromptFit:
    """A record's first request as a run sends it to ``client``'s server: its prompt counted by the
    server (else estimated at ``calibration``'s rate), its budget what the run's rule
    (:func:`~pipeline.extraction.budget.fitted`) leaves it, or the ``too_long`` failure the run ends it
    with, unsent."""
    request = prompts.request_for(fields)
    parts = PromptParts(longest_field(prompts.texts(fields)), prompts.fixed_messages)
    counted_as = await _counted(client, request.messages, calibration)
    prompt = prompt_count(request.messages, counted_as, calibration)
    need = calibration.answer_need(request.max_tokens)
    try:
        sent = fitted(request, client.context_length, counted_as, parts, calibration, need)
    except TooLongError as error:
        return PromptFit(record_id, prompt, None, error)
    return PromptFit(record_id, prompt, sent)


async def _counted(
    client: LLMClient, messages: tuple[ChatMessage, ...], calibration: Calibration
) -> CountedPrompt | None:
    """The server's count of ``messages``, taught to ``calibration`` as a run teaches it (None: it does
    not count them, or not in time)."""
    try:
        tokens = await client.count_tokens(messages)
    except PipelineError:
        return None
    if tokens is None:
        return None
    calibration.counted(estimated_tokens(messages), tokens)
    return CountedPrompt(messages, tokens)


def probe_policy(spec: JobSpec, sleep: Callable[[float], Awaitable[None]] = anyio.sleep) -> RetryPolicy:
    """The one retry policy with ``spec``'s limits, its transient retries at most
    :data:`PROBE_TRANSIENT_RETRIES`."""
    retries = min(spec.retry.transient_retries, PROBE_TRANSIENT_RETRIES)
    return RetryPolicy(spec.retry.model_copy(update={"transient_retries": retries}), sleep=sleep)


async def send_probes(
    client: LLMClient, policy: RetryPolicy, requests: Sequence[ChatRequest], timeout_s: float
) -> tuple[list[Probe], bool, Check | None]:
    """Send each request alone under ``policy``; a refused ``response_format`` is dropped as the run
    drops it. Returns the probes, whether the format was refused, and the line of a probe that got no
    answer: a fail when none did (two in a row that got only errors, or one that got nothing in its
    time), a warning when others did (a server that errs on some requests, which a run retries)."""
    refused, measured = False, list[Probe]()
    unanswered: ProbeUnansweredError | None = None
    for request in requests:
        try:
            try:
                reply = await probe_reply(client, policy, request, timeout_s)
            except StructuredOutputRejectedError:
                refused = True
                client.without_structured_output()
                reply = await probe_reply(client, policy, request, timeout_s)
        except ProbeUnansweredError as error:
            # A server failing a quarter of its requests spends a probe's three tries once in 64; only
            # a second such probe in a row, or a silent one, is a server that cannot serve the job.
            if not measured and (unanswered is not None or not error.answered):
                return measured, refused, Check("probe", "fail", str(error))
            unanswered = error
            continue
        except PipelineError as error:
            return measured, refused, Check("probe", "fail", f"a probe failed: {error}")
        measured.append(_measured(reply, request))
    return measured, refused, _unanswered_line(unanswered, len(measured))


def _unanswered_line(unanswered: ProbeUnansweredError | None, answered: int) -> Check | None:
    if unanswered is None:
        return None
    if not answered:
        return Check("probe", "fail", str(unanswered))
    return Check(
        "probe",
        "warn",
        f"{unanswered}; {counted(answered, 'other probe')} answered: the server errs on some requests, "
        "which a run retries",
    )


class ProbeUnansweredError(Exception):
    """A probe that got no reply: none in its time, or only errors a run retries until its retries were
    spent. It says what the server answered in ``seconds`` (an HTTP 500 each time is not a server that is
    silent): ``errors`` are those the probe got, the last the one it ended on, if any."""

    def __init__(self, seconds: float, errors: Sequence[RecordError]) -> None:
        answered = [error for error in errors if _answered(error)]
        last = errors[-1] if errors else None
        self.answered = last is not None and _answered(last)  # with an error, not silent
        took = f"{round(seconds, 1):g}"
        if last is None or not _answered(last):
            said = f"no reply within {took} s (a probe, alone)"
        else:
            once = len(answered) == 1
            times = "once, with" if once else f"{len(answered)} times, each with"
            said = (
                f"in {took} s the server answered {times} an error a run retries (a probe, "
                f"alone); {'it' if once else 'the last'}: {_quoted(str(last))}"
            )
        super().__init__(said)


def _answered(error: RecordError) -> bool:
    """Whether the server answered, if with an error: the client's timeout is no answer."""
    return not (isinstance(error, TransientError) and error.timed_out)


def _quoted(text: str) -> str:
    return text if len(text) <= QUOTED_ANSWER else f"{text[: QUOTED_ANSWER - 1].rstrip()}…"


async def probe_reply(
    client: LLMClient, policy: RetryPolicy, request: ChatRequest, timeout_s: float
) -> Reply:
    """One request under ``policy`` (:func:`probe_policy`), given ``timeout_s`` in all; past it, or once
    its transient retries are spent, :class:`ProbeUnansweredError` says what the server answered."""
    errors: list[RecordError] = []
    observed = dataclasses.replace(policy, observer=lambda _kind, error, _try, _wait: errors.append(error))
    started = anyio.current_time()
    try:
        with anyio.fail_after(timeout_s):
            async for attempt in observed.attempts():
                with attempt:
                    return await client.complete(request)
    except TimeoutError as error:
        raise ProbeUnansweredError(timeout_s, errors) from error
    except TransientError as error:  # its retries spent: not a blip, a server that errs (or is silent)
        raise ProbeUnansweredError(anyio.current_time() - started, [*errors, error]) from error
    raise AssertionError("unreachable: the retry loop returns or raises")


def _measured(reply: Reply, request: ChatRequest) -> Probe:
    if reply.finish_reason == "length":
        lands = "cut"
    elif reply.content:
        lands = "content"
    elif reply.reasoning and _is_json_object(reply.reasoning):
        lands = "reasoning"
    else:
        lands = "none"
    return Probe(
        prompt_tokens=reply.prompt_tokens or 0,
        completion_tokens=reply.completion_tokens or 0,
        reasoning_tokens=reply.reasoning_tokens,
        latency_s=reply.latency_s,
        lands=lands,
    )


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(orjson.loads(text.strip()), dict)
    except orjson.JSONDecodeError:
        return False


async def effort_probes(
    client: LLMClient,
    spec: JobSpec,
    policy: RetryPolicy,
    request: ChatRequest,
    measured: list[Probe],
    timeout_s: float,
) -> dict[str, int]:
    """Reasoning tokens at the job's effort (its probes') and at a contrasting one (one more probe):
    ``low`` for a job above it, ``medium`` for a job at or below it."""
    effort = spec.reasoning_effort
    own = [p.reasoning_tokens for p in measured if p.reasoning_tokens is not None]
    if effort is None or not own or effort not in _EFFORTS:
        return {}
    other = "medium" if _EFFORTS.index(effort) <= _EFFORTS.index("low") else "low"
    contrast = LLMClient(dataclasses.replace(client.settings, reasoning_effort=other))
    try:
        async with contrast:
            reply = await probe_reply(contrast, policy, request, timeout_s)
    except (PipelineError, ProbeUnansweredError):
        return {}
    if reply.reasoning_tokens is None:
        return {}
    return {effort: round(statistics.mean(own)), other: reply.reasoning_tokens}


def honored(efforts: dict[str, int]) -> bool | None:
    """Lower effort gave clearly fewer reasoning tokens (None: nothing to compare)."""
    if len(efforts) < 2:
        return None
    (_, low), (_, high) = sorted(efforts.items(), key=lambda item: _EFFORTS.index(item[0]))
    if high <= 0:
        return None
    return low < 0.8 * high
