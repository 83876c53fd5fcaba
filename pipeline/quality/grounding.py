"""Grounding: where in the record's text each extracted value occurs, so that a person can check it
(the review page highlights it) and values the text does not support stand out.

Each string value at a grounded path is looked for in the record's text fields, in their order, in
three steps, each tried only when the one before found nothing in any field:

1. exact: a case-sensitive substring;
2. normalised: :func:`~pipeline.quality.normalize.normalize_text` of the value in the normalised text,
   mapped back to the original text (so different case, spacing, newlines or full-width letters match);
3. fuzzy: rapidfuzz ``fuzz.partial_ratio_alignment`` of the normalised value against the normalised
   text finds the most similar place; the span is widened to whole words, and it matches when the
   better of the partial score and ``fuzz.ratio`` of the value and those words is >= the threshold (a
   typo, a missing letter); the best-scoring field wins.

Offsets are Python ``str`` indices into the original ``texts[source_field]``: ``text[start:end]`` is
the matched text. Each text is normalised at most once per record, and only if a value needs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from pydantic import BaseModel
from rapidfuzz import fuzz

from pipeline.quality.fields import grounded_paths, values_at
from pipeline.quality.found_share import FoundShare, found_shares
from pipeline.quality.normalize import NormalizedText, normalize_text, normalize_with_offsets


class MatchKind(StrEnum):
    EXACT = "exact"
    NORMALISED = "normalised"
    FUZZY = "fuzzy"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class _Location:
    source_field: str | None
    start: int | None
    end: int | None
    match: MatchKind
    score: float  # 100 for exact and normalised matches, rapidfuzz's score for fuzzy ones, 0 for none


_NOT_FOUND = _Location(None, None, None, MatchKind.NONE, 0.0)

# partial_ratio compares windows as long as the value, so one missing letter in a short word costs it
# up to 20 points ("pyton" vs "pytho": 80) while the whole word scores 91 ("pyton" vs "python"): search
# with this margin below the threshold, then score the match widened to whole words with fuzz.ratio.
FUZZY_SEARCH_MARGIN = 20.0


@dataclass(frozen=True, slots=True)
class GroundedValue:
    """One extracted value located (or not) in the record's text: what grounding finds, what the
    results' ``grounding`` column keeps (a JSON list of :meth:`to_json`), and what every reader of it
    gets back (:func:`grounding_from_json`)."""

    path: str  # "explicit_skills", "requirements[].text"
    value: str
    source_field: str | None  # the text field it was found in; None when not found
    start: int | None  # Python str offsets into texts[source_field]
    end: int | None
    match: MatchKind
    score: float  # 100 for exact and normalised matches, rapidfuzz's score for fuzzy ones, 0 for none
    chunk: int | None = None  # the chunk of a long record that found it (1-based); None: sent whole
    pass_: int | None = None  # the pass that found it (1-based), with ``chunk``

    @property
    def found(self) -> bool:
        return self.match != MatchKind.NONE

    def moved(self, field: str, offset: int) -> GroundedValue:
        """Found in a chunk of ``field`` that starts at ``offset``: its offsets in the whole field."""
        if self.source_field != field or self.start is None or self.end is None:
            return self
        return dataclasses.replace(self, start=self.start + offset, end=self.end + offset)

    def to_json(self) -> dict[str, Any]:
        """The stored form: these keys in this order (``chunk`` and ``pass`` only for a merged long
        record), as every row ever written has them."""
        data: dict[str, Any] = {
            "path": self.path,
            "value": self.value,
            "source_field": self.source_field,
            "start": self.start,
            "end": self.end,
            "match": str(self.match),
            "score": self.score,
        }
        if self.chunk is not None:
            data["chunk"] = self.chunk
        if self.pass_ is not None:
            data["pass"] = self.pass_
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroundedValue:
        """One stored entry (``path`` and ``value`` present; a missing match is ``none``, a missing
        score 0). An unknown match is a ``ValueError``."""
        return cls(
            path=str(data["path"]),
            value=str(data["value"]),
            source_field=data.get("source_field"),
            start=data.get("start"),
            end=data.get("end"),
            match=MatchKind(str(data.get("match") or MatchKind.NONE)),
            score=float(data.get("score") or 0.0),
            chunk=data.get("chunk"),
            pass_=data.get("pass"),
        )


def grounding_from_json(stored: str | bytes | Sequence[Any] | None) -> tuple[GroundedValue, ...] | None:
    """A results' ``grounding`` column as read (JSON text, or already parsed): None when the result
    was stored without grounding; entries without a path and a value (missing, or null) are passed
    over, as :func:`~pipeline.quality.found_share.found_shares_sql` passes them over."""
    if stored is None:
        return None
    entries = orjson.loads(stored) if isinstance(stored, str | bytes) else stored
    return tuple(
        GroundedValue.from_json(entry)
        for entry in entries
        if isinstance(entry, Mapping) and entry.get("path") is not None and entry.get("value") is not None
    )


def grounding_json(values: Iterable[GroundedValue]) -> str:
    """``values`` as the results' ``grounding`` column keeps them."""
    return orjson.dumps([value.to_json() for value in values]).decode()


@dataclass(frozen=True, slots=True)
class Grounding:
    paths: tuple[str, ...]  # the grounded paths asked for, also those without values
    values: tuple[GroundedValue, ...]  # by path, then in the extraction's order

    def to_json(self) -> list[dict[str, Any]]:
        """One dict per value (:meth:`GroundedValue.to_json`): the results' ``grounding`` column."""
        return [value.to_json() for value in self.values]

    def share_by_path(self) -> dict[str, FoundShare]:
        """How many values were found in the text (:mod:`pipeline.quality.found_share`), for every path
        asked for."""
        return found_shares(self.values, self.paths)


class _RecordTexts:
    """One record's text fields, each normalised when a value first needs it, and only once."""

    def __init__(self, texts: Mapping[str, str]) -> None:
        self.texts = texts
        self._normalised: dict[str, NormalizedText] = {}

    def normalised(self, field: str) -> NormalizedText:
        if field not in self._normalised:
            self._normalised[field] = normalize_with_offsets(self.texts[field])
        return self._normalised[field]


def _word_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """``start:end`` without surrounding spaces, widened to the edges of the words it cuts."""
    while start < end and text[start] == " ":
        start += 1
    while end > start and text[end - 1] == " ":
        end -= 1
    if start < end:
        while start > 0 and text[start - 1].isalnum() and text[start].isalnum():
            start -= 1
        while end < len(text) and text[end].isalnum() and text[end - 1].isalnum():
            end += 1
    return start, end


def _fuzzy_span(wanted: str, normalised: str, threshold: float) -> tuple[float, int, int] | None:
    """(score, start, end) of the best fuzzy match of ``wanted`` in ``normalised``, in whole words."""
    # partial_ratio scores the shorter string against the longer one: a value longer than the text
    # would "match" a text that is only part of it.
    if len(wanted) > len(normalised):
        return None
    search_cutoff = max(0.0, threshold - FUZZY_SEARCH_MARGIN)
    alignment = fuzz.partial_ratio_alignment(wanted, normalised, score_cutoff=search_cutoff)
    if alignment is None:
        return None
    start, end = _word_bounds(normalised, alignment.dest_start, alignment.dest_end)
    if start >= end:
        return None
    score = max(alignment.score, fuzz.ratio(wanted, normalised[start:end]))
    return (score, start, end) if score >= threshold else None


def _fuzzy_location(wanted: str, texts: _RecordTexts, threshold: float) -> _Location:
    best: tuple[float, int, int, str] | None = None
    for field in texts.texts:
        found = _fuzzy_span(wanted, texts.normalised(field).text, threshold)
        if found is not None and (best is None or found[0] > best[0]):
            best = (*found, field)
    if best is None:
        return _NOT_FOUND
    score, start, end, field = best
    original_start, original_end = texts.normalised(field).original_span(start, end)
    return _Location(field, original_start, original_end, MatchKind.FUZZY, float(score))


def _locate(value: str, texts: _RecordTexts, fuzzy_threshold: float | None) -> _Location:
    for field, text in texts.texts.items():
        start = text.find(value)
        if start >= 0:
            return _Location(field, start, start + len(value), MatchKind.EXACT, 100.0)
    wanted = normalize_text(value)
    if not wanted:  # only punctuation
        return _NOT_FOUND
    for field in texts.texts:
        normalised = texts.normalised(field)
        start = normalised.text.find(wanted)
        if start >= 0:
            original_start, original_end = normalised.original_span(start, start + len(wanted))
            return _Location(field, original_start, original_end, MatchKind.NORMALISED, 100.0)
    if fuzzy_threshold is None:
        return _NOT_FOUND
    return _fuzzy_location(wanted, texts, fuzzy_threshold)


def ground(
    extraction: Mapping[str, Any],
    texts: Mapping[str, str],
    paths: Sequence[str],
    *,
    fuzzy_threshold: float | None = 90.0,
) -> Grounding:
    """Locate every string value at ``paths`` (see :func:`~pipeline.quality.fields.values_at`) of one
    record's ``extraction`` in its ``texts`` (source field -> text, searched in this order).

    Empty and blank values are skipped; ``fuzzy_threshold`` None turns the fuzzy step off."""
    record_texts = _RecordTexts(texts)
    located: dict[str, _Location] = {}  # the same value under two paths is looked for once
    values: list[GroundedValue] = []
    for path in paths:
        for value in values_at(extraction, path):
            if not value.strip():
                continue
            if value not in located:
                located[value] = _locate(value, record_texts, fuzzy_threshold)
            where = located[value]
            values.append(
                GroundedValue(
                    path, value, where.source_field, where.start, where.end, where.match, where.score
                )
            )
    return Grounding(tuple(paths), tuple(values))


class Grounder:
    """Grounds each extraction of one job as it is made: the schema's grounded paths in the record's
    prompt fields. :meth:`for_schema` gives None when the schema marks no field grounded."""

    def __init__(self, paths: Sequence[str], fuzzy_threshold: float | None) -> None:
        self.paths = tuple(paths)
        self.fuzzy_threshold = fuzzy_threshold

    @classmethod
    def for_schema(cls, schema: type[BaseModel], fuzzy_threshold: float | None = 90.0) -> Grounder | None:
        paths = grounded_paths(schema)
        return cls(paths, fuzzy_threshold) if paths else None

    def ground(self, extraction: Mapping[str, Any], texts: Mapping[str, str]) -> Grounding:
        """``texts``: the record's prompt fields as sent
        (:meth:`pipeline.extraction.prompt.PromptBuilder.texts`)."""
        return ground(extraction, texts, self.paths, fuzzy_threshold=self.fuzzy_threshold)
