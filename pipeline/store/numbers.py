"""One run's numbers in one typed record (:class:`RunNumbers`): every count its row in the runs table
holds, and the numbers derived from them, each computed here once.

A run adds to it as it goes (:mod:`pipeline.run.stats` holds the live one: a request as it is sent, a
reply's tokens as they come, a record as its outcome commits) and writes it to its row with every
commit and once more at its end, after its workers stopped; the progress line, the snapshot, the
summary line, Prometheus, ``status`` and ``report`` read it back and ask it the derived numbers.

The runs table's counter columns and the UPDATE that writes them are derived from the fields (their
names, and their types as SQL), so a field added here is a column (added to an older database when it
is opened, :mod:`pipeline.store.tables`), written, read back by :meth:`RunNumbers.of`, and in the
snapshot, ``status --json``, ``report --json`` and the library's summary.

* records/min: the records the run finished over its own time, from its start to its last commit (or
  to now, while it runs) and, once it ended, to its end (:attr:`RunNumbers.elapsed_s`).
* attempts: every request sent, counted as it is sent, so a run that was aborted or cancelled counts
  the requests it cancelled too: what the servers counted.
* remaining: what this run set out to do and has not finished; backlog: the records of the job that
  its options select and that are still pending, whatever its ``--limit`` (after a plain run, what
  ``status`` calls pending).
* blank: the records its options select that it set aside unsent, every prompt field empty (after a
  plain run, what ``status`` calls blank).
* too_long_unsent: of its records failed ``too_long``, those it never sent (a count of the prompt said
  it cannot fit the context). With blank, the records a run did not send: each said wherever the other
  is (the runs row, the summary, ``report``'s table, Prometheus).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import typing
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.errors import FailureClass
from pipeline.extraction.outcomes import ChunkDone, Extracted, Failed, Stored

#: The kinds of tokens a reply's usage counts, as :attr:`RunNumbers.tokens_per_done` names them.
TOKEN_KINDS = ("prompt", "completion", "reasoning")


@dataclass(slots=True)
class RunNumbers:
    """Every count of one run, as its runs row holds them."""

    pending_at_start: int = 0  # what the run set out to do: what its options select, at most --limit
    backlog_at_start: int = 0  # what its options select, --limit aside: the job's backlog as it began
    # What its options select that has nothing to extract from (every prompt field empty): set aside,
    # never sent, in neither count above (pipeline.source.blank); --limit aside too.
    blank: int = 0
    done: int = 0  # records extracted and committed
    failed: int = 0  # records committed as failed
    failures: dict[str, int] = field(default_factory=dict)  # the failed, by class
    # Of the failed too_long, those never sent: a count (the server's, in this run or an earlier one,
    # or one token a word) said they cannot fit the context.
    too_long_unsent: int = 0
    chunks_done: int = 0  # chunks of long records (chunking:) answered and committed
    attempts: int = 0  # every request sent, as it was sent: failed, re-asked and cancelled ones too
    retries: dict[str, int] = field(default_factory=dict)  # requests repeated, by cause
    timeouts: int = 0  # requests that timed out
    prompt_tokens: int = 0  # every reply's, as the server counted them
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    elapsed_s: float = 0.0  # the run's own time: from its start to its last commit, or to its end
    # The servers' prefix cache and preemptions since the run began (None: their /metrics did not say).
    prefix_cache_hit_rate: float | None = None  # prompt tokens from the cache over those looked up
    prefix_cache_queries: int | None = None  # prompt tokens looked up
    prefix_cache_reachable: float | None = None  # the most it could be: the shared prefix over the prompt
    preemptions: int | None = None
    # Results whose answer came in the reply's reasoning field, content null (vLLM issue 23694): taken.
    answers_from_reasoning: int = 0

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> RunNumbers:
        """From a runs row, a snapshot or their JSON: the fields it has (an older row lacks the newer,
        or has NULL there: their default); the time from its timestamps when it kept none."""
        known = {name: row[name] for name in _TYPES if row.get(name) is not None}
        numbers = cls(**{name: _value(value, _TYPES[name]) for name, value in known.items()})
        if "elapsed_s" not in known:
            ended = row.get("ended_at") or row.get("updated_at")
            numbers.elapsed_s = _seconds_between(row.get("started_at"), ended)
        return numbers

    def copy(self) -> RunNumbers:
        return dataclasses.replace(self, failures=dict(self.failures), retries=dict(self.retries))

    def add(self, outcome: Stored) -> None:
        """Count a committed outcome: a record done or failed, or a chunk of one."""
        if isinstance(outcome, ChunkDone):
            self.chunks_done += 1
        elif isinstance(outcome, Failed):
            self.failed += 1
            _increment(self.failures, str(outcome.failure_class))
            self.too_long_unsent += outcome.failure_class is FailureClass.TOO_LONG and not outcome.attempts
        elif isinstance(outcome, Extracted):
            self.done += 1
            self.answers_from_reasoning += outcome.from_reasoning

    def plus(self, outcomes: Iterable[Stored]) -> RunNumbers:
        """A copy with ``outcomes`` counted: what the row says once they are committed."""
        numbers = self.copy()
        for outcome in outcomes:
            numbers.add(outcome)
        return numbers

    def made_transient(self, changed: Counter[str]) -> None:
        """Failures of these classes (and counts) were made transient after they were counted (the
        answer breaker's window: a plain run does them again)."""
        for failure_class, count in changed.items():
            self.failures[failure_class] = self.failures.get(failure_class, 0) - count
            if self.failures[failure_class] <= 0:
                del self.failures[failure_class]
        if changed.total():
            self.failures["transient"] = self.failures.get("transient", 0) + changed.total()

    @property
    def finished(self) -> int:
        return self.done + self.failed

    @property
    def remaining(self) -> int:
        """What this run set out to do and has not finished."""
        return max(0, self.pending_at_start - self.finished)

    @property
    def backlog(self) -> int:
        """The records its options select still pending: those it did not finish, and those that
        failed transiently (a plain run takes them again)."""
        left = self.done + self.failed - self.failures.get("transient", 0)
        return max(0, self.backlog_at_start - left)

    @property
    def records_per_min(self) -> float:
        """The records finished over the run's own time (0 before any time passed)."""
        return self.finished * 60.0 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_per_done(self) -> dict[str, float] | None:
        """What a done record cost: every reply's prompt, completion and reasoning tokens, as the server
        counted them (re-asks, retries and the requests of records that failed included), over the
        records done; None before one is done. The one per-record token figure: status, report and
        drift read it."""
        if self.done <= 0:
            return None
        spent = (self.prompt_tokens, self.completion_tokens, self.reasoning_tokens)
        return {name: tokens / self.done for name, tokens in zip(TOKEN_KINDS, spent, strict=True)}

    @property
    def output_tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def seconds_for(self, records: int) -> float | None:
        """How long ``records`` more take at this run's rate (None: no rate yet)."""
        rate = self.records_per_min
        return records * 60.0 / rate if rate > 0 else None

    @property
    def eta_s(self) -> float | None:
        """How long what remains of this run takes at its rate."""
        return self.seconds_for(self.remaining)

    def to_json(self) -> dict[str, Any]:
        """Every field, and the derived numbers (the snapshot's, ``status --json``'s, the summary's)."""
        eta = self.eta_s
        return {
            **{name: getattr(self, name) for name in _TYPES},
            "finished": self.finished,
            "remaining": self.remaining,
            "backlog": self.backlog,
            "records_per_min": self.records_per_min,
            "output_tokens_per_s": self.output_tokens_per_s,
            "tokens_per_done": self.tokens_per_done,
            "eta_s": None if eta is None else round(eta),
        }

    def row_values(self) -> list[Any]:
        """The values of :data:`RUN_NUMBER_COLUMNS`, in their order, as DuckDB takes them."""
        return [_stored(getattr(self, name)) for name in _TYPES]


def _stored(value: Any) -> Any:
    return orjson.dumps(value).decode() if isinstance(value, dict) else value


def _value(value: Any, kind: Any) -> Any:
    if kind == dict[str, int]:
        loaded = orjson.loads(value) if isinstance(value, str | bytes) else value
        return {str(key): int(count) for key, count in loaded.items()} if isinstance(loaded, dict) else {}
    if kind in (float, float | None):
        return float(value)
    return int(value)


def _increment(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _seconds_between(start: Any, end: Any) -> float:
    if isinstance(start, str):
        start = dt.datetime.fromisoformat(start)
    if isinstance(end, str):
        end = dt.datetime.fromisoformat(end)
    if not isinstance(start, dt.datetime) or not isinstance(end, dt.datetime):
        return 0.0
    return max(0.0, (end - start).total_seconds())


#: A field's type as the runs table's column type. An int counts from 0; None is "not known".
_SQL_TYPES: Mapping[Any, str] = {
    int: "BIGINT DEFAULT 0",
    float: "DOUBLE",  # no default: an older row's NULL says the time is its timestamps'
    int | None: "BIGINT",
    float | None: "DOUBLE",
    dict[str, int]: "JSON",
}


def field_types(record: type[Any]) -> dict[str, Any]:
    """The fields of a dataclass ``record`` and their types, in order."""
    hints = typing.get_type_hints(record)
    return {field.name: hints[field.name] for field in dataclasses.fields(record)}


def columns_of(record: type[Any]) -> list[tuple[str, str]]:
    """(name, SQL type) of each field: a type with no column type is refused, naming the field."""
    columns = []
    for name, kind in field_types(record).items():
        if kind not in _SQL_TYPES:
            raise TypeError(
                f"{record.__name__}.{name}: {kind} has no column type (one of {list(_SQL_TYPES)})"
            )
        columns.append((name, _SQL_TYPES[kind]))
    return columns


_TYPES: Mapping[str, Any] = field_types(RunNumbers)
#: The runs table's counter columns, one per field: (name, SQL type).
RUN_NUMBER_COLUMNS: list[tuple[str, str]] = columns_of(RunNumbers)
#: ``SET`` of an UPDATE that writes every field (parameters: :meth:`RunNumbers.row_values`).
RUN_NUMBER_ASSIGNMENTS = ", ".join(f"{name} = ?" for name, _ in RUN_NUMBER_COLUMNS)
