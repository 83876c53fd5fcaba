"""What a worker hands the store writer for each record: a result or a classified failure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.errors import FailureClass
from pipeline.llm import Reply

RecordId = int | str


@dataclass(frozen=True, slots=True)
class SourceRecord:
    id: RecordId
    fields: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Extracted:
    record_id: RecordId
    data_json: str
    attempts: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class Failed:
    record_id: RecordId
    failure_class: FailureClass
    message: str
    attempts: int
    last_raw_output: str | None


Outcome = Extracted | Failed
