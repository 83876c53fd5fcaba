"""Merging a long document's chunk answers field by field: strategies, places in the document, passes."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.extraction.merging import ChunkAnswer, found_in_chunk, merge_passes
from pipeline.quality.grounding import GroundedValue, MatchKind
from tests.job.test_chunking import Declared
from tests.support.schemas import Mentions

FIELDS = ["title", "description"]


def grounded(path: str, value: str, start: int | None, field: str = "description") -> GroundedValue:
    if start is None:
        return GroundedValue(path, value, None, None, None, MatchKind.NONE, 0.0)
    return GroundedValue(path, value, field, start, start + len(value), MatchKind.EXACT, 100.0)


def answer(chunk: int, value: dict[str, Any], *places: GroundedValue, pass_: int = 1) -> ChunkAnswer:
    return ChunkAnswer(
        chunk, pass_, {"title": None, "skills": [], "years": None, "tools": [], **value}, places
    )


def test_lists_are_the_union_of_the_chunks_each_item_once_in_document_order() -> None:
    first = answer(
        1,
        {"skills": ["SQL", "Python"], "tools": ["dbt"]},
        grounded("skills", "SQL", 10),
        grounded("skills", "Python", 50),
    )
    second = answer(
        2,
        {"skills": ["python", "Spark", "Excel"], "tools": ["dbt", "Airflow"]},
        grounded("skills", "python", 50),  # the overlap: the same place again
        grounded("skills", "Spark", 30),
        grounded("skills", "Excel", None),  # not in the text: after those that are
    )
    merged = merge_passes(Mentions, FIELDS, [first, second])
    assert merged.value["skills"] == ["SQL", "Spark", "Python", "Excel"]
    assert merged.value["tools"] == ["dbt", "Airflow"]
    chunks = {(entry.value, entry.chunk) for entry in merged.grounding}
    assert chunks == {("SQL", 1), ("Spark", 2), ("Python", 1), ("Excel", 2)}
    assert merged.added_by_pass == {1: 6}


def test_two_texts_at_one_place_are_one_item() -> None:
    """A fuzzy match: 'Pyton' and 'Python' do not normalise alike, but grounding put both at 50."""
    first = answer(1, {"skills": ["Python"]}, grounded("skills", "Python", 50))
    second = answer(2, {"skills": ["Pyton"]}, dataclasses.replace(grounded("skills", "Pyton", 50), end=56))
    assert merge_passes(Mentions, FIELDS, [first, second]).value["skills"] == ["Python"]


def test_a_scalar_is_the_first_grounded_value_by_place_then_by_chunk() -> None:
    answers = [
        answer(1, {"title": "Made up", "years": 2}),
        answer(2, {"title": "Data Engineer", "years": 5}, grounded("title", "Data Engineer", 900)),
        answer(3, {"title": "Engineer", "years": 3}, grounded("title", "Engineer", 400)),
    ]
    merged = merge_passes(Mentions, FIELDS, answers)
    assert merged.value["title"] == "Engineer" and merged.value["years"] == 5
    in_title = answer(4, {"title": "Lead"}, grounded("title", "Lead", 2000, field="title"))
    assert merge_passes(Mentions, FIELDS, [*answers, in_title]).value["title"] == "Lead"  # an earlier field
    assert merge_passes(Mentions, FIELDS, answers[:1]).value["title"] == "Made up"  # none grounded


def test_most_common_min_and_a_whole_first_list() -> None:
    answers = [
        ChunkAnswer(1, 1, {"a": ["x", "y"], "b": "Remote", "c": 3.0}),
        ChunkAnswer(2, 1, {"a": ["z"], "b": "Hybrid", "c": 1.5}),
        ChunkAnswer(3, 1, {"a": [], "b": "hybrid", "c": None}),
    ]
    merged = merge_passes(Declared, FIELDS, answers)
    assert merged.value == {"a": ["x", "y"], "b": "Hybrid", "c": 1.5}


def test_a_later_pass_adds_only_new_values_the_text_has() -> None:
    first = answer(1, {"skills": ["SQL"], "title": None}, grounded("skills", "SQL", 10))
    again = answer(
        1,
        {"skills": ["SQL", "Kafka", "Rust"], "title": "Lead", "years": 9, "tools": ["vim"]},
        grounded("skills", "SQL", 10),
        grounded("skills", "Kafka", 70),
        grounded("skills", "Rust", None),  # invented: not kept
        grounded("title", "Lead", 3),
        pass_=2,
    )
    merged = merge_passes(Mentions, FIELDS, [first, again])
    assert merged.value == {"title": "Lead", "skills": ["SQL", "Kafka"], "years": None, "tools": []}
    assert merged.added_by_pass == {1: 1, 2: 2}
    assert {(entry.value, entry.pass_) for entry in merged.grounding} == {
        ("SQL", 1),
        ("Kafka", 2),
        ("Lead", 2),
    }


def test_what_a_later_pass_over_a_chunk_is_told() -> None:
    first = answer(1, {"skills": ["SQL", "Go"], "title": "Lead"}, grounded("skills", "SQL", 10))
    second = answer(
        2, {"skills": ["Spark", "Java"]}, grounded("skills", "Spark", 120), grounded("skills", "Java", 900)
    )
    merged = merge_passes(Mentions, FIELDS, [first, second])
    # Chunk 1 is description[0:200]: its own SQL and Go, Spark found inside it by chunk 2, the title.
    told = found_in_chunk(merged, [first], "description", 0, 200)
    assert told == {"title": "Lead", "skills": ["SQL", "Spark", "Go"]}
    assert found_in_chunk(merged, [second], "description", 800, 1000) == {
        "title": "Lead",
        "skills": ["Spark", "Java"],
    }
