"""A run's profile, field by field, on hand-made extractions whose numbers are known exactly."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.quality.found_share import FoundShare
from pipeline.quality.profile import TOP_VALUES, is_empty, profile_fields
from tests.support.quality_schemas import posting_fields

EXTRACTIONS: list[dict[str, Any]] = [
    {"title": "Data Engineer", "level": "senior", "remote": True, "skills": ["SQL", "Python"], "pay": None},
    {"title": "Data Engineer", "level": "junior", "remote": False, "skills": ["SQL"], "pay": {"low": 1.0}},
    {"title": "  ", "level": "senior", "remote": True, "skills": [], "pay": {}},
    {"title": "Analyst", "level": "senior", "remote": True, "skills": ["SQL", "Excel", "SQL"]},
]


def profiled() -> dict[str, dict[str, Any]]:
    return profile_fields(
        posting_fields(), EXTRACTIONS, {"skills": FoundShare(5, 6), "title": FoundShare(2, 3)}
    )


@pytest.mark.parametrize(
    ("value", "empty"),
    [
        (None, True),
        ("", True),
        (" \n", True),
        ([], True),
        ({}, True),
        (0, False),
        (False, False),
        ("x", False),
        ([None], False),
    ],
)
def test_what_counts_as_empty(value: Any, empty: bool) -> None:
    assert is_empty(value) is empty


def test_fill_rates_count_blank_text_empty_lists_and_empty_objects_as_unfilled() -> None:
    fields = profiled()
    assert list(fields) == [spec.name for spec in posting_fields()]  # schema order, every field
    assert (fields["title"]["filled"], fields["title"]["fill_rate"]) == (3, 0.75)
    assert fields["skills"]["fill_rate"] == 0.75
    assert fields["pay"]["fill_rate"] == 0.25  # null, {} and missing are unfilled
    assert fields["company"] == fields["company"] | {"records": 4, "filled": 0, "fill_rate": 0.0, "top": []}


def test_lists_have_their_mean_length_and_item_shares() -> None:
    skills = profiled()["skills"]
    assert skills["mean_length"] == pytest.approx((2 + 1 + 0 + 3) / 4)
    assert skills["length_sd"] == pytest.approx(1.2909944, abs=1e-6)
    # items: the share of filled results that have each (SQL twice in one record counts once)
    assert skills["top"] == [["SQL", 1.0], ["Python", 1 / 3], ["Excel", 1 / 3]]
    assert skills["shares"] is None  # text items: shown, not judged value by value
    assert skills["grounded"] == {"found": 5, "values": 6, "share": 5 / 6}


def test_choices_and_booleans_have_every_value_s_share() -> None:
    fields = profiled()
    assert fields["level"]["shares"] == {"senior": 0.75, "junior": 0.25}
    assert fields["level"]["top"] == [["senior", 0.75], ["junior", 0.25]]
    assert fields["remote"]["shares"] == {"true": 0.75, "false": 0.25}
    assert fields["title"]["top"] == [["Data Engineer", 2 / 3], ["Analyst", 1 / 3]]  # short text
    assert fields["title"]["distinct"] == 2 and fields["level"]["distinct"] == 2


def test_long_text_is_not_listed_and_top_values_are_capped() -> None:
    prose = [{"title": f"A long description of the role number {n} with many words in it"} for n in range(3)]
    assert profile_fields(posting_fields(), prose)["title"]["top"] == []
    many = [{"skills": [f"skill {n}" for n in range(20)]}]
    assert len(profile_fields(posting_fields(), many)["skills"]["top"]) == TOP_VALUES


def test_no_records_is_no_rates() -> None:
    title = profile_fields(posting_fields(), [])["title"]
    assert (title["records"], title["fill_rate"], title["mean_length"], title["grounded"]) == (
        0,
        None,
        None,
        None,
    )
