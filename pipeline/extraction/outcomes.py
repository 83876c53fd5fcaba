"""What a worker hands the store writer for each record: a result or a classified failure."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import FailureClass
from pipeline.servers.client import Reply
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


Outcome = Extracted | Failed
