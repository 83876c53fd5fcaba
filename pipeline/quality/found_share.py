"""The share of values found: of the extracted values grounding looked for in their record's text, how
many it found there. One definition, for every reader of it (a run's profile, ``status``, ``eval`` and
``compare``, one record's :class:`~pipeline.quality.grounding.Grounding`):

* a value is one entry of a result's grounding (:class:`~pipeline.quality.grounding.GroundedValue`):
  a path and a value; a stored entry without either is not one, and a result stored without grounding
  has none;
* it was found when its match is not ``none`` (an exact, normalised or fuzzy match; a stored entry
  without a match was not found).

:func:`found_shares` counts them in Python; :func:`found_shares_sql` is the same count in DuckDB's SQL,
for a reader that counts a whole table without reading every row into Python.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

#: The stored entry's keys the SQL reads, as DuckDB's ``from_json`` structure.
_ENTRY = '[{"path": "VARCHAR", "value": "VARCHAR", "match": "VARCHAR"}]'


class Looked(Protocol):
    """What is counted of a value looked for (a :class:`~pipeline.quality.grounding.GroundedValue`,
    which imports this module: not imported back)."""

    @property
    def path(self) -> str: ...

    @property
    def found(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class FoundShare:
    """Of ``values`` at a path (or a field), how many were ``found`` in their record's text."""

    found: int = 0
    values: int = 0

    @property
    def share(self) -> float | None:
        return self.found / self.values if self.values else None

    def to_json(self) -> dict[str, Any]:
        return {"found": self.found, "values": self.values, "share": self.share}


def _same(path: str) -> str:
    return path


def found_shares(
    values: Iterable[Looked], paths: Iterable[str] = (), *, by: Callable[[str], str] = _same
) -> dict[str, FoundShare]:
    """``values`` counted per ``by(path)`` (default: per path; a run's profile counts per top-level
    field). ``paths``: keys given even without a value (0 of 0), first and in their order."""
    found: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for value in values:
        key = by(value.path)
        seen[key] += 1
        found[key] += value.found
    return {key: FoundShare(found[key], seen[key]) for key in dict.fromkeys([*paths, *seen])}


def found_shares_sql(results: str, where: str = "true") -> str:
    """:func:`found_shares` per path in SQL: one row (path, found, values) per path, in path order, over
    the ``grounding`` column of ``results`` (a table, quoted) whose rows match ``where``."""
    return (
        "SELECT g.path, count(*) FILTER (WHERE coalesce(g.match, 'none') <> 'none'), count(*) "
        f"FROM (SELECT unnest(from_json(grounding, '{_ENTRY}')) AS g FROM {results} "
        f"WHERE ({where}) AND grounding IS NOT NULL) "
        "WHERE g.path IS NOT NULL AND g.value IS NOT NULL GROUP BY 1 ORDER BY 1"
    )
