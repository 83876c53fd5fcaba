"""A gold record from judgments: what the judges established in one record, field by field, typed as
the schema wants, in the form :mod:`pipeline.quality.gold` reads.

Only what people said goes in. Per judged path (``title``, ``salary.minimum``, ``requirements``), once
*settled* (every value a judged answer gave there has a verdict):

* its right values, the values judged correct (as the answer has them: a number stays a number) and
  those marked missing (the selected text, read as the field's kind: ``£35,000`` is 35000 for a
  number), make its gold: a list all of them, a single value the first, a nested object's fields
  each at its own path (an object is given with the fields known, the others left out);
* with none, the path is *unknown* and left out: a value judged wrong says what the answer is not,
  not that it is null. Its wrong values go under :data:`~pipeline.quality.judgments.JUDGED_WRONG`,
  so ``eval --gold`` counts an answer that gives one of them as wrong, and any other answer there
  as unknown;
* a path nobody said anything of (no value given, none marked missing) is unknown too: a judge who
  marked nothing missing may not have looked for misses (as ``eval --judged`` says of recall).

So nothing in a gold record is a null or a type the schema's field does not take, and ``eval --gold``
of a judged variant over its settled records counts what ``eval --judged`` counts: each value judged
correct a true positive, each value judged wrong a false positive, each value marked missing a miss.
Pure: no database.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.quality.fields import FieldKind, FieldSpec
from pipeline.quality.gold import FALSE_WORDS, TRUE_WORDS
from pipeline.quality.judgments import JUDGED_WRONG, Judgment, JudgmentVerdict, ValueToJudge, value_text

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
#: (variant, field path, value text) -> the verdict that counts
Verdicts = Mapping[tuple[str, str, str], JudgmentVerdict]


@dataclass(frozen=True, slots=True)
class GoldRecord:
    """One record's gold: what is known right, and where only wrong values are known, those."""

    fields: dict[str, Any] = field(default_factory=dict)  # top-level field -> its gold, nested
    wrong: dict[str, list[Any]] = field(default_factory=dict)  # path -> values judged wrong there
    unreadable: int = 0  # values marked missing that do not read as their field's kind: left out

    def __bool__(self) -> bool:
        return bool(self.fields or self.wrong)

    def to_json(self, id_column: str, record_id: str) -> dict[str, Any]:
        wrong = {JUDGED_WRONG: self.wrong} if self.wrong else {}
        return {id_column: record_id, **self.fields, **wrong}


def latest_verdicts(judgments: Iterable[Judgment]) -> dict[tuple[str, str, str], JudgmentVerdict]:
    """The verdict that counts per value of one record, over judges: the latest (``judgments`` oldest
    first, as the store reads them)."""
    return {(j.variant, j.field, j.value): j.verdict for j in judgments}


def gold_record(
    fields: Mapping[str, FieldSpec], answers: Mapping[str, Sequence[ValueToJudge]], verdicts: Verdicts
) -> GoldRecord:
    """The gold of one record: ``fields`` are the judged paths with their specs
    (:func:`~pipeline.quality.judgments.judged_fields`), ``answers`` the judged variants' values,
    ``verdicts`` what counts of their judgments (and the values marked missing)."""
    known: dict[str, Any] = {}
    wrong: dict[str, list[Any]] = {}
    unreadable = 0
    for path, spec in fields.items():
        said = _said_at(path, answers, verdicts)
        if said is None:
            continue  # not settled: a value given there is not judged yet
        right, judged_wrong, marked = said
        readable = _readable(spec, marked)
        unreadable += len(marked) - len(readable)
        if right or readable:
            found = _once([*right, *readable])
            known[path] = found if spec.kind in (FieldKind.LIST, FieldKind.OBJECT_LIST) else found[0]
        elif judged_wrong:
            wrong[path] = _once(judged_wrong)
    return GoldRecord(_nested(known), wrong, unreadable)


def _said_at(
    path: str, answers: Mapping[str, Sequence[ValueToJudge]], verdicts: Verdicts
) -> tuple[list[Any], list[Any], list[str]] | None:
    """At ``path``: the values judged correct and wrong (as the answers have them) and the texts marked
    missing; None while a value given there has no verdict."""
    right: list[Any] = []
    wrong: list[Any] = []
    for variant, values in answers.items():
        for value in values:
            if value.field != path:
                continue
            verdict = verdicts.get((variant, path, value.value))
            if verdict not in (JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG):
                return None
            (right if verdict is JudgmentVerdict.CORRECT else wrong).append(value.raw)
    marked = [
        text for (_, at, text), said in verdicts.items() if at == path and said is JudgmentVerdict.MISSING
    ]
    return right, wrong, marked


def _readable(spec: FieldSpec, texts: Sequence[str]) -> list[Any]:
    """The texts marked missing that read as the field's kind, so read (the others left out)."""
    readable = []
    for text in texts:
        try:
            readable.append(typed_missing(spec, text))
        except ValueError:
            continue
    return readable


def _once(values: Sequence[Any]) -> list[Any]:
    """Each value once (a value two answers gave, or given and also marked missing), in order."""
    unique: dict[str, Any] = {}
    for value in values:
        unique.setdefault(value_text(value), value)
    return list(unique.values())


def _nested(known: Mapping[str, Any]) -> dict[str, Any]:
    """Path -> value as the record nests it: ``salary.minimum`` is ``{"salary": {"minimum": ...}}``."""
    nested: dict[str, Any] = {}
    for path, value in known.items():
        *parents, name = path.split(".")
        level = nested
        for parent in parents:
            level = level.setdefault(parent, {})
        level[name] = value
    return nested


def typed_missing(spec: FieldSpec, text: str) -> Any:
    """A value marked missing (the text a judge selected) as the field's kind wants it. Raises
    :class:`ValueError` saying what the field takes when the text does not read as it (a gold value
    of another type would be one the schema refuses)."""
    if spec.kind is FieldKind.OBJECT_LIST:
        return _object(spec, text)
    kind = spec.item_kind if spec.kind is FieldKind.LIST else spec.kind
    if kind is FieldKind.NUMBER:
        return _number(text, integer=spec.integer)
    if kind is FieldKind.BOOLEAN:
        word = text.strip().casefold()
        if word not in TRUE_WORDS | FALSE_WORDS:
            raise ValueError(f"{text!r} is not true or false (select yes, no, true or false)")
        return word in TRUE_WORDS
    if kind is FieldKind.CHOICE:
        found = next((choice for choice in spec.choices if str(choice).casefold() == text.casefold()), None)
        if found is None:
            raise ValueError(f"{text!r} is not one of {', '.join(str(choice) for choice in spec.choices)}")
        return found
    return text


def _number(text: str, *, integer: bool) -> int | float:
    match = _NUMBER.search(text)
    if match is None:
        raise ValueError(f"{text!r} has no number in it")
    digits = match.group().replace(",", "")
    number = float(digits)
    if integer and not number.is_integer():
        raise ValueError(f"{text!r} is not a whole number")
    return int(number) if integer or ("." not in digits and number.is_integer()) else number


def _object(spec: FieldSpec, text: str) -> dict[str, Any]:
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
    if first is None:
        raise ValueError(f"{spec.name} has no text field to read {text!r} into: import the object as JSON")
    return {first.name: text}
