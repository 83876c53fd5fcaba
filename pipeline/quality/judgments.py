"""What a person (or a model) said of one extracted value: the judgment, the unit of ``eval --judged``.

A judgment names a value by its record, its variant, its field path (``company``, ``salary.minimum``,
``requirements[].text``: the paths of :mod:`pipeline.quality.fields`, where each list item is its own
value) and the value's text as :func:`~pipeline.quality.fields.values_at` shows it. Its verdict is
``correct`` or ``wrong`` for a value the model gave, or ``missing`` for a value the model should have
given and did not (the judge selected it in the record's text): precision counts the first two,
recall all three.

A judgment belongs to the result it judged (``result_key``, made by the store): when the record is
redone, the judgment is kept but *stale*, and stops counting.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

#: Judges whose name starts with this are models (``model:openai/gpt-oss-120b``), all others people.
MODEL_JUDGE_PREFIX = "model:"


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

    @property
    def by_model(self) -> bool:
        return is_model_judge(self.judge)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What one judge says once: a later judgment of the same value by the same judge replaces it."""
        return (self.variant, self.record_id, self.field, self.value, self.judge)


def is_model_judge(judge: str) -> bool:
    return judge.startswith(MODEL_JUDGE_PREFIX)


def model_judge(model: str) -> str:
    """The judge name of judgments made by ``model``."""
    return f"{MODEL_JUDGE_PREFIX}{model}"
