"""Repetition loops: an answer cut off while it repeated the same stretch of text over and over.

A model decoding greedily (temperature 0) that starts repeating an item repeats it exactly until the
budget runs out, so a loop shows as a periodic end of the text: the same unit (an item, an n-gram,
whitespace) at least :data:`MIN_REPEATS` times in a row, over at least :data:`MIN_LOOP_CHARS`
characters. Digits count as one character, so "item 1", "item 2", ... repeat too. A larger budget only
buys a longer loop, so such an answer is retried another way
(:func:`pipeline.extraction.parse.loop_reask_request`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_REPEATS = 4
MIN_LOOP_CHARS = 64
MAX_UNIT_CHARS = 400
TAIL_CHARS = 8000  # a loop is what the answer ends with: only its end is searched for one
_DIGITS = re.compile(r"[0-9]")
_KEY = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:')


@dataclass(frozen=True, slots=True)
class Loop:
    """How an answer ends: ``unit`` (as first written) ``repeats`` times in a row from ``start``."""

    unit: str
    repeats: int
    start: int
    field: str | None  # the JSON key the loop is under, when one is written before it

    def describe(self) -> str:
        """In words, without quoting the answer (it may carry the record's text)."""
        where = f" in '{self.field}'" if self.field else ""
        return f"the same {len(self.unit)}-character stretch repeated {self.repeats} times{where}"


def find_loop(text: str) -> Loop | None:
    """The loop ``text`` ends with, with its shortest unit; ``None`` when it does not end in one."""
    tail = _DIGITS.sub("0", text[-TAIL_CHARS:])
    for period in range(1, min(MAX_UNIT_CHARS, len(tail) // MIN_REPEATS) + 1):
        needed = max(MIN_LOOP_CHARS, period * MIN_REPEATS) - period
        if needed > len(tail) - period or not _periodic_end(tail, period, needed):
            continue
        whole = _DIGITS.sub("0", text) if len(text) > len(tail) else tail
        stretch = period + _periodic_suffix(whole, period, needed)
        start = len(text) - stretch
        return Loop(text[start : start + period], stretch // period, start, _last_key(text[:start]))
    return None


def _periodic_end(text: str, period: int, length: int) -> bool:
    """Whether each of the last ``length`` characters equals the one ``period`` before it."""
    end = len(text)
    return text[end - length :] == text[end - length - period : end - period]


def _periodic_suffix(text: str, period: int, known: int) -> int:
    """The longest such end, at least ``known`` long (binary search: a shorter end of a periodic end is
    periodic too)."""
    low, high = known, len(text) - period
    while low < high:
        middle = (low + high + 1) // 2
        if _periodic_end(text, period, middle):
            low = middle
        else:
            high = middle - 1
    return low


def _last_key(text: str) -> str | None:
    keys = _KEY.findall(text[-4000:])
    return keys[-1] if keys else None
