"""How many tokens a request may ask for: never more than the endpoint's context leaves after the prompt,
and whether it fits at all.

The context length is the endpoint's (:attr:`pipeline.servers.endpoint.Endpoint.context_length`). The
prompt is counted by the server in every reply (``usage.prompt_tokens``): a record's later requests
that start with messages the server has counted use that count and estimate only what was added (a
re-ask's two messages). A prompt never counted is estimated from its size, conservatively: one token
per :data:`CHARS_PER_TOKEN` bytes of UTF-8 plus :data:`TOKENS_PER_MESSAGE` per message for the chat
template. Tokenizers use more characters per token on English prose and JSON schemas (SmolLM2's 3.7 on
the LinkedIn job's prompts), and counting bytes makes a character outside ASCII (an accent, CJK) weigh
more, so an estimate errs towards a smaller budget, not a refused request.

Only a request the estimate says could overflow (its prompt and budget past the context:
:func:`needs_count`) is counted exactly before it is sent, by the server (``POST /tokenize``): the
prompt of every other record is far enough from the context for the estimate. A prompt that alone
fills the context is :class:`TooLongError` (class ``too_long``) and is never sent; without a server
count, the estimate decides. When the estimate is wrong all the same, the server's 400 naming its
context corrects it (one retry, or ``too_long`` when the prompt alone does not fit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.errors import TooLongError
from pipeline.extraction.parse import grown_budget
from pipeline.servers.client import ChatMessage, ChatRequest, Reply

CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 8


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

    def __str__(self) -> str:
        return f"{self.tokens} tokens" if self.exact else f"about {self.tokens} tokens (estimated)"


@dataclass(frozen=True, slots=True)
class CountedPrompt:
    """A message list and the prompt tokens the server counted for it."""

    messages: tuple[ChatMessage, ...]
    tokens: int


def estimated_text_tokens(text: str) -> int:
    """At least as many tokens as tokenizers use for ``text``, on prose and JSON: its UTF-8 bytes / 3."""
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    return -(-size // CHARS_PER_TOKEN)


def estimated_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(estimated_text_tokens(message["content"]) + TOKENS_PER_MESSAGE for message in messages)


def prompt_count(messages: tuple[ChatMessage, ...], counted: CountedPrompt | None) -> PromptCount:
    """The prompt tokens of ``messages``: the server's count where it has one, else an estimate."""
    if counted is not None and messages[: len(counted.messages)] == counted.messages:
        added = messages[len(counted.messages) :]
        return PromptCount(counted.tokens + estimated_tokens(added), exact=not added)
    return PromptCount(estimated_tokens(messages), exact=False)


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


def needs_count(request: ChatRequest, context: int | None, prompt: PromptCount) -> bool:
    """Whether the server should count the prompt before the request goes: the estimate says the prompt
    and the budget could be past the context (its budget would be cut, or it may not fit at all)."""
    return context is not None and not prompt.exact and prompt.tokens + request.max_tokens > context


def fitted(
    request: ChatRequest, context: int | None, prompt: PromptCount, longest: LongestField | None = None
) -> ChatRequest:
    """``request`` asking for at most what ``context`` leaves after ``prompt``; a prompt that alone fills
    the context is a :class:`TooLongError` (the server's count where it gave one, else the estimate)."""
    if context is None:
        return request
    room = context - prompt.tokens
    if room >= request.max_tokens:
        return request
    if room >= 1:
        return dataclasses.replace(request, max_tokens=room)
    raise too_long(prompt, context, longest)


def too_long(prompt: PromptCount, context: int, longest: LongestField | None) -> TooLongError:
    """The ``too_long`` failure of a prompt that alone does not fit, with the numbers and what to do."""
    field = f"; most of it is field '{longest.name}' ({longest.chars:,} characters)" if longest else ""
    return TooLongError(
        f"{prompt_does_not_fit(prompt, context)}{field}: enable chunking (chunking: field: "
        f"{longest.name if longest else 'FIELD'}), raise the context (the server's --max-model-len), or "
        "shorten the field",
        tokens=prompt.tokens,
        context=context,
        exact=prompt.exact,
        field=longest.name if longest else None,
    )


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
    return (
        f"answer truncated at the end of the context: prompt {prompt} + budget {sent.max_tokens} "
        f"tokens of a context of {context}; it produced {reply.completion_tokens} completion tokens"
        f"{reasoning} (finish_reason={reply.finish_reason}); a larger budget does not fit: shorten the "
        "prompt, lower reasoning_effort, or use a server with a longer context"
    )
