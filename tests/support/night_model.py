"""What a run should take, worked out apart from the code under test: from the records' states before it,
what each was made from, and the run's options (docs/jobs.md, "When the job changes"; docs/running.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tests.support.drawn_jobs import Row
from tests.support.nights import RecordState

#: The failure classes only --retry-failed / --only-failed take again; a plain run takes transient ones.
TRANSIENT = "transient"


@dataclass(frozen=True, slots=True)
class Made:
    """What a record's result or failure was made from: its text and the job's version then."""

    row: Row
    version: int


@dataclass(frozen=True, slots=True)
class Asked:
    """A run's selection, as its options say it."""

    only_failed: bool = False
    retry_failed: bool = False
    classes: frozenset[str] = frozenset()
    redo_stale: bool = False
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    concurrency: int | None = None

    @classmethod
    def of(cls, words: Sequence[str]) -> Asked:
        """The selection of ``run JOB WORDS...`` (options it does not know are left out)."""
        options: dict[str, object] = {}
        classes: set[str] = set()
        for at, word in enumerate(words):
            following = words[at + 1] if at + 1 < len(words) else ""
            if word == "--only-failed":
                options["only_failed"] = True
            elif word == "--retry-failed":
                options["retry_failed"] = True
            elif word == "--class":
                classes.add(following)
            elif word.startswith("--redo-stale"):
                options["redo_stale"] = True
            elif word in ("--limit", "--sample", "--seed", "--concurrency"):
                options[word[2:]] = int(following)
        return cls(**options, classes=frozenset(classes))  # type: ignore[arg-type]  # built above


def sample_ids(ids: Sequence[int], size: int, seed: int) -> set[int]:
    """The seeded sample: ids ordered by the md5 of ``seed:id`` (docs/architecture.md)."""
    ordered = sorted(ids, key=lambda i: (hashlib.md5(f"{seed}:{i}".encode()).hexdigest(), i))
    return set(ordered[:size])


def selected(
    states: Mapping[int, RecordState],
    rows: Mapping[int, Row],
    made: Mapping[int, Made],
    version: int,
    asked: Asked,
) -> set[int]:
    """The records the run may change (before ``--limit``): its selection inside its sample."""
    inside = set(rows) if asked.sample is None else sample_ids(sorted(rows), asked.sample, asked.seed)
    return {
        record for record in inside if _taken(states[record], rows[record], made.get(record), version, asked)
    }


def _taken(state: RecordState, row: Row, made: Made | None, version: int, asked: Asked) -> bool:
    """Whether a run of ``asked`` sends the record: pending for it, and not blank (never sent)."""
    return not row.empty and _pending(state, row, made, version, asked)


def blank(
    states: Mapping[int, RecordState], rows: Mapping[int, Row], made: Mapping[int, Made], version: int
) -> set[int]:
    """The records a plain run would take but for their text: blank, a state of their own."""
    return {
        record
        for record, row in rows.items()
        if row.empty and _pending(states[record], row, made.get(record), version, Asked())
    }


def _pending(state: RecordState, row: Row, made: Made | None, version: int, asked: Asked) -> bool:
    failed = state.failure[0] if state.failure else None
    retried = failed is not None and (
        failed in asked.classes
        or (not asked.classes and (asked.only_failed or asked.retry_failed))
        or failed == TRANSIENT
    )
    if asked.only_failed:
        return failed is not None and (failed in asked.classes or not asked.classes)
    new = state.result_run is None and state.failure is None
    changed = made is not None and _text(made.row) != _text(row)
    stale = asked.redo_stale and made is not None and made.version < version
    return new or retried or changed or stale


#: What a prompt leaves an answer at least, beside the job's fixed part (its system prompt and schema).
_ROOM = 1_500


def fitting(row: Row, context: int) -> bool | None:
    """Whether ``row``'s prompt fits ``context`` with room for an answer (True), cannot fit at all,
    even counted one token a word (False), or lies between (None: not judged here)."""
    text = f"Title: {row.title}\n\n{row.body}"
    if len(text.split()) > context:
        return False
    return True if len(text) // 4 + _ROOM < context else None


def _text(row: Row) -> tuple[str, str]:
    """A record's prompt fields as the source holds them: a file's empty text and NULL are alike."""
    return (row.title or "", row.body or "")
