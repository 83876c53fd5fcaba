"""One record's state across the extractor's attempts: its first request and the next, what went where,
the server's count of its prompt, and what a ``too_long`` failure of it keeps for a later run.

A record whose prompt and answer cannot fit the context fails ``too_long`` with the server's count of
its prompt as first sent and, when an answer of it was cut off with all the room the context left, that
answer's tokens (the failures' ``counted_prompt_tokens`` and ``answer_cut_at``). A later run of the same
job on the same text starts the record from them (the source reader fetches them only then): a context
that still leaves too little refuses it unsent, a larger one sends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.errors import TooLongError
from pipeline.extraction.budget import CountedPrompt, PromptParts
from pipeline.extraction.outcomes import Usage
from pipeline.servers.client import ChatRequest
from pipeline.servers.endpoint import Endpoint
from pipeline.source.reader import RecordId, SourceRecord


@dataclass(slots=True)
class RecordState:
    record_id: RecordId
    first: ChatRequest
    request: ChatRequest  # the next request, before it is fitted to an endpoint's context
    parts: PromptParts  # its longest field and the fixed part, for a too_long failure
    attempts: int = 0
    last_raw_output: str | None = None
    usage: Usage = field(default_factory=Usage)
    sent: ChatRequest | None = None  # the last request sent, as fitted (the next one may be larger)
    endpoint: Endpoint | None = None  # where the last request went
    counted: CountedPrompt | None = None  # the server's count of a prompt this record sent
    refused_for_context: bool = False  # a 400 about the context: the next one is not retried
    answer_cut_at: int | None = None  # an answer of it was cut off there, all the context left it

    @classmethod
    def of(cls, record: SourceRecord, first: ChatRequest, parts: PromptParts) -> RecordState:
        """A record about to be sent as ``first``, with what an earlier ``too_long`` failure of it knew
        (``first`` must be the request that failure's count was of: the record's own, whole)."""
        tokens = record.counted_prompt_tokens
        earlier = CountedPrompt(first.messages, tokens, earlier=True) if tokens else None
        return cls(record.id, first, first, parts, counted=earlier, answer_cut_at=record.answer_cut_at)

    @property
    def sent_max_tokens(self) -> int:
        return self.sent.max_tokens if self.sent is not None else 0

    def fit_kept(self, error: TooLongError) -> tuple[int | None, int | None]:
        """What its ``too_long`` failure keeps: the server's count of the first request's prompt, and
        the tokens an answer was cut off at (this run's, else an earlier one's)."""
        counted = self.counted
        tokens = counted.tokens if counted is not None and counted.messages == self.first.messages else None
        return tokens, error.answer_cut_at if error.answer_cut_at is not None else self.answer_cut_at
