"""A run's profile: what it produced, field by field, in numbers that should hold still from one nightly
run to the next (:mod:`pipeline.quality.drift` says when one moved).

Per top-level field of the schema:

* ``fill_rate``: the share of results where the field is filled (not null, not an empty string, list
  or object);
* ``distinct``: how many different values the filled ones have (shown, not judged: it grows with the
  number of records);
* ``mean_length`` (lists): the mean number of items, an empty list counting 0, with its standard
  deviation;
* ``top``: for choices, booleans, short texts (names, cities: at most :data:`SHORT_TEXT` characters
  on average) and lists of those, the :data:`TOP_VALUES` most common values and the share of filled
  results that have each; for choices and booleans (and lists of choices) ``shares`` holds every
  value's share, so a value that stops being given is seen too;
* ``grounded``: of the field's values checked against the record text, how many were found there
  (:mod:`pipeline.quality.found_share`).

Everything here is pure: the store reads the run's results and calls :func:`profile_fields`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.quality.fields import FieldKind, FieldSpec
from pipeline.quality.found_share import FoundShare

SHORT_TEXT = 40  # characters: texts this short on average are names and places, not prose
TOP_VALUES = 5
_COUNTED_KINDS = frozenset({FieldKind.CHOICE, FieldKind.BOOLEAN})


def is_empty(value: Any) -> bool:
    """Null, an empty (or blank) string, an empty list or an empty object."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list | dict):
        return not value
    return False


def value_text(value: Any) -> str:
    """How a value is counted and shown: a string as it is, anything else as compact JSON."""
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(slots=True)
class _FieldTally:
    spec: FieldSpec
    records: int = 0
    filled: int = 0
    lengths: list[int] = field(default_factory=list)
    values: Counter[str] = field(default_factory=Counter)  # distinct filled values
    items: Counter[str] = field(default_factory=Counter)  # lists: records having each item
    text_chars: int = 0

    def add(self, value: Any) -> None:
        self.records += 1
        if isinstance(value, list):
            self.lengths.append(len(value))
        if is_empty(value):
            return
        self.filled += 1
        self.values[value_text(value)] += 1
        if isinstance(value, str):
            self.text_chars += len(value)
        if isinstance(value, list):
            self.items.update({value_text(item) for item in value if not is_empty(item)})

    def _counted(self) -> Counter[str] | None:
        """The counts ``top`` is taken from, or None when the field's values are not worth listing."""
        spec = self.spec
        if spec.kind in _COUNTED_KINDS:
            return self.values
        if spec.kind is FieldKind.TEXT and self.filled and self.text_chars / self.filled <= SHORT_TEXT:
            return self.values
        if spec.kind is FieldKind.LIST and spec.item_kind in (*_COUNTED_KINDS, FieldKind.TEXT):
            return self.items
        return None

    def to_json(self, grounded: FoundShare | None) -> dict[str, Any]:
        counted = (self._counted() if self.filled else None) or Counter()
        top = [[value, count / self.filled] for value, count in counted.most_common(TOP_VALUES)]
        choices = self.spec.kind in _COUNTED_KINDS or self.spec.item_kind in _COUNTED_KINDS
        shares = {value: count / self.filled for value, count in counted.items()} if choices else None
        return {
            "kind": str(self.spec.kind),
            "records": self.records,
            "filled": self.filled,
            "fill_rate": self.filled / self.records if self.records else None,
            "distinct": len(self.values),
            "mean_length": _mean(self.lengths),
            "length_sd": _sd(self.lengths),
            "top": top,
            "shares": shares,
            "grounded": grounded.to_json() if grounded and grounded.values else None,
        }


def _mean(values: Sequence[int]) -> float | None:
    return sum(values) / len(values) if values else None


def _sd(values: Sequence[int]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1))


def profile_fields(
    specs: Sequence[FieldSpec],
    extractions: Iterable[Mapping[str, Any]],
    grounded: Mapping[str, FoundShare] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each top-level field's profile (schema order) over ``extractions``; ``grounded``: per top-level
    field, how many of its values were found in the text."""
    tallies = [_FieldTally(spec) for spec in specs]
    for extraction in extractions:
        for tally in tallies:
            tally.add(extraction.get(tally.spec.name))
    grounded = grounded or {}
    return {tally.spec.name: tally.to_json(grounded.get(tally.spec.name)) for tally in tallies}
