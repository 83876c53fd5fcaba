"""Merging the answers of a long document's chunks into one answer, field by field.

Each top-level field merges by its strategy, declared in the schema with
``Field(json_schema_extra={"merge": ...})`` and checked against the field's kind when the job loads
(:func:`pipeline.job.chunking.merge_strategies`, which names the strategies):

* ``union`` (the default for lists; ``first`` takes one chunk's list whole): every item of every
  chunk, each once, in document order: items that compare equal (text after
  :func:`~pipeline.quality.normalize.normalize_text`, numbers as numbers, objects by their fields) are
  one, and so are two texts found at the same place of the document;
* ``first`` (the default for the rest): the first value by its place in the document: values found in
  the text (grounded) first, by position, then the others in chunk order;
* ``most_common``: the value most chunks gave (ties: the first, as above);
* ``min`` / ``max``: numbers.

A value's place is where grounding found it (the chunk's grounding, its offsets moved to the whole
document), field by field in prompt order. Answers of a later pass only add: a list keeps the items it
did not have that the text contains, a field still empty takes a value the text contains
(:func:`merge_passes`). Pure: plain JSON and grounded values in, the same out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from pipeline.job.chunking import LIST_KINDS, Merge, merge_strategies
from pipeline.quality.fields import FieldKind, schema_fields, top_field
from pipeline.quality.grounding import GroundedValue
from pipeline.quality.matching import object_key, value_key


@dataclass(frozen=True, slots=True)
class ChunkAnswer:
    """One chunk's validated answer in one pass, with its grounding (offsets in the whole document)."""

    chunk: int  # 1-based
    pass_: int  # 1-based
    value: Mapping[str, Any]
    grounding: Sequence[GroundedValue] = ()


@dataclass(frozen=True, slots=True)
class MergedAnswer:
    """The document's answer, the grounding of its values (each saying its ``chunk`` and ``pass``), and
    how many of its values each pass found first."""

    value: dict[str, Any]
    grounding: list[GroundedValue]
    added_by_pass: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Candidate:
    answer: ChunkAnswer
    value: Any
    order: int  # the item's place in its answer's list
    place: tuple[int, int] | None  # (field in prompt order, offset) where the text has it

    def sort_key(self) -> tuple[bool, tuple[int, int], int, int, int]:
        return (self.place is None, self.place or (0, 0), self.answer.chunk, self.answer.pass_, self.order)


class _Merger:
    def __init__(self, schema: type[BaseModel], fields: Sequence[str]) -> None:
        self.specs = {spec.name: spec for spec in schema_fields(schema)}
        self.strategies = merge_strategies(schema)
        self.fields = list(fields)  # the prompt's text fields, in order: where a place is

    def entries(self, answer: ChunkAnswer, name: str, value: Any) -> list[GroundedValue]:
        """The grounding of ``value`` (a field's value or one list item) in ``answer``."""
        strings = _strings(value)
        return [
            entry for entry in answer.grounding if top_field(entry.path) == name and entry.value in strings
        ]

    def place(self, answer: ChunkAnswer, name: str, value: Any) -> tuple[int, int] | None:
        places = [
            (self.fields.index(entry.source_field), entry.start)
            for entry in self.entries(answer, name, value)
            if entry.found and entry.source_field in self.fields and entry.start is not None
        ]
        return min(places, default=None)

    def span(self, answer: ChunkAnswer, name: str, value: Any) -> tuple[Any, Any, Any] | None:
        """Where a text item was found, as (field, start, end); None for other values or not found."""
        if not isinstance(value, str):
            return None
        for entry in self.entries(answer, name, value):
            if entry.found:
                return (entry.source_field, entry.start, entry.end)
        return None

    def by_item(self, name: str) -> bool:
        """Whether the field merges item by item (a union), not value by value."""
        return self.strategies[name] is Merge.UNION

    def candidates(self, answers: Sequence[ChunkAnswer], name: str) -> list[_Candidate]:
        found = []
        for answer in answers:
            value = answer.value.get(name)
            items = value if self.by_item(name) and isinstance(value, list) else [value]
            for order, item in enumerate(items):
                if item is not None and item != []:
                    found.append(_Candidate(answer, item, order, self.place(answer, name, item)))
        return sorted(found, key=_Candidate.sort_key)

    def key(self, name: str, value: Any) -> Hashable:
        spec = self.specs[name]
        if spec.kind is FieldKind.OBJECT_LIST and self.by_item(name):
            return object_key(spec.subfields, value)
        if spec.kind is FieldKind.LIST and self.by_item(name):
            return value_key(spec.item_kind, value)
        return value_key(spec.kind, value)

    def union(self, name: str, candidates: list[_Candidate]) -> list[_Candidate]:
        kept: list[_Candidate] = []
        keys: set[Hashable] = set()
        spans: set[tuple[Any, Any, Any]] = set()
        for candidate in candidates:
            key, span = self.key(name, candidate.value), self.span(candidate.answer, name, candidate.value)
            if key in keys or (span is not None and span in spans):
                continue
            keys.add(key)
            if span is not None:
                spans.add(span)
            kept.append(candidate)
        return kept

    def chosen(self, name: str, candidates: list[_Candidate]) -> list[_Candidate]:
        """The candidates whose values make the field: all of them (union), or the one chosen."""
        strategy = self.strategies[name]
        if strategy is Merge.UNION:
            return self.union(name, candidates)
        if not candidates:
            return []
        if strategy is Merge.MOST_COMMON:
            counts = Counter(self.key(name, candidate.value) for candidate in candidates)
            most = max(counts.values())
            return [next(c for c in candidates if counts[self.key(name, c.value)] == most)]
        if strategy in (Merge.MIN, Merge.MAX):
            pick = min if strategy is Merge.MIN else max
            best = pick(candidate.value for candidate in candidates)
            return [next(c for c in candidates if c.value == best)]
        return candidates[:1]

    def merge(self, answers: Sequence[ChunkAnswer]) -> MergedAnswer:
        value: dict[str, Any] = {}
        grounding: list[GroundedValue] = []
        added: Counter[int] = Counter()
        for name, spec in self.specs.items():
            chosen = self.chosen(name, self.candidates(answers, name))
            if self.by_item(name):
                value[name] = [candidate.value for candidate in chosen]
            else:
                value[name] = chosen[0].value if chosen else [] if spec.kind in LIST_KINDS else None
            for candidate in chosen:
                added[candidate.answer.pass_] += (
                    len(candidate.value) if isinstance(candidate.value, list) else 1
                )
                grounding += (
                    dataclasses.replace(entry, chunk=candidate.answer.chunk, pass_=candidate.answer.pass_)
                    for entry in self.entries(candidate.answer, name, candidate.value)
                )
        return MergedAnswer(value, _unique(grounding), dict(sorted(added.items())))

    def new_only(self, answer: ChunkAnswer, earlier: MergedAnswer) -> ChunkAnswer:
        """A later pass's answer with only what it adds: items the earlier passes lack and the text
        contains; a value for a field that is still empty, when the text contains it."""
        kept: dict[str, Any] = {}
        for name, spec in self.specs.items():
            value = answer.value.get(name)
            if self.by_item(name) and isinstance(value, list):
                known = {self.key(name, item) for item in earlier.value.get(name) or []}
                kept[name] = [
                    item
                    for item in value
                    if self.key(name, item) not in known and self.place(answer, name, item) is not None
                ]
            elif earlier.value.get(name) in (None, []) and self.place(answer, name, value) is not None:
                kept[name] = value
            else:
                kept[name] = [] if spec.kind in LIST_KINDS else None
        return ChunkAnswer(answer.chunk, answer.pass_, kept, answer.grounding)


def _strings(value: Any) -> set[str]:
    """Every text inside a value (itself, an object's fields, a list's items)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, Mapping):
        return {text for item in value.values() for text in _strings(item)}
    if isinstance(value, list):
        return {text for item in value for text in _strings(item)}
    return set()


def _unique(grounding: list[GroundedValue]) -> list[GroundedValue]:
    """Each (path, value) once: the same text kept by two items is grounded once."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for entry in grounding:
        key = (entry.path, entry.value)
        if key not in seen:
            seen.add(key)
            kept.append(entry)
    return kept


def merge_passes(
    schema: type[BaseModel], fields: Sequence[str], answers: Sequence[ChunkAnswer]
) -> MergedAnswer:
    """The document's answer from every chunk's answers of every pass (``fields``: the prompt's text
    fields in order). Pass 1 merges as it is; each later pass adds only what :meth:`_Merger.new_only`
    keeps of it, measured against the passes before it."""
    merger = _Merger(schema, fields)
    passes = sorted({answer.pass_ for answer in answers})
    taken: list[ChunkAnswer] = []
    merged = MergedAnswer({}, [])
    for number in passes:
        this_pass = [answer for answer in answers if answer.pass_ == number]
        if taken:
            this_pass = [merger.new_only(answer, merged) for answer in this_pass]
        taken += this_pass
        merged = merger.merge(taken)
    return merged


def found_in_chunk(
    merged: MergedAnswer, own: Sequence[ChunkAnswer], field: str, start: int, end: int
) -> dict[str, Any]:
    """What a later pass over the chunk ``field[start:end]`` is told was found, field by field (empty
    ones left out): the list items its own earlier answers (``own``) gave or that were found inside it
    (an overlapping chunk's), and every other field's merged value."""
    found: dict[str, Any] = {}
    for name, value in merged.value.items():
        if isinstance(value, list):
            given = [item for answer in own for item in answer.value.get(name) or []]
            inside = {
                entry.value
                for entry in merged.grounding
                if top_field(entry.path) == name
                and entry.source_field == field
                and entry.start is not None
                and start <= entry.start < end
            }
            value = [item for item in value if item in given or _strings(item) & inside]
        if value not in (None, [], ""):
            found[name] = value
    return found
