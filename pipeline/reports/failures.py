"""``pipeline failures``: a job's failures table summarised by failure class, with a few examples each.

Only a handful of rows per class ever reach Python (a window function picks them in DuckDB), and the
raw outputs are cut in SQL, so a table of a million failures with megabyte replies reads in a blink.
An example's message is read whole (the JSON gives it as stored); the text shows it on one line.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.defaults import class_names
from pipeline.errors import ConfigError, FailureClass
from pipeline.extraction.budget import FIXED_PART_ADVICE, FIXED_PART_FULL
from pipeline.job.spec import JobSpec
from pipeline.reports.variants import check_variant
from pipeline.source.db import Database, quote
from pipeline.store.opening import open_job_output
from pipeline.store.read_copy import ReadCopy, read_copy_of

MESSAGE_CHARS = 200
#: What to do about a class, where retrying as it is would fail the same way (said by `failures`).
ADVICE: dict[str, str] = {
    FailureClass.TOO_LONG: (
        "the prompt does not fit the model's context, or leaves too little of it for an answer (not sent, "
        "or sent and its answer cut off where the context ends: each message says which, with the "
        "numbers). Split the long field the message names with `chunking: {field: NAME}` in the job, raise "
        "the context (the server's --max-model-len), or shorten the field; then retry them "
        "(`--only-failed --class too_long`)"
    ),
}
#: What to do about ``too_long`` failures whose prompts' fixed part alone leaves no room for a record.
FIXED_PART_TOO_LONG_ADVICE = (
    "the fixed part of the prompt (system prompt, examples, template), sent with every record, leaves no "
    f"room for one and its answer, so {FIXED_PART_FULL}: {FIXED_PART_ADVICE}; then retry them "
    "(`--only-failed --class too_long`)"
)
RAW_OUTPUT_CHARS = 120
# Cut long texts in SQL first, with room for the whitespace that one_line() squeezes out.
_SQL_CUT_CHARS = 2000


@dataclass(frozen=True, slots=True)
class FailureExample:
    record_id: Any
    attempts: int | None
    message: str  # one line, cut to MESSAGE_CHARS: what the text shows
    raw_output: str | None  # an excerpt of last_raw_output, one line
    whole_message: str = ""  # as stored: what the JSON gives

    def to_json(self) -> dict[str, Any]:
        return {
            "record_id": self.record_id,
            "attempts": self.attempts,
            "message": self.whole_message,
            "raw_output": self.raw_output,
        }


@dataclass(frozen=True, slots=True)
class FailureClassSummary:
    failure_class: str
    count: int
    examples: tuple[FailureExample, ...]

    @property
    def advice(self) -> str | None:
        """What to do about these failures, when retrying as they are would not help: for ``too_long``,
        chunking, unless the latest examples say the fixed part of the prompt leaves no room (it is the
        same for every record, so the latest failures say how the prompt is now)."""
        if self.failure_class == FailureClass.TOO_LONG and any(
            FIXED_PART_FULL in example.message for example in self.examples
        ):
            return FIXED_PART_TOO_LONG_ADVICE
        return ADVICE.get(self.failure_class)


@dataclass(frozen=True, slots=True)
class FailureReport:
    database: str
    table: str
    classes: tuple[FailureClassSummary, ...]  # by count, largest first
    read_copy: ReadCopy | None = None  # a run holds the database: read from its copy

    @property
    def total(self) -> int:
        return sum(summary.count for summary in self.classes)

    def to_json(self) -> dict[str, Any]:
        """What ``failures --json`` prints: each example's message whole, as it was stored."""
        return {
            "database": self.database,
            "table": self.table,
            "total": self.total,
            "read_copy": self.read_copy.to_json() if self.read_copy else None,
            "classes": [
                {
                    "failure_class": summary.failure_class,
                    "count": summary.count,
                    "advice": summary.advice,
                    "examples": [example.to_json() for example in summary.examples],
                }
                for summary in self.classes
            ],
        }


def parse_failure_classes(
    values: Iterable[str], allowed: Collection[FailureClass] = tuple(FailureClass)
) -> list[FailureClass]:
    """``--class`` values as failure classes; one not in ``allowed`` is a :class:`ConfigError`."""
    valid = class_names(allowed)
    parsed = []
    for value in values:
        if value not in valid:
            problem = "not taken here" if value in class_names() else "unknown failure class"
            raise ConfigError(f"--class {value!r}: {problem}; use one of {', '.join(valid)}")
        parsed.append(FailureClass(value))
    return parsed


def one_line(text: str | None, limit: int) -> str | None:
    """Whitespace (newlines included) squeezed to single spaces, cut to ``limit`` characters."""
    if text is None:
        return None
    squeezed = " ".join(text.split())
    return squeezed if len(squeezed) <= limit else squeezed[: limit - 1] + "…"


def failure_report(spec: JobSpec, classes: Sequence[FailureClass] = (), examples: int = 3) -> FailureReport:
    """Count the job's failures per class (all classes, or only ``classes``), with ``examples`` each."""
    table = spec.output.failures_table
    connection = open_job_output(spec, [table])
    try:
        check_variant(connection, spec)
        counts = _class_counts(connection, table, spec.variant, classes)
        picked = _examples(connection, table, spec.variant, classes, examples) if examples > 0 else {}
        read_copy = read_copy_of(connection)
    finally:
        connection.close()
    summaries = tuple(FailureClassSummary(name, count, tuple(picked.get(name, ()))) for name, count in counts)
    return FailureReport(str(spec.database), table, summaries, read_copy)


def _class_filter(variant: str, classes: Sequence[FailureClass]) -> tuple[str, list[Any]]:
    if not classes:
        return " WHERE variant = ?", [variant]
    return " WHERE variant = ? AND failure_class IN (SELECT unnest(?))", [
        variant,
        [str(name) for name in classes],
    ]


def _class_counts(
    connection: Database, table: str, variant: str, classes: Sequence[FailureClass]
) -> list[tuple[str, int]]:
    where, parameters = _class_filter(variant, classes)
    rows = connection.execute(
        f"SELECT failure_class, count(*) AS n FROM {quote(table)}{where} GROUP BY 1 ORDER BY n DESC, 1",
        parameters,
    ).fetchall()
    return [(str(name), int(count)) for name, count in rows]


def _examples(
    connection: Database,
    table: str,
    variant: str,
    classes: Sequence[FailureClass],
    per_class: int,
) -> dict[str, list[FailureExample]]:
    """The most recent ``per_class`` failures of each class."""
    where, parameters = _class_filter(variant, classes)
    rows = connection.execute(
        "SELECT failure_class, record_id, attempts, message, "
        f"left(last_raw_output, {_SQL_CUT_CHARS}) FROM ("
        "SELECT *, row_number() OVER (PARTITION BY failure_class ORDER BY created_at DESC, record_id) AS n "
        f"FROM {quote(table)}{where}) WHERE n <= ? ORDER BY failure_class, n",
        [*parameters, per_class],
    ).fetchall()
    picked: dict[str, list[FailureExample]] = {}
    for name, record_id, attempts, message, raw_output in rows:
        picked.setdefault(str(name), []).append(
            FailureExample(
                record_id=record_id,
                attempts=attempts,
                message=one_line(message, MESSAGE_CHARS) or "",
                raw_output=one_line(raw_output, RAW_OUTPUT_CHARS),
                whole_message=message or "",
            )
        )
    return picked
