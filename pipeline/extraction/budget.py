"""How many tokens a request may ask for: never more than the endpoint's context leaves after the prompt,
and whether it fits at all.

The context length is the endpoint's (:attr:`pipeline.servers.endpoint.Endpoint.context_length`). The
prompt is counted by the server in every reply (``usage.prompt_tokens``): a record's later requests
that start with messages the server has counted use that count and estimate only what was added (a
re-ask's two messages). A prompt never counted is judged from its text, two ways:

* the estimate, for the budget: one token per :data:`CHARS_PER_TOKEN` bytes of UTF-8 plus
  :data:`TOKENS_PER_MESSAGE` per message for the chat template. Tokenizers use more characters per
  token on English prose and JSON schemas (SmolLM2's 3.7 on the LinkedIn job's prompts), and counting
  bytes makes a character outside ASCII weigh more, so a budget errs towards smaller, not refused;
* the floor, for refusing: one token a word (:func:`fewest_tokens`). Tokenizers split text at
  whitespace before they merge (byte-level BPE's pre-tokenizer, SentencePiece's default), so no token
  spans two words, whatever their characters; a count of characters bounds nothing (a run of 500 '='
  or of spaces can be one token). A prompt is refused unsent only when it certainly does not fit.

Only a request the estimate says could overflow (its prompt and budget past the context:
:func:`needs_count`) is counted exactly before it is sent, by the server (``POST /tokenize``): the
prompt of every other record is far enough from the context for the estimate. A prompt the server's
count, or its floor, puts past the context is :class:`TooLongError` (class ``too_long``) and is never
sent. Without a server count (a proxy or a router without ``/tokenize``), a prompt the estimate puts
past the context but its floor does not is sent with what the floor leaves: the server's answer then
says (its 400 names the prompt's tokens: retried once with the budget that fits, or ``too_long`` when
the prompt alone does not fit; newer vLLM, as the bundled 0.32, cuts the budget itself).

Behind such a proxy the estimate would starve what fits: it errs towards more tokens, and a prompt 1,000
tokens short of a 4,096 context is estimated at about its end. So a prompt never counted is estimated
at the rate the run learned from the server's counts (:class:`~pipeline.extraction.calibration.
Calibration`), and no budget the estimate cuts is sent before the run has learned that rate, nor one
the context cuts below what an answer needs (:meth:`~pipeline.extraction.calibration.Calibration.
answer_need`): on an estimate, the request waits for the run to learn its rate (:func:`starved`), and
with nothing to learn from goes with what its floor leaves, so that the server's answer or its 400
counts it; on the server's count, the record is ``too_long`` with both numbers
(:func:`no_room_for_answer`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.errors import TooLongError
from pipeline.extraction.calibration import AnswerNeed, Calibration
from pipeline.extraction.parse import grown_budget
from pipeline.job.chunking import MIN_CHUNK_TOKENS
from pipeline.servers.client import ChatMessage, ChatRequest
from pipeline.servers.replies import Reply

CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 8
#: How a floor of one token a word is named in a message.
ONE_A_WORD = "one a word"
#: How a message names a count the server made in an earlier run (kept by the record's failure).
COUNTED_EARLIER = " (the server's count in an earlier run)"
#: Said early in a ``too_long`` message when the fixed part of the prompt leaves no room (``pipeline
#: failures`` looks for it in the messages, which it cuts to 200 characters).
FIXED_PART_FULL = "chunking cannot help"
#: What to do then.
FIXED_PART_ADVICE = (
    "shorten the system prompt or the examples, or use a larger context (the server's --max-model-len)"
)


@dataclass(frozen=True, slots=True)
class BudgetGrowth:
    """How a truncated record's budget grows: ``retry.truncation_growth`` up to ``max_tokens_ceiling``
    (and, when it is sent, never past what the context leaves: :func:`fitted`)."""

    factor: float
    ceiling: int

    def after(self, max_tokens: int) -> int:
        return grown_budget(max_tokens, self.factor, self.ceiling)


@dataclass(frozen=True, slots=True)
class PromptCount:
    tokens: int
    exact: bool  # counted by the server, not estimated
    floor: str | None = None  # a floor (the prompt has no fewer tokens), and why: ONE_A_WORD, the server's
    earlier: bool = False  # counted by the server in an earlier run (its too_long failure kept the count)

    def __str__(self) -> str:
        if self.exact:
            return f"{self.tokens} tokens{COUNTED_EARLIER if self.earlier else ''}"
        if self.floor is not None:
            return f"at least {self.tokens} tokens ({self.floor})"
        return f"about {self.tokens} tokens (estimated)"

    @property
    def certain(self) -> bool:
        """Whether a prompt of this count certainly has at least this many tokens."""
        return self.exact or self.floor is not None


@dataclass(frozen=True, slots=True)
class CountedPrompt:
    """A message list and the prompt tokens the server counted for it (``earlier``: in an earlier run,
    for the same text and job)."""

    messages: tuple[ChatMessage, ...]
    tokens: int
    earlier: bool = False


def estimated_text_tokens(text: str) -> int:
    """At least as many tokens as tokenizers use for ``text``, on prose and JSON: its UTF-8 bytes / 3."""
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    return -(-size // CHARS_PER_TOKEN)


def estimated_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(estimated_text_tokens(message["content"]) + TOKENS_PER_MESSAGE for message in messages)


def fewest_tokens(messages: Sequence[ChatMessage]) -> int:
    """The fewest tokens any tokenizer that splits at whitespace makes of ``messages``: one a word (and
    none for the chat template, which may add none)."""
    return sum(len(message["content"].split()) for message in messages)


def prompt_count(
    messages: tuple[ChatMessage, ...], counted: CountedPrompt | None, calibration: Calibration | None = None
) -> PromptCount:
    """The prompt tokens of ``messages``: the server's count where it has one, else an estimate (at the
    run's learned rate, given its ``calibration``)."""
    if counted is not None and messages[: len(counted.messages)] == counted.messages:
        added = messages[len(counted.messages) :]
        if not added:
            return PromptCount(counted.tokens, exact=True, earlier=counted.earlier)
        return PromptCount(counted.tokens + estimated_tokens(added), exact=False)
    estimate = estimated_tokens(messages)
    return PromptCount(calibration.scaled(estimate) if calibration else estimate, exact=False)


def prompt_floor(messages: tuple[ChatMessage, ...], counted: CountedPrompt | None) -> PromptCount:
    """The fewest tokens ``messages`` can be: the server's count where it has one, one a word for the rest."""
    if counted is not None and messages[: len(counted.messages)] == counted.messages:
        added = messages[len(counted.messages) :]
        if not added:
            return PromptCount(counted.tokens, exact=True, earlier=counted.earlier)
        return PromptCount(counted.tokens + fewest_tokens(added), exact=False, floor=ONE_A_WORD)
    return PromptCount(fewest_tokens(messages), exact=False, floor=ONE_A_WORD)


@dataclass(frozen=True, slots=True)
class LongestField:
    """The prompt field with the most text: what made a prompt long."""

    name: str
    chars: int


def longest_field(texts: Mapping[str, str]) -> LongestField | None:
    """The longest of a record's prompt fields as sent (``None`` without fields)."""
    if not texts:
        return None
    name = max(texts, key=lambda field: len(texts[field]))
    return LongestField(name, len(texts[name]))


@dataclass(frozen=True, slots=True)
class PromptParts:
    """What a prompt is made of, for a ``too_long`` failure to say what to do: the record's longest field,
    and the fixed part every record sends (system prompt, examples, the template with no fields)."""

    longest: LongestField | None
    fixed: tuple[ChatMessage, ...] = ()


def needs_count(request: ChatRequest, context: int | None, prompt: PromptCount) -> bool:
    """Whether the server should count the prompt before the request goes: the estimate says the prompt
    and the budget could be past the context (its budget would be cut, or it may not fit at all)."""
    return context is not None and not prompt.exact and prompt.tokens + request.max_tokens > context


def fitted(
    request: ChatRequest,
    context: int | None,
    counted: CountedPrompt | None,
    parts: PromptParts | None = None,
    calibration: Calibration | None = None,
    need: AnswerNeed | None = None,
    *,
    may_be_refused: bool = True,
) -> ChatRequest:
    """``request`` asking for at most what ``context`` leaves after its prompt (``counted``: the
    server's count of it, or of the messages it starts with; else the estimate at ``calibration``'s
    rate). A budget cut below ``need`` (what an answer needs), or cut by the estimate before the run
    has learned the server's rate, is not sent: where the prompt was only estimated and its floor
    leaves enough, it is sent with what the floor leaves (the server's answer or its 400 then counts
    the prompt); where the count (or the floor) certainly leaves less, it is a :class:`TooLongError`:
    the prompt alone does not fit, or leaves no room for an answer. ``may_be_refused`` false (a record
    already refused for the context, whose next 400 is not retried): an unlearned estimate's budget
    goes as it is, as an answer cut off by it is asked again with what the reply counted."""
    if context is None:
        return request
    prompt = prompt_count(request.messages, counted, calibration)
    room = context - prompt.tokens
    if room >= request.max_tokens:
        return request
    least = _least_budget(request, need)
    unsound = may_be_refused and not _rate_known(calibration)
    if not prompt.exact and (room < least or unsound):
        prompt = prompt_floor(request.messages, counted)
        room = context - prompt.tokens
    if room >= least:
        return dataclasses.replace(request, max_tokens=min(room, request.max_tokens))
    parts = parts or PromptParts(None)
    if room < 1 or need is None:
        raise too_long(prompt, context, parts, request.messages)
    raise no_room_for_answer(prompt, context, f"and an answer needs {need}", parts, request.messages)


def starved(
    request: ChatRequest,
    context: int | None,
    counted: CountedPrompt | None,
    calibration: Calibration,
    need: AnswerNeed,
) -> bool:
    """Whether only the estimate (not the server's count) cuts ``request``'s budget, and the run cannot
    trust the cut yet: below ``need``, or at all before the run has learned the server's rate. It waits
    for the run to learn the rate (:meth:`Calibration.wait_to_learn`) before it goes."""
    if context is None:
        return False
    prompt = prompt_count(request.messages, counted, calibration)
    room = context - prompt.tokens
    if prompt.exact or room >= request.max_tokens:
        return False
    return room < _least_budget(request, need) or not calibration.learned


def _rate_known(calibration: Calibration | None) -> bool:
    """Whether a budget cut by the estimate may be sent as it is: the estimate is at the server's rate
    (or the caller keeps no rate). The plain estimate is a third too many on the LinkedIn job's prompts:
    a prompt 1,080 tokens short of a 4,096 context got 26-175, and its answer was cut off."""
    return calibration is None or calibration.learned


def _least_budget(request: ChatRequest, need: AnswerNeed | None) -> int:
    """The smallest budget ``request`` is sent with, cut to fit: what an answer needs (never more than
    the request asks for), or at least a token."""
    return max(1, min(need.tokens, request.max_tokens)) if need is not None else 1


def too_long(
    prompt: PromptCount, context: int, parts: PromptParts, messages: tuple[ChatMessage, ...]
) -> TooLongError:
    """The ``too_long`` failure of a prompt that alone does not fit, with the numbers and what to do:
    chunking the longest field, unless the fixed part alone leaves no room for a chunk."""
    return _too_long(prompt_does_not_fit(prompt, context), prompt, context, parts, messages)


def no_room_for_answer(
    prompt: PromptCount,
    context: int,
    answer: str,
    parts: PromptParts,
    messages: tuple[ChatMessage, ...],
    answer_cut_at: int | None = None,
) -> TooLongError:
    """The ``too_long`` failure of a prompt that fits but leaves less of the context than an answer
    needs: the prompt, what it leaves, ``answer`` (what an answer needs, or how one was cut off: at
    ``answer_cut_at`` tokens), and what to do. Not the server's answers at fault, so not ``truncated``."""
    head = (
        f"the prompt leaves too little of the context for an answer: {prompt} of a context of {context} "
        f"tokens (the server's max_model_len) leaves {'' if prompt.exact else 'at most '}"
        f"{context - prompt.tokens} tokens for the answer, {answer}"
    )
    return _too_long(head, prompt, context, parts, messages, answer_cut_at)


def _too_long(
    head: str,
    prompt: PromptCount,
    context: int,
    parts: PromptParts,
    messages: tuple[ChatMessage, ...],
    answer_cut_at: int | None = None,
) -> TooLongError:
    longest = parts.longest
    fixed = fixed_part_count(parts.fixed, messages, prompt) if parts.fixed else None
    if fixed is not None and fixed_part_leaves_no_room(fixed, context):
        advice = f", and {fixed_part_full(fixed)}"
    else:
        field = f"; most of it is field '{longest.name}' ({longest.chars:,} characters)" if longest else ""
        advice = (
            f"{field}: enable chunking (chunking: field: {longest.name if longest else 'FIELD'}), raise "
            "the context (the server's --max-model-len), or shorten the field"
        )
    return TooLongError(
        f"{head}{advice}",
        tokens=prompt.tokens,
        context=context,
        exact=prompt.exact,
        field=longest.name if longest else None,
        answer_cut_at=answer_cut_at,
    )


def fixed_part_leaves_no_room(fixed: PromptCount, context: int) -> bool:
    """Whether the fixed part leaves less than the smallest chunk of a record: no split of it fits."""
    return fixed.tokens > context - MIN_CHUNK_TOKENS


def fixed_part_full(fixed: PromptCount) -> str:
    """What a ``too_long`` message says of a fixed part that leaves no room, and what to do."""
    return (
        f"{FIXED_PART_FULL}: its fixed part (system prompt, examples, template: what every record sends) "
        f"is {fixed} of it; {FIXED_PART_ADVICE}"
    )


def fixed_part_count(
    fixed: tuple[ChatMessage, ...], messages: tuple[ChatMessage, ...], prompt: PromptCount
) -> PromptCount:
    """The fixed part's tokens in a prompt of ``messages``: where the server counted the prompt, its
    count scaled by the fixed part's share of the estimate (the server's own rate on this text); else
    its floor."""
    if prompt.exact:
        share = estimated_tokens(fixed) / max(1, estimated_tokens(messages))
        return PromptCount(round(prompt.tokens * share), exact=False)
    return PromptCount(fewest_tokens(fixed), exact=False, floor=ONE_A_WORD)


def cut_by_the_estimate(
    reply: Reply,
    sent: ChatRequest,
    asked: int,
    context: int | None,
    prompt: PromptCount,
    parts: PromptParts,
) -> bool:
    """Whether an answer was cut off with a budget only the estimate cut below the ``asked`` one (the
    job's): the server's count of the prompt (``prompt``) leaves more, so it is asked again, fitted to
    that. A budget the context cut that had all the count leaves is :class:`TooLongError`: an answer
    does not fit beside the prompt, the record's fit, not the server's answer (never ``truncated``)."""
    if context is None or sent.max_tokens >= asked:
        return False
    if context - prompt.tokens > sent.max_tokens:
        return True
    answer = cut_off_below_the_job(reply, asked)
    raise no_room_for_answer(prompt, context, answer, parts, sent.messages, reply.completion_tokens)


def no_room_to_grow(sent: ChatRequest, context: int | None, prompt: PromptCount) -> bool:
    """Whether a request that came back truncated already had all the context leaves its prompt."""
    return context is not None and sent.max_tokens >= context - prompt.tokens


def prompt_does_not_fit(prompt: PromptCount, context: int) -> str:
    return (
        f"the prompt alone does not fit the context: {prompt} against a context of {context} tokens "
        "(the server's max_model_len)"
    )


def cut_off_at_context(reply: Reply, sent: ChatRequest, prompt: PromptCount, context: int) -> str:
    """The numbers of an answer cut off with every token the context left it."""
    reasoning = f", {reply.reasoning_tokens} of them reasoning" if reply.reasoning_tokens else ""
    budget = min(sent.max_tokens, context - prompt.tokens)  # a server that cuts the budget to fit (vLLM)
    return (
        f"answer truncated at the end of the context: prompt {prompt} + budget {budget} "
        f"tokens of a context of {context}; it produced {reply.completion_tokens} completion tokens"
        f"{reasoning} (finish_reason={reply.finish_reason}); a larger budget does not fit: shorten the "
        "prompt, lower reasoning_effort, or use a server with a longer context"
    )


def cut_off_below_the_job(reply: Reply, max_tokens: int) -> str:
    """How an answer ended that was cut off with a budget the context cut below the job's ``max_tokens``
    (the end of :func:`no_room_for_answer`'s message)."""
    reasoning = f", {reply.reasoning_tokens} of them reasoning" if reply.reasoning_tokens else ""
    return (
        f"and the answer was cut off there ({reply.completion_tokens} completion tokens{reasoning}, "
        f"finish_reason={reply.finish_reason}), short of the job's max_tokens {max_tokens:,}"
    )
