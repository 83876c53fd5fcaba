"""Records with nothing to extract from: every field the prompt reads is NULL, empty or whitespace.

Sent, such a record comes back with an extraction the model made up from the system prompt alone. So
a run never sends one: a record a run would take (new, a failure to retry, text changed, a stale result
to redo) that is blank is *blank* instead of pending, a state of its own beside done, failed and
pending (:mod:`pipeline.source.pending` counts it, the reader sets it aside). Nothing is written for
it, so once a newer export gives it text it is new again, and sent. A result or failure it already has
stays what it is. ``load``, ``check``, ``run`` and ``status`` say how many there are, naming a few.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.source.db import Database, quote
from pipeline.wording import counted

#: Whitespace as Python's ``str.strip()`` removes it (RE2's ``\s`` lacks the vertical tab and U+0085)
#: and Unicode's spaces: a field of no-break spaces is no text either.
_NO_TEXT = r"[[:space:]\p{Z}\x{85}]*"
#: How many ids a line names.
SHOWN_IDS = 3


def blank_condition(fields: Sequence[str], alias: str) -> str:
    """SQL true when each of ``fields`` of the row ``alias`` is NULL, empty or whitespace as the prompt
    carries it (:func:`~pipeline.extraction.prompt.as_sent`: a value's text); false when the prompt
    reads no field (every record is then the same prompt, sent as the job asks)."""
    if not fields:
        return "false"
    empty = (
        f"coalesce(regexp_full_match(CAST({alias}.{quote(name)} AS VARCHAR), '{_NO_TEXT}'), true)"
        for name in fields
    )
    return "(" + " AND ".join(empty) + ")"


@dataclass(frozen=True, slots=True)
class BlankRecords:
    """How many records are blank, and the first few ids, in id order."""

    fields: tuple[str, ...]  # the prompt's fields, every one empty
    count: int = 0
    ids: tuple[int | str, ...] = ()

    def __bool__(self) -> bool:
        return self.count > 0

    def plus(self, other: BlankRecords) -> BlankRecords:
        """Both counts (two phases of a run), with the first ids of both."""
        ids = tuple(sorted({*self.ids, *other.ids}, key=_order))[:SHOWN_IDS]
        return BlankRecords(self.fields, self.count + other.count, ids)

    @property
    def what(self) -> str:
        """``empty subject and body: ids 17, 42, 99`` (``and 5 more`` when there are more)."""
        names = list(self.fields)
        fields = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else "".join(names)
        shown = ", ".join(repr(value) if isinstance(value, str) else str(value) for value in self.ids)
        more = f" and {self.count - len(self.ids):,} more" if self.count > len(self.ids) else ""
        return f"empty {fields}: {'id' if self.count == 1 else 'ids'} {shown}{more}"

    def describe(self, then: str = "") -> str:
        """``3 records have empty subject and body: ids 17, 42, 99``, then ``; {then}``."""
        have = "has" if self.count == 1 else "have"
        return f"{counted(self.count, 'record')} {have} {self.what}" + (f"; {then}" if then else "")

    def not_sent(self, *, now: bool = False) -> str:
        """:meth:`describe`, then ``they will not be sent`` (``now``: ``they are not sent``), of one
        record ``it``."""
        one = self.count == 1
        verb = ("is" if one else "are") + " not" if now else "will not be"
        return self.describe(f"{'it' if one else 'they'} {verb} sent")


def _order(value: int | str) -> tuple[str, int | str]:
    """Ids of one column are all numbers or all text; the type name keeps a mix from failing."""
    return (type(value).__name__, value)


def blank_ids_sql(relation: str, id_column: str, fields: Sequence[str], where: str = "true") -> str:
    """The ids of the blank rows of ``relation`` (a table, or a SELECT in parentheses) among those
    ``where`` keeps (SQL over its alias ``s``)."""
    return f"SELECT s.{quote(id_column)} FROM {relation} s WHERE ({where}) AND {blank_condition(fields, 's')}"


def read_blank_ids(connection: Database, ids_sql: str, id_column: str, fields: Sequence[str]) -> BlankRecords:
    """How many ids ``ids_sql`` gives (the blank ones, e.g. :func:`blank_ids_sql`), and the first few.
    Blocking."""
    row = connection.row(f"SELECT count(*), min(b.{quote(id_column)}, {SHOWN_IDS}) FROM ({ids_sql}) b")
    count, ids = (int(row[0]), row[1]) if row else (0, None)
    return BlankRecords(tuple(fields), count, tuple(ids or ()))


def blank_records(connection: Database, relation: str, id_column: str, fields: Sequence[str]) -> BlankRecords:
    """The blank rows of ``relation``: how many, and the first ids. Blocking."""
    return read_blank_ids(connection, blank_ids_sql(relation, id_column, fields), id_column, fields)
