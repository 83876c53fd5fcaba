"""Whether two values match under the user's matching settings: the primitives of the agreement
metrics (:mod:`pipeline.quality.agreement`).

Every value becomes a *key* once (:func:`value_key`: normalised text, a float, a tagged value); equal
keys match. Keys that differ still match when fuzzy matching is on (text) or a numeric tolerance is
set (numbers) and :meth:`Matcher.score` reaches :attr:`MatchSettings.threshold`. Lists are matched one
to one (:func:`count_matches`), which is what precision and recall count.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from rapidfuzz import fuzz

from pipeline.errors import ConfigError
from pipeline.quality.fields import SCALAR_KINDS, FieldKind, FieldSpec
from pipeline.quality.normalize import NORMALISATION_RULE, normalize_text

ABSOLUTE_TOLERANCE = 1e-9

# A tag and a value: ("normalised", "sql"), ("number", 35000.0), ("value", True), ("null", None). The tag
# keeps True, 1 and "1" apart (True == 1 in Python) and says which values may match approximately.
Key = tuple[str, Any]
ObjectKey = tuple[Key, ...]  # an object in a list: the keys of its scalar sub-fields, in schema order
#: A sub-field a reference object leaves out (a gold requirement given by its text alone, as a value
#: marked missing is exported): unknown, so whatever the candidate's object holds there matches.
UNKNOWN: Key = ("unknown", None)
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class MatchSettings:
    numeric_tolerance: float = 0.0  # relative; numbers within ABSOLUTE_TOLERANCE always match
    fuzzy_threshold: float | None = None  # rapidfuzz fuzz.ratio, 0..100; None: normalised equality only

    def __post_init__(self) -> None:
        if not (self.numeric_tolerance >= 0 and math.isfinite(self.numeric_tolerance)):
            raise ConfigError(f"numeric tolerance {self.numeric_tolerance}: must be a number, 0 or more")
        if self.fuzzy_threshold is not None and not 0 <= self.fuzzy_threshold <= 100:
            raise ConfigError(f"fuzzy threshold {self.fuzzy_threshold}: must be between 0 and 100")

    @property
    def threshold(self) -> float:
        """The score (0..100) at which two values whose keys differ still match."""
        return 100.0 if self.fuzzy_threshold is None else self.fuzzy_threshold

    @property
    def approximate(self) -> bool:
        """Whether values with different keys can match at all (else equal keys are the whole story)."""
        return self.fuzzy_threshold is not None or self.numeric_tolerance > 0

    def rules(self) -> dict[str, Any]:
        """The matching rules in words and numbers (the ``matching`` part of a report)."""
        fuzzy = (
            "off"
            if self.fuzzy_threshold is None
            else "text values and text list items also match when rapidfuzz fuzz.ratio of their "
            f"normalised forms is >= {self.fuzzy_threshold:g}"
        )
        return {
            "text": NORMALISATION_RULE,
            "fuzzy": fuzzy,
            "fuzzy_threshold": self.fuzzy_threshold,
            "numbers": f"match within a relative tolerance of {self.numeric_tolerance:g} "
            f"(or an absolute {ABSOLUTE_TOLERANCE:g})",
            "numeric_tolerance": self.numeric_tolerance,
            "choices_and_booleans": "compared as values",
            "null": "null matches only null",
            "lists": "items matched one to one (an item given twice must be found twice; with fuzzy, "
            "best-scoring pairs first); a record's P/R/F1 are 1 when both its lists are empty, and a ratio "
            "over an empty side is 0 when the other side is not empty",
            "objects_in_lists": "two objects match when every scalar sub-field matches",
            "scored": "records present on both sides, for the fields the reference record gives",
            "field_score": "a scalar field's accuracy; a list field's F1 from its TP/FP/FN pooled over "
            "records (records with both lists empty add nothing; 1 if no record has an item on either "
            "side); its macro P/R/F1 is the mean of each record's",
            "micro": "P/R/F1 pooled over every scored value of the fields in the overall scores: a list "
            "field adds its TP/FP/FN; a scalar adds one value, a match being a TP and a mismatch one FP "
            "and one FN",
            "macro": "mean over the fields in the overall scores of each field's score (F1 or accuracy), "
            "every field counting once",
            "record_disagreement": "1 - the mean over the record's fields of 1/0 for a scalar and the "
            "record's F1 for a list (1 when both lists are empty); ranks the records that differ most",
        }

    def describe(self) -> str:
        """The rules in one line, for the terminal."""
        fuzzy = "off" if self.fuzzy_threshold is None else f"fuzz.ratio >= {self.fuzzy_threshold:g}"
        return (
            "matching: text NFKC + casefold + whitespace squeezed + outer quotes/punctuation stripped; "
            f"fuzzy {fuzzy}; numbers within {self.numeric_tolerance:g} relative; list items one to one"
        )


@dataclass(frozen=True, slots=True)
class Scores:
    precision: float
    recall: float
    f1: float


def list_scores(matched: int, reference_items: int, candidate_items: int) -> Scores:
    """P/R/F1 of one record's list (or of counts pooled over records). Both sides empty is a perfect
    match; a ratio over an empty side is 0 when the other side is not empty (nothing found, or
    nothing asked for), so one empty side scores F1 = 0."""
    if reference_items == 0 and candidate_items == 0:
        return Scores(1.0, 1.0, 1.0)
    precision = matched / candidate_items if candidate_items else 0.0
    recall = matched / reference_items if reference_items else 0.0
    return Scores(precision, recall, 2 * matched / (reference_items + candidate_items))


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def value_key(kind: FieldKind | None, value: Any) -> Key:
    """What a value of a field of ``kind`` is compared by: text normalised, numbers as floats, the rest
    as given (objects and lists as canonical JSON)."""
    if value is None:
        return ("null", None)
    if isinstance(value, str):
        return ("normalised", normalize_text(value)) if kind is FieldKind.TEXT else ("value", value)
    if is_number(value):
        return ("number", float(value))
    if isinstance(value, bool):
        return ("value", value)
    return ("json", orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=repr))


def object_key(subfields: Sequence[FieldSpec], item: Any, *, partial: bool = False) -> ObjectKey:
    """An object's scalar sub-fields as keys; ``partial`` (a reference's object): one it leaves out is
    :data:`UNKNOWN` (else null, as a candidate's answer leaving it out says)."""
    values: Mapping[str, Any] = item if isinstance(item, Mapping) else {}
    return tuple(
        UNKNOWN if partial and sub.name not in values else value_key(sub.kind, values.get(sub.name))
        for sub in subfields
        if sub.kind in SCALAR_KINDS
    )


@dataclass(frozen=True, slots=True)
class Matcher:
    settings: MatchSettings

    def score(self, a: Key, b: Key) -> float:
        """How alike two values are, 0..100: 100 for equal keys and numbers within the tolerance;
        fuzz.ratio for two texts when fuzzy matching is on; else 0."""
        if a == b:
            return 100.0
        if a[0] == b[0] == "number":
            tolerance = self.settings.numeric_tolerance
            return 100.0 if math.isclose(a[1], b[1], rel_tol=tolerance, abs_tol=ABSOLUTE_TOLERANCE) else 0.0
        if a[0] == b[0] == "normalised" and self.settings.fuzzy_threshold is not None:
            return float(fuzz.ratio(a[1], b[1]))
        return 0.0

    def matches(self, a: Key, b: Key) -> bool:
        return self.score(a, b) >= self.settings.threshold

    def object_score(self, a: ObjectKey, b: ObjectKey) -> float:
        """Two objects are as alike as their least alike scalar sub-field (one unknown is alike)."""
        return min(
            (100.0 if UNKNOWN in (x, y) else self.score(x, y) for x, y in zip(a, b, strict=True)),
            default=100.0,
        )

    def count_matches(
        self,
        reference: Sequence[K],
        candidate: Sequence[K],
        score: Callable[[K, K], float],
        *,
        partial: bool = False,
    ) -> int:
        """:func:`count_matches` with these settings (``score`` only when values can match approximately,
        or ``partial``: some reference object leaves a sub-field unknown, so keys that differ can match)."""
        approximate = score if self.settings.approximate or partial else None
        return count_matches(reference, candidate, approximate, self.settings.threshold)


def count_matches(
    reference: Sequence[K], candidate: Sequence[K], score: Callable[[K, K], float] | None, threshold: float
) -> int:
    """How many reference items match a candidate item, one to one: equal keys first; then, with a
    ``score``, the remaining pairs scoring at least ``threshold``, greedily, best score first (ties in
    list order)."""
    unmatched = Counter(candidate)
    reference_left: list[K] = []
    for key in reference:
        if unmatched[key] > 0:
            unmatched[key] -= 1
        else:
            reference_left.append(key)
    matched = len(reference) - len(reference_left)
    if score is None or not reference_left or matched == len(candidate):
        return matched
    candidate_left = [key for key, count in unmatched.items() for _ in range(count)]
    pairs = sorted(
        (-similarity, i, j)
        for i, a in enumerate(reference_left)
        for j, b in enumerate(candidate_left)
        if (similarity := score(a, b)) >= threshold
    )
    used_reference: set[int] = set()
    used_candidate: set[int] = set()
    for _, i, j in pairs:
        if i not in used_reference and j not in used_candidate:
            used_reference.add(i)
            used_candidate.add(j)
    return matched + len(used_reference)
