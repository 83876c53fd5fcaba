"""How many tokens a request may ask for: never more than the endpoint's context leaves after the prompt.

The context length is the endpoint's (:attr:`pipeline.servers.endpoint.Endpoint.context_length`). The
prompt is counted by the server in every reply (``usage.prompt_tokens``): a record's later requests
that start with messages the server has counted use that count and estimate only what was added (a
re-ask's two messages). A prompt never counted is estimated from its characters, conservatively: one
token per :data:`CHARS_PER_TOKEN` characters plus :data:`TOKENS_PER_MESSAGE` per message for the chat
template. Tokenizers use more characters per token on English prose and JSON schemas (SmolLM2's 3.7 on
the LinkedIn job's prompts), so an estimate errs towards a smaller budget, not a refused request; when
it is wrong all the same, the server's 400 naming its context corrects it (one retry).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import ContextFullError
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


def estimated_tokens(messages: Sequence[ChatMessage]) -> int:
    return sum(-(-len(message["content"]) // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE for message in messages)


def prompt_count(messages: tuple[ChatMessage, ...], counted: CountedPrompt | None) -> PromptCount:
    """The prompt tokens of ``messages``: the server's count where it has one, else an estimate."""
    if counted is not None and messages[: len(counted.messages)] == counted.messages:
        added = messages[len(counted.messages) :]
        return PromptCount(counted.tokens + estimated_tokens(added), exact=not added)
    return PromptCount(estimated_tokens(messages), exact=False)


def fitted(request: ChatRequest, context: int | None, prompt: PromptCount) -> ChatRequest:
    """``request`` asking for at most what ``context`` leaves after ``prompt``; a prompt the server
    counted that alone fills the context is a :class:`ContextFullError`. When only the estimate says
    so, the request goes with at most the context as its budget and the server's count decides (it
    answers, or refuses with a 400 naming its numbers)."""
    if context is None:
        return request
    room = context - prompt.tokens
    if room >= request.max_tokens:
        return request
    if room >= 1:
        return dataclasses.replace(request, max_tokens=room)
    if prompt.exact:
        raise ContextFullError(prompt_does_not_fit(prompt, context))
    return dataclasses.replace(request, max_tokens=min(request.max_tokens, context))


def no_room_to_grow(sent: ChatRequest, context: int | None, prompt: PromptCount) -> bool:
    """Whether a request that came back truncated already had all the context leaves its prompt."""
    return context is not None and sent.max_tokens >= context - prompt.tokens


def prompt_does_not_fit(prompt: PromptCount, context: int) -> str:
    return (
        f"the prompt alone does not fit the context: {prompt} against a context of {context} tokens "
        "(the server's max_model_len); shorten the record's text or use a server with a longer context"
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
