"""Whether a record goes whole or in chunks (``chunking:``), and which chunks.

A record goes whole when its chunking field fits: with ``max_chunk_tokens: auto``, when its prompt and
``max_tokens`` fit the context (the smallest of the endpoints'); with a number, when the field is at
most that many tokens. The estimate (:mod:`pipeline.extraction.budget`) judges first, and only a record
it says does not fit is counted by the server (``POST /tokenize``): the whole prompt, and the prompt
with the field left empty; their difference is the field's tokens. So a record that fits is sent
exactly as without chunking.

A record that does not fit is split (:mod:`pipeline.extraction.splitting`) into chunks of at most
``max_chunk_tokens`` (auto: what the context leaves after ``max_tokens`` and the rest of the prompt,
less a quarter kept for what a later pass is told was found), made characters at the field's own
characters per token, with ``overlap_tokens`` of overlap. A server that cannot count leaves the
estimate, which makes chunks smaller, never too large; and as for a whole record, only the floor (one
token a word) refuses: a chunking the run cannot start with (a configuration error), or a record whose
other fields leave no room for a chunk (``too_long``). Where the estimate leaves less than the smallest
chunk and the floor does not, the chunks are of the smallest size, and the server's answers say the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import ConfigError, TooLongError, TransientError
from pipeline.extraction.budget import (
    PromptCount,
    estimated_text_tokens,
    estimated_tokens,
    fewest_tokens,
    fixed_part_count,
    fixed_part_full,
    fixed_part_leaves_no_room,
    prompt_floor,
)
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.splitting import Span, split_text
from pipeline.job.chunking import MIN_CHUNK_TOKENS, ChunkingSpec
from pipeline.servers.client import ChatMessage
from pipeline.servers.endpoint import Endpoint
from pipeline.source.reader import SourceRecord

#: Chunks are cut this much shorter than the field's characters per token say they may be: the rate
#: is the whole field's, and a chunk may be denser than the average.
CHARS_MARGIN = 0.95
#: With several passes, this share of a chunk's room is kept for the list of values found so far.
FOUND_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class DocumentPlan:
    """A long record's chunks: spans of ``text``, its ``field`` as sent."""

    field: str
    text: str
    spans: tuple[Span, ...]
    passes: int
    found_room: int  # tokens the list of values found so far may take in a later pass's request

    def chunk_text(self, index: int) -> str:
        span = self.spans[index]
        return self.text[span.start : span.end]


class ChunkPlanner:
    def __init__(
        self,
        chunking: ChunkingSpec,
        prompts: PromptBuilder,
        max_tokens: int,
        endpoints: Sequence[Endpoint],
        where: str,
    ) -> None:
        self._chunking = chunking
        self._prompts = prompts
        self._max_tokens = max_tokens
        self._endpoints = list(endpoints)
        self._where = where  # the job file, for a configuration error

    @property
    def context(self) -> int | None:
        """The smallest context of the endpoints that know theirs: every chunk must fit each of them."""
        known = [endpoint.context_length for endpoint in self._endpoints if endpoint.context_length]
        return min(known, default=None)

    def check(self) -> None:
        """At the start of a run, once the servers are checked: chunks of this size can fit at all."""
        chunking, context = self._chunking, self.context
        key = f"{self._where}: key 'chunking.max_chunk_tokens'"
        # The fixed part (system, examples, template) at its floor: only what certainly cannot fit stops
        # the run, whatever a server that cannot count would have said.
        bare = fewest_tokens(self._prompts.fixed_messages)
        if chunking.auto and context is None:
            raise ConfigError(
                f"{key}: auto fits chunks to the server's context, which the server does not list; "
                "give max_model_len in the job, or a number of tokens here"
            )
        if chunking.auto and context is not None and context - self._max_tokens - bare < MIN_CHUNK_TOKENS:
            raise ConfigError(
                f"{key}: auto leaves no room for a chunk: a context of {context:,} tokens less max_tokens "
                f"{self._max_tokens:,} less at least {bare:,} tokens of prompt (system, examples, "
                "template; one a word); lower max_tokens, raise the context, or give a number of tokens here"
            )
        size = chunking.max_chunk_tokens
        if isinstance(size, int) and context is not None and size + bare >= context:
            raise ConfigError(
                f"{key}: {size:,} tokens of chunk and at least {bare:,} of prompt do not fit a context of "
                f"{context:,} tokens; give fewer, or auto"
            )

    async def plan(self, record: SourceRecord) -> DocumentPlan | None:
        """None: the record goes whole. Raises :class:`TooLongError` when the rest of its prompt (its
        other fields) certainly leaves no room for a chunk."""
        field = self._chunking.field
        text = self._prompts.texts(record.fields)[field]
        whole = self._prompts.request_for(record.fields).messages
        if not self._too_long(text, whole):
            return None
        size, context = self._chunking.max_chunk_tokens, self.context
        prompt = await self._tokens(whole)
        if size == "auto" and context is not None and prompt.tokens + self._max_tokens <= context:
            return None
        rest_messages = self._prompts.request_for({**record.fields, field: ""}).messages
        rest = await self._tokens(rest_messages)
        field_tokens = max(1, prompt.tokens - rest.tokens)
        if isinstance(size, int):
            return None if field_tokens <= size else self._split(text, field_tokens, size)
        assert context is not None  # checked when the run started
        room = context - self._max_tokens - rest.tokens
        if room < MIN_CHUNK_TOKENS:
            floor = rest if rest.exact else prompt_floor(rest_messages, None)
            if context - self._max_tokens - floor.tokens < MIN_CHUNK_TOKENS:
                raise self._no_room(rest_messages, floor, context)
            room = MIN_CHUNK_TOKENS  # the estimate is past it, the floor is not: the smallest chunks
        return self._split(
            text, field_tokens, int(room * (1 - FOUND_SHARE)) if self._chunking.passes > 1 else room
        )

    def _no_room(
        self, rest_messages: tuple[ChatMessage, ...], rest: PromptCount, context: int
    ) -> TooLongError:
        """The ``too_long`` failure of a record whose prompt without its chunking field (``rest``)
        leaves no room for a chunk: what to shorten, unless the fixed part alone leaves none."""
        field = self._chunking.field
        fixed = fixed_part_count(self._prompts.fixed_messages, rest_messages, rest)
        where = f"in a context of {context:,} tokens with max_tokens {self._max_tokens:,}"
        if fixed_part_leaves_no_room(fixed, context):
            message = f"the prompt without field '{field}' is {rest} {where}, and {fixed_part_full(fixed)}"
        else:
            message = (
                f"the prompt without field '{field}' is {rest}, which leaves no room for a chunk of it "
                f"{where}: shorten the other fields, lower max_tokens, or raise the context"
            )
        return TooLongError(
            message, tokens=rest.tokens + self._max_tokens, context=context, exact=rest.exact, field=field
        )

    def _too_long(self, text: str, whole: tuple[ChatMessage, ...]) -> bool:
        """Whether the estimate says the field does not fit (then the server counts it)."""
        size = self._chunking.max_chunk_tokens
        if isinstance(size, int):
            return estimated_text_tokens(text) > size
        context = self.context
        return context is None or estimated_tokens(whole) + self._max_tokens > context

    def _split(self, text: str, field_tokens: int, room: int) -> DocumentPlan:
        chars_per_token = len(text) / field_tokens
        max_chars = max(1, int(room * chars_per_token * CHARS_MARGIN))
        overlap = int(self._chunking.overlap_tokens * chars_per_token)
        spans = tuple(split_text(text, max_chars, overlap))
        found_room = int(room * FOUND_SHARE / (1 - FOUND_SHARE))
        return DocumentPlan(self._chunking.field, text, spans, self._chunking.passes, found_room)

    async def _tokens(self, messages: tuple[ChatMessage, ...]) -> PromptCount:
        """The server's count (the first endpoint that is up), else the estimate."""
        endpoint = next((e for e in self._endpoints if e.health.up), self._endpoints[0])
        try:
            counted = await endpoint.client.count_tokens(messages)
        except TransientError:  # the estimate only makes chunks smaller: no reason to fail the record
            counted = None
        if counted is None:
            return PromptCount(estimated_tokens(messages), exact=False)
        return PromptCount(counted, exact=True)
