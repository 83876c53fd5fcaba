"""Schema introspection for the quality measures: kinds, sub-fields, grounded paths, values at a path."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.quality.fields import (
    FieldKind,
    grounded_paths,
    raw_values_at,
    schema_fields,
    scored_paths,
    select_paths,
    values_at,
)
from schemas.linkedin import JobPosting
from tests.support.quality_schemas import Colour, Node, Office, Posting, by_name, posting_fields


def test_every_kind_with_optional_and_annotated_unwrapped() -> None:
    kinds = [(spec.name, spec.kind, spec.item_kind, spec.grounded) for spec in posting_fields()]
    assert kinds == [
        ("title", FieldKind.TEXT, None, True),
        ("company", FieldKind.TEXT, None, True),
        ("level", FieldKind.CHOICE, None, False),
        ("colour", FieldKind.CHOICE, None, False),
        ("remote", FieldKind.BOOLEAN, None, False),
        ("headcount", FieldKind.NUMBER, None, False),
        ("skills", FieldKind.LIST, FieldKind.TEXT, True),
        ("tags", FieldKind.LIST, FieldKind.CHOICE, False),
        ("sizes", FieldKind.LIST, FieldKind.NUMBER, False),
        ("parts", FieldKind.OBJECT_LIST, None, False),
        ("pay", FieldKind.OBJECT, None, False),
        ("extra", FieldKind.OTHER, None, False),
        ("either", FieldKind.OTHER, None, False),
    ]


def test_choices_and_sub_fields() -> None:
    specs = by_name(posting_fields())
    assert specs["level"].choices == ("junior", "senior")
    assert specs["colour"].choices == (Colour.RED.value, Colour.GREEN.value) == ("red", "green")
    assert specs["tags"].choices == ("x", "y")
    parts = [(sub.name, sub.kind, sub.grounded) for sub in specs["parts"].subfields]
    assert parts == [
        ("name", FieldKind.TEXT, True),
        ("kind", FieldKind.CHOICE, False),
        ("required", FieldKind.BOOLEAN, False),
        ("weight", FieldKind.NUMBER, False),
    ]
    assert [sub.name for sub in specs["pay"].subfields] == ["low", "high", "currency", "note"]
    assert specs["title"].subfields == () and specs["skills"].subfields == ()


def test_linkedin_schema() -> None:
    specs = by_name(schema_fields(JobPosting))
    assert specs["title"].kind is FieldKind.TEXT  # Annotated[str, StringConstraints(...)]
    assert specs["company"].kind is FieldKind.TEXT  # Name | None
    assert specs["seniority"].kind is FieldKind.CHOICE and "Head of" in specs["seniority"].choices
    assert specs["manages_people"].kind is FieldKind.BOOLEAN
    assert (specs["explicit_skills"].kind, specs["explicit_skills"].item_kind) == (
        FieldKind.LIST,
        FieldKind.TEXT,
    )
    assert specs["requirements"].kind is FieldKind.OBJECT_LIST
    assert [(sub.name, sub.kind) for sub in specs["requirements"].subfields] == [
        ("text", FieldKind.TEXT),
        ("kind", FieldKind.CHOICE),
        ("mandatory", FieldKind.BOOLEAN),
    ]
    assert specs["salary"].kind is FieldKind.OBJECT
    assert by_name(specs["salary"].subfields)["minimum"].kind is FieldKind.NUMBER
    assert by_name(specs["education"].subfields)["fields"].item_kind is FieldKind.TEXT
    assert grounded_paths(JobPosting) == ("company", "recruiter", "explicit_skills", "salary.text")


def test_grounded_paths_follow_the_marks() -> None:
    assert grounded_paths(Posting) == ("title", "company", "skills", "parts[].name", "pay.note")
    # A mark on an object or a list of objects grounds its text sub-fields (and lists of text).
    assert grounded_paths(Office) == (
        "address.street",
        "address.town",
        "address.lines",
        "branches[].street",
        "branches[].town",
        "branches[].lines",
        "floors",
    )


def test_a_model_that_contains_itself_is_described_one_level_deep() -> None:
    (label, children) = schema_fields(Node)
    assert (label.kind, children.kind) == (FieldKind.TEXT, FieldKind.OBJECT_LIST)
    assert [sub.name for sub in children.subfields] == ["label", "children"]
    assert children.subfields[1].subfields == ()


EXTRACTION = {
    "title": "Data Engineer",
    "company": None,
    "skills": ["SQL", "", "Python"],
    "headcount": 3,
    "parts": [
        {"name": "dbt", "kind": "tool", "required": True},
        {"name": "Airflow", "kind": "tool", "required": False, "weight": 0.5},
        {"kind": "skill"},
    ],
    "pay": {"low": 30000, "note": "£30k"},
}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("title", ["Data Engineer"]),
        ("company", []),  # null
        ("missing", []),
        ("skills", ["SQL", "", "Python"]),  # lists flatten; empty strings are the caller's to skip
        ("headcount", []),  # not a string
        ("parts[].name", ["dbt", "Airflow"]),
        ("parts[].kind", ["tool", "tool", "skill"]),
        ("pay.note", ["£30k"]),
        ("pay.high", []),
        ("pay.missing.deeper", []),
        ("title.deeper", []),
    ],
)
def test_values_at(path: str, expected: list[str]) -> None:
    assert values_at(EXTRACTION, path) == expected


def test_raw_values_at_keeps_every_non_null_value() -> None:
    assert raw_values_at(EXTRACTION, "headcount") == [3]
    assert raw_values_at(EXTRACTION, "parts[].required") == [True, False]
    assert raw_values_at(EXTRACTION, "parts[].weight") == [0.5]
    assert raw_values_at(EXTRACTION, "pay.low") == [30000]
    assert raw_values_at({"parts": None}, "parts[].name") == []


def test_scored_paths_expand_objects_and_object_lists() -> None:
    paths = scored_paths(posting_fields())
    assert [(path.path, path.kind, path.in_overall) for path in paths if path.field in ("parts", "pay")] == [
        ("parts", FieldKind.OBJECT_LIST, True),
        ("parts[].name", FieldKind.LIST, False),
        ("parts[].kind", FieldKind.LIST, False),
        ("parts[].required", FieldKind.LIST, False),
        ("parts[].weight", FieldKind.LIST, False),
        ("pay.low", FieldKind.NUMBER, True),
        ("pay.high", FieldKind.NUMBER, True),
        ("pay.currency", FieldKind.TEXT, True),
        ("pay.note", FieldKind.TEXT, True),
    ]
    item_kinds = {path.path: path.item_kind for path in paths if path.kind is FieldKind.LIST}
    assert item_kinds["parts[].kind"] is FieldKind.CHOICE and item_kinds["skills"] is FieldKind.TEXT
    assert len(paths) == 20


def test_select_paths_by_default_takes_what_the_reference_gives() -> None:
    reference: list[dict[str, Any]] = [{"title": "A", "pay": None}, {"skills": []}]
    selected = [path.path for path in select_paths(posting_fields(), reference)]
    assert selected == ["title", "skills", "pay.low", "pay.high", "pay.currency", "pay.note"]


def test_select_paths_by_name_or_path() -> None:
    selected = select_paths(posting_fields(), [], ["parts[].name", "title", "pay"])
    assert [path.path for path in selected] == [
        "title",
        "parts[].name",
        "pay.low",
        "pay.high",
        "pay.currency",
        "pay.note",
    ]


def test_a_field_the_schema_lacks_is_named() -> None:
    with pytest.raises(
        ConfigError, match=r"^field 'skils' is not in the schema \(did you mean 'skills'\?\)$"
    ):
        select_paths(posting_fields(), [], ["skils"])
    hint = r" \(did you mean 'title'\?\)$"
    with pytest.raises(
        ConfigError, match=r"^the reference gives field 'titel', which the schema does not have" + hint
    ):
        select_paths(posting_fields(), [{"title": "A"}, {"titel": "B"}])
