"""A count said with its noun: singular for one, plural otherwise, thousands separated."""

from __future__ import annotations

import pytest

from pipeline.job.text import counted


@pytest.mark.parametrize(
    ("number", "noun", "plural", "said"),
    [
        (1, "record", None, "1 record"),
        (0, "record", None, "0 records"),
        (2, "judged record", None, "2 judged records"),
        (1234, "value", None, "1,234 values"),
        (1.0, "value", None, "1 value"),
        (2.5, "value", None, "2.5 values"),
        (1, "person", "people", "1 person"),
        (3, "person", "people", "3 people"),
        (-1, "record", None, "-1 record"),
    ],
)
def test_a_count_takes_its_nouns_form(number: float, noun: str, plural: str | None, said: str) -> None:
    assert counted(number, noun, plural) == said
