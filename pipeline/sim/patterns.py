"""Strings that match a JSON schema's ``pattern``, as a server's guided decoding writes them.

A walk over the parse tree of the stdlib's own regex parser: literals, classes (negated ones too),
categories, groups and back-references, alternation and repeats. What a walk cannot write on its own
(lookarounds, word boundaries) is checked afterwards: a draw that breaks the pattern is drawn again.
A regex library that writes strings from a pattern (rstr, exrex) walks the same tree and skips the
same lookarounds, so it would add a dependency without adding a pattern this cannot write.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections.abc import Callable, Iterator
from re import _parser  # type: ignore[attr-defined]  # the stdlib's own regex parser: private, so typeshed leaves it out
from typing import Any

# Characters a class, a negated class or "." draws from: mostly letters, as a model's text is.
_POOL = string.ascii_letters + string.digits + " -_.,:;/@#+()'" + "éßøü"
_CATEGORIES: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdigit,
    "CATEGORY_NOT_DIGIT": lambda c: not c.isdigit(),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda c: not c.isspace(),
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
    "CATEGORY_NOT_WORD": lambda c: not (c.isalnum() or c == "_"),
}
_REPEAT_CAP = 4096  # an unbounded repeat's maximum (re's MAXREPEAT) as a count that can be drawn
_LONGEST_EXACT = 64  # the longest repeat tried count by count, for lengths a short draw misses


class _Walk:
    """One draw of a string for a parsed pattern."""

    def __init__(self, rng: random.Random, spread: int, exact: bool) -> None:
        self._rng = rng
        self._spread = spread  # how far past its least a repeat goes: exactly that far, or up to it
        self._exact = exact
        self._groups: dict[int, str] = {}

    def tokens(self, tokens: Any) -> str:
        return "".join(self._token(str(op), value) for op, value in tokens)

    def _token(self, name: str, value: Any) -> str:
        if name == "LITERAL":
            return chr(value)
        if name == "NOT_LITERAL":
            return self._rng.choice([c for c in _POOL if ord(c) != value])
        if name == "ANY":
            return self._rng.choice(string.ascii_lowercase)
        if name == "IN":
            return self._class(value)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, inner = value
            most = max(low, min(high, _REPEAT_CAP, low + self._spread))
            count = most if self._exact else self._rng.randint(low, most)
            return "".join(self.tokens(inner) for _ in range(count))
        if name == "SUBPATTERN":
            text = self.tokens(value[-1])
            if value[0] is not None:
                self._groups[value[0]] = text
            return text
        if name == "ATOMIC_GROUP":
            return self.tokens(value)
        if name == "BRANCH":
            return self.tokens(self._rng.choice(value[1]))
        if name == "GROUPREF":
            return self._groups.get(value, "")
        if name == "GROUPREF_EXISTS":
            group, yes, no = value
            return self.tokens(yes if group in self._groups else (no or []))
        # Anchors, word boundaries and lookarounds write nothing: the check after the walk sees to them.
        return ""

    def _class(self, items: Any) -> str:
        if items and str(items[0][0]) == "NEGATE":
            allowed = [c for c in _POOL if not _in_class(c, items[1:])]
            return self._rng.choice(allowed or ["\x7f"])
        op, value = self._rng.choice(items)
        name = str(op)
        if name == "LITERAL":
            return chr(value)
        if name == "RANGE":
            return chr(self._rng.randint(value[0], value[1]))
        return self._rng.choice([c for c in _POOL if _in_class(c, [(op, value)])] or ["_"])


def _in_class(char: str, items: Any) -> bool:
    for op, value in items:
        name = str(op)
        if name == "LITERAL" and ord(char) == value:
            return True
        if name == "RANGE" and value[0] <= ord(char) <= value[1]:
            return True
        if name == "CATEGORY" and str(value) in _CATEGORIES and _CATEGORIES[str(value)](char):
            return True
    return False


def matching(
    pattern: str, rng: random.Random, min_length: int = 0, max_length: int | None = None
) -> str | None:
    """A string the pattern matches (searched for, as JSON Schema and Pydantic apply a ``pattern``)
    within the lengths, or None where no draw gave one: a pattern Python's ``re`` cannot read (a Rust
    regex's ``\\p{L}``), lookarounds no draw satisfies, or lengths the pattern cannot meet."""
    try:
        compiled = re.compile(pattern)
        tree = _parser.parse(pattern)
    except re.error:
        return None
    longest = max_length if max_length is not None else math.inf
    for spread, exact in _plans(min_length, max_length):
        text = _Walk(rng, spread, exact).tokens(tree)
        if compiled.search(text) and min_length <= len(text) <= longest:
            return text
    return None


def _plans(min_length: int, max_length: int | None) -> Iterator[tuple[int, bool]]:
    """How the draws go: short repeats first (most patterns take them), then each repeat exactly 0, 1,
    2, ... past its least (a length bound a short draw misses), then longer draws."""
    yield from [(3, False)] * 8
    reach = max_length if max_length is not None else min_length + 8
    yield from ((spread, True) for spread in range(min(reach, _LONGEST_EXACT) + 1))
    yield from ((spread, False) for spread in (8, 16, 32, 64) for _ in range(4))
