"""Strings for a schema's ``pattern``: matched as Pydantic applies it (searched), within the lengths."""

from __future__ import annotations

import random
import re

import pytest

from pipeline.sim.patterns import matching

PATTERNS = [
    r"^[A-Z]{3}$",
    r"^\d{2,4}-[a-z]+$",
    r"^(GBP|EUR)$",
    r"^x?y*\w$",
    r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$",  # negated classes
    r"^(?P<q>['\"]).+(?P=q)$",  # a back-reference
    r"^(?=.*\d)(?=.*[A-Z])[A-Za-z\d]{8,12}$",  # lookaheads, met by drawing again
    r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$",  # Pydantic's Decimal pattern before 2.9: a negative lookahead
    r"^\s*(\d*\.?\d+)\s*(\w+)?",  # ByteSize's, unanchored at the end
    r"\bword\b",  # word boundaries
    r"^[\u00e0-\u00ff]{2}\.$",  # a range past ASCII
    r"(?i)^abc$",
    r"^(a|b(c|d))+?$",
    r"^(?:[01]\d|2[0-3]):[0-5]\d$",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_strings_for_patterns(pattern: str) -> None:
    rng = random.Random(3)
    for _ in range(30):
        value = matching(pattern, rng)
        assert value is not None and re.search(pattern, value), value


@pytest.mark.parametrize(("low", "high"), [(5, 8), (0, 1), (20, 20), (1, None), (40, None)])
def test_lengths_are_met_where_a_short_draw_misses_them(low: int, high: int | None) -> None:
    rng = random.Random(4)
    for _ in range(30):
        value = matching(r"^[a-z]+$", rng, low, high)
        assert value is not None and low <= len(value) <= (len(value) if high is None else high)


def test_a_pattern_that_cannot_be_met_or_read_gives_none() -> None:
    """No string at all rather than one that breaks the pattern; the caller falls back to words."""
    rng = random.Random(5)
    assert matching(r"^\p{L}+$", rng) is None  # Rust regex syntax, which Python's re cannot read
    assert matching(r"^(?=\d)[a-z]+$", rng) is None  # a lookahead no draw can satisfy
    assert matching(r"^[a-z]{3}$", rng, 5, 8) is None  # lengths the pattern cannot have
