"""What a worker hands the store writer for each record: a result or a classified failure; and, for a
long record extracted in chunks, each chunk as it finishes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.errors import FailureClass
from pipeline.servers.replies import Reply

if TYPE_CHECKING:  # a name for annotations only: the reader module would load DuckDB
    from pipeline.source.reader import RecordId


@dataclass(slots=True)
class Usage:
    """What one record cost over all its attempts: every reply's tokens, every request's time."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    latency_s: float = 0.0

    def add_reply(self, reply: Reply) -> None:
        self.prompt_tokens += reply.prompt_tokens or 0
        self.completion_tokens += reply.completion_tokens or 0
        self.reasoning_tokens += reply.reasoning_tokens or 0

    def __add__(self, other: Usage) -> Usage:
        """Both costs together (a long record's chunks: ``sum(usages, Usage())``)."""
        return Usage(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.latency_s + other.latency_s,
        )


@dataclass(frozen=True, slots=True)
class Extracted:
    record_id: RecordId
    data_json: str
    attempts: int
    reply: Reply  # the last attempt's
    usage: Usage  # all attempts'
    max_tokens: int  # the last attempt's budget
    content_hash: int | None = None
    grounding_json: str | None = None  # where each grounded value is in the record's text
    model: str | None = None  # the model of the endpoint that answered (default: the job's)
    # Merged from a long record's chunks: what they were (JSON, the results' ``chunks`` column). Its
    # requests and tokens were counted in the run as each chunk finished (:class:`ChunkDone`).
    chunking_json: str | None = None
    # The answer came in the reply's reasoning field, content null (gpt-oss under structured output,
    # vLLM issue 23694): taken, and marked (the results' ``answer_from_reasoning`` column).
    from_reasoning: bool = False

    @property
    def chunked(self) -> bool:
        return self.chunking_json is not None


@dataclass(frozen=True, slots=True)
class Failed:
    record_id: RecordId
    failure_class: FailureClass
    message: str
    attempts: int
    last_raw_output: str | None
    usage: Usage
    max_tokens: int  # the last attempt's budget
    content_hash: int | None = None
    model: str | None = None
    chunked: bool = False  # a long record that failed in one of its chunks
    # A record too long for the context: the server's count of its prompt as first sent, and the tokens
    # its answer was cut off at with all the room the context left. A later run of the same job on the
    # same text judges its fit from them without sending it (the failures' columns of those names).
    counted_prompt_tokens: int | None = None
    answer_cut_at: int | None = None


Outcome = Extracted | Failed


@dataclass(frozen=True, slots=True)
class ChunkDone:
    """One chunk of a long record answered in one pass, kept (the chunks table) as soon as it is done,
    so a run stopped mid-document resumes without asking for it again. ``result`` is the chunk's own
    answer; its grounding offsets are in the whole field, not the chunk."""

    record_id: RecordId
    pass_: int  # 1-based
    chunk: int  # 1-based
    chunks: int
    start: int  # the chunk is field[start:end]
    end: int
    result: Extracted


#: What the store writer keeps: a record's outcome, or a finished chunk of one.
Stored = Outcome | ChunkDone
