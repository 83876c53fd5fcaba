"""Gold records from judgments: settled fields only, values typed as the schema wants."""

from __future__ import annotations

from typing import Any

from pipeline.judging.gold_records import gold_fields, typed_missing
from pipeline.quality.fields import schema_fields
from pipeline.quality.judgments import JudgmentVerdict, values_to_judge
from schemas.linkedin import JobPosting
from tests.support.schemas import Item

C, W, M = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING
ITEM = {"title": "Data Engineer", "skills": ["SQL", "Python"], "years": 3, "low": 1, "high": 2}


def gold(
    schema: Any, extracted: dict[str, Any], verdicts: dict[tuple[str, str], JudgmentVerdict]
) -> dict[str, Any]:
    specs = schema_fields(schema)
    return gold_fields(
        specs,
        {"main": values_to_judge(specs, extracted)},
        {("main", field, value): verdict for (field, value), verdict in verdicts.items()},
    )


def test_a_settled_field_gets_its_correct_and_missing_values_an_unsettled_one_nothing() -> None:
    said = {
        ("skills", "SQL"): C,
        ("skills", "Python"): W,
        ("skills", "Excel"): M,
        ("title", "Data Engineer"): C,
    }
    assert gold(Item, ITEM, said) == {"title": "Data Engineer", "skills": ["SQL", "Excel"]}
    half = {("skills", "SQL"): C}  # Python not judged yet: skills is not settled
    assert gold(Item, ITEM, half) == {}


def test_a_wholly_judged_record_gives_every_field_and_typed_values() -> None:
    said = {
        ("title", "Data Engineer"): W,
        ("title", "Senior Data Engineer"): M,
        ("skills", "SQL"): C,
        ("skills", "Python"): C,
        ("years", "3"): W,
        ("years", "5 years"): M,
        ("low", "1"): C,
        ("high", "2"): W,
    }
    assert gold(Item, ITEM, said) == {
        "title": "Senior Data Engineer",
        "skills": ["SQL", "Python"],
        "years": 5,  # the text selected, as the number the field holds
        "low": 1,
        "high": None,  # wrong, and no right value given: nothing is right there
    }


def test_nested_objects_are_built_field_by_field_and_objects_of_lists_kept_whole() -> None:
    extracted = {
        "title": "Dev",
        "requirements": [{"text": "Python", "kind": "skill", "mandatory": True}],
        "salary": {"minimum": 35000.0, "maximum": None, "currency": "GBP", "period": "year", "text": "£35k"},
    }
    specs = schema_fields(JobPosting)
    values = values_to_judge(specs, extracted)
    said = {("main", v.field, v.value): C for v in values}
    said[("main", "salary.maximum", "£45,000")] = M
    said[("main", "requirements", "a driving licence")] = M
    fields = gold_fields(specs, {"main": values}, said)
    assert fields["salary"] == {
        "minimum": 35000.0,
        "maximum": 45000,
        "currency": "GBP",
        "period": "year",
        "text": "£35k",
    }
    assert fields["requirements"] == [
        {"text": "Python", "kind": "skill", "mandatory": True},
        {"text": "a driving licence"},
    ]
    assert fields["experience_years"] is None and fields["explicit_skills"] == []  # read, nothing there


def test_missing_text_is_read_as_the_fields_kind() -> None:
    fields = {spec.name: spec for spec in schema_fields(JobPosting)}
    salary = {spec.name: spec for spec in fields["salary"].subfields}
    assert typed_missing(salary["minimum"], "£35,000.50") == 35000.5
    assert typed_missing(fields["manages_people"], "Yes") is True
    assert typed_missing(fields["remote_policy"], "Hybrid") == "hybrid"
    assert typed_missing(fields["seniority"], "sort of senior") == "sort of senior"  # kept as given
    assert typed_missing(salary["minimum"], "competitive") == "competitive"
