"""A gold record from judgments: what the judges said is right in one record, field by field, typed as
the schema wants, in the form :mod:`pipeline.quality.gold` reads.

A field's gold is the values judged correct (as the answer has them: a number stays a number) and the
values marked missing (the selected text, read as the field's kind: ``£35,000`` is 35000 for a number).
A list gets all of them; a single value the first; a nested object is built field by field. A field
goes into the record only when it is *settled*: every value any judged answer gave for it has a
verdict. A field the judges never touched (no value, nothing marked missing) is only given when the
whole record is settled: the judge read it all, and found nothing missing there, so empty is right.
Pure: no database.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from pipeline.quality.fields import FieldKind, FieldSpec, top_field
from pipeline.quality.gold import FALSE_WORDS, TRUE_WORDS
from pipeline.quality.judgments import Judgment, JudgmentVerdict, ValueToJudge, value_text

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
#: (variant, field path, value text) -> the verdict that counts
Verdicts = Mapping[tuple[str, str, str], JudgmentVerdict]


def latest_verdicts(judgments: Iterable[Judgment]) -> dict[tuple[str, str, str], JudgmentVerdict]:
    """The verdict that counts per value of one record, over judges: the latest (``judgments`` oldest
    first, as the store reads them)."""
    return {(j.variant, j.field, j.value): j.verdict for j in judgments}


def gold_fields(
    specs: Sequence[FieldSpec], answers: Mapping[str, Sequence[ValueToJudge]], verdicts: Verdicts
) -> dict[str, Any]:
    """The gold fields of one record: ``answers`` are the judged variants' values, ``verdicts`` what
    counts of their judgments (and the values marked missing)."""
    judged = (JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG)
    unsettled = {
        value.field
        for variant, values in answers.items()
        for value in values
        if verdicts.get((variant, value.field, value.value)) not in judged
    }
    touched = {top_field(field) for (_, field, _) in verdicts}
    complete = not unsettled
    gold: dict[str, Any] = {}
    for spec in specs:
        if any(top_field(path) == spec.name for path in unsettled):
            continue
        if spec.name in touched or complete:
            gold[spec.name] = _value(spec, spec.name, answers, verdicts)
    return gold


def _value(
    spec: FieldSpec, path: str, answers: Mapping[str, Sequence[ValueToJudge]], verdicts: Verdicts
) -> Any:
    if spec.kind is FieldKind.OBJECT:
        fields = {sub.name: _value(sub, f"{path}.{sub.name}", answers, verdicts) for sub in spec.subfields}
        return fields if any(value not in (None, []) for value in fields.values()) else None
    found = _right_values(path, answers, verdicts) + [
        typed_missing(spec, text)
        for (_, field, text), verdict in verdicts.items()
        if field == path and verdict is JudgmentVerdict.MISSING
    ]
    unique: dict[str, Any] = {}
    for value in found:  # a value two answers gave, or given and also marked missing, once
        unique.setdefault(value_text(value), value)
    if spec.kind in (FieldKind.LIST, FieldKind.OBJECT_LIST):
        return list(unique.values())
    return next(iter(unique.values()), None)


def _right_values(path: str, answers: Mapping[str, Sequence[ValueToJudge]], verdicts: Verdicts) -> list[Any]:
    return [
        value.raw
        for variant, values in answers.items()
        for value in values
        if value.field == path and verdicts.get((variant, path, value.value)) is JudgmentVerdict.CORRECT
    ]


def typed_missing(spec: FieldSpec, text: str) -> Any:
    """A value marked missing (the text a judge selected) as the field's kind wants it; text that does
    not read as that kind stays text (eval then finds it does not match, rather than losing it)."""
    if spec.kind is FieldKind.OBJECT_LIST:
        return _object(spec, text)
    kind = spec.item_kind if spec.kind is FieldKind.LIST else spec.kind
    if kind is FieldKind.NUMBER:
        return _number(text, integer=spec.integer)
    if kind is FieldKind.BOOLEAN:
        word = text.strip().casefold()
        return True if word in TRUE_WORDS else False if word in FALSE_WORDS else text
    if kind is FieldKind.CHOICE:
        return next((choice for choice in spec.choices if str(choice).casefold() == text.casefold()), text)
    return text


def _number(text: str, *, integer: bool) -> Any:
    match = _NUMBER.search(text)
    if match is None:
        return text
    digits = match.group().replace(",", "")
    number = float(digits)
    return int(number) if integer or ("." not in digits and number.is_integer()) else number


def _object(spec: FieldSpec, text: str) -> Any:
    """An object of a list marked missing: its JSON as given (an import may give it whole), else the
    selected text as its first text field (``requirements[].text``), the rest unknown."""
    if text.startswith("{"):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
    texts = [sub for sub in spec.subfields if sub.kind is FieldKind.TEXT]
    first = next((sub for sub in texts if sub.grounded), texts[0] if texts else None)
    return {first.name: text} if first is not None else text
