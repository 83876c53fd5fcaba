"""What a person (or a model) said of one extracted value: the judgment, the unit of ``eval --judged``.

A judgment names a value by its record, its variant, its field path (``company``, ``salary.minimum``,
``requirements[].text``: the paths of :mod:`pipeline.quality.fields`, where each list item is its own
value) and the value's text as :func:`~pipeline.quality.fields.values_at` shows it. Its verdict is
``correct`` or ``wrong`` for a value the model gave, or ``missing`` for a value the model should have
given and did not (the judge selected it in the record's text): precision counts the first two,
recall all three.

A judgment belongs to the result it judged (``result_key``, made by the store): when the record is
redone, the judgment is kept but *stale*, and stops counting.

A judgment made on a blind page (two variants shown as answers 1 and 2) says between which two
(``blind_between``): a blind page shows and counts only its own pair's, so nothing a judge said
seeing a variant's name tells which answer is which; in ``eval`` the latest of a value counts,
blind or not.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from pipeline.quality.fields import FieldKind, FieldSpec, ScoredPath, raw_values_at, scored_paths

#: Judges whose name starts with this are models (``model:openai/gpt-oss-120b``), all others people.
MODEL_JUDGE_PREFIX = "model:"
#: The key of a gold record (one ``judge --export-gold`` writes) that lists, per field path, the values
#: judged wrong where nothing right is known: ``{"recruiter": ["Hays"]}``. ``eval --gold`` counts an
#: answer giving one of them as wrong, and any other answer there as unknown (not scored). A schema
#: field cannot be named so (Pydantic keeps names with a leading underscore private).
JUDGED_WRONG = "_judged_wrong"


class JudgmentVerdict(StrEnum):
    CORRECT = "correct"  # the value is right for this record
    WRONG = "wrong"  # the value is not (not in the text, or not what the field asks for)
    MISSING = "missing"  # the model should have given this value and did not


@dataclass(frozen=True, slots=True)
class Judgment:
    record_id: str  # as :func:`~pipeline.quality.record_key` makes it
    variant: str
    field: str  # a path of :mod:`pipeline.quality.fields`
    value: str  # the value as shown; for ``missing``, the text the judge selected
    verdict: JudgmentVerdict
    judge: str  # a person's name, or ``model:<model>``
    result_key: str = ""  # which result was judged (the store fills it in)
    judged_at: dt.datetime | None = None
    stale: bool = False  # the record was redone since: kept, but it no longer counts
    judgment_id: str = ""  # the store's id (what undo names)
    blind_between: str = ""  # judged blind: the pair's names (blind_pair); "" when the variant was shown

    @property
    def by_model(self) -> bool:
        return is_model_judge(self.judge)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What one judge says once: a later judgment of the same value by the same judge replaces it."""
        return (self.variant, self.record_id, self.field, self.value, self.judge)


def blind_pair(variants: Sequence[str]) -> str:
    """The name of the pair two variants are judged blind between, whatever their order: ``a,b``."""
    return ",".join(sorted(variants))


def is_model_judge(judge: str) -> bool:
    return judge.startswith(MODEL_JUDGE_PREFIX)


def model_judge(model: str) -> str:
    """The judge name of judgments made by ``model``."""
    return f"{MODEL_JUDGE_PREFIX}{model}"


@dataclass(frozen=True, slots=True)
class ValueToJudge:
    """One value of an extraction, as a judge sees it: its field path, its text, and the value itself."""

    field: str  # ``title``, ``salary.minimum`` (a nested object's field), ``skills``, ``requirements``
    value: str  # how it is stored in a judgment (an object of a list: its compact JSON)
    raw: Any  # as the answer has it (a number stays a number: what a gold file needs)


def judged_paths(specs: Sequence[FieldSpec]) -> tuple[ScoredPath, ...]:
    """The paths whose values are judged: every scalar and list field, a nested object field by field,
    and a list of objects item by item (one requirement is one value: its text, kind and flags are
    right or wrong together, as a reader judges them)."""
    return tuple(path for path in scored_paths(specs) if path.in_overall)


def judged_fields(specs: Sequence[FieldSpec], prefix: str = "") -> dict[str, FieldSpec]:
    """Each judged path (:func:`judged_paths`, in the same order) with its field's spec: what a value
    there is (a number, a choice, an object of a list)."""
    found: dict[str, FieldSpec] = {}
    for spec in specs:
        path = f"{prefix}{spec.name}"
        if spec.kind is FieldKind.OBJECT:
            found.update(judged_fields(spec.subfields, f"{path}."))
        else:
            found[path] = spec
    return found


def values_to_judge(specs: Sequence[FieldSpec], extracted: Mapping[str, Any]) -> list[ValueToJudge]:
    """The values of one extraction, path by path in schema order, each list item its own value (a
    repeated item once); null and empty values give nothing to judge (a value the model should have
    given is marked ``missing``)."""
    found: list[ValueToJudge] = []
    for path in judged_paths(specs):
        seen: set[str] = set()
        for raw in raw_values_at(extracted, path.path):
            text = value_text(raw)
            if text and text not in seen:
                seen.add(text)
                found.append(ValueToJudge(path.path, text, raw))
    return found


def value_text(raw: Any) -> str:
    """A value as judgments store it: text stripped, ``35000`` for 35000.0, ``true``/``false``."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, float) and raw.is_integer():
        return str(int(raw))
    if isinstance(raw, str):
        return raw.strip()
    if isinstance(raw, (int, float)):
        return str(raw)
    return orjson.dumps(raw, option=orjson.OPT_SORT_KEYS).decode()
