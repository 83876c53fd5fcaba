"""Gold records from judgments: only what people established (right values of settled paths; wrong ones
where nothing right is known), every value of the type the schema's field takes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.judging.gold_records import GoldRecord, gold_record, typed_missing
from pipeline.quality.fields import schema_fields
from pipeline.quality.judgments import JUDGED_WRONG, JudgmentVerdict, judged_fields, values_to_judge
from schemas.linkedin import JobPosting
from tests.support.schemas import Item

C, W, M = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING
ITEM = {"title": "Data Engineer", "skills": ["SQL", "Python"], "years": 3, "low": 1, "high": 2}


def gold(
    schema: type[BaseModel], extracted: dict[str, Any], verdicts: dict[tuple[str, str], JudgmentVerdict]
) -> GoldRecord:
    specs = schema_fields(schema)
    return gold_record(
        judged_fields(specs),
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
    found = gold(Item, ITEM, said)
    assert found.fields == {"title": "Data Engineer", "skills": ["SQL", "Excel"]} and found.wrong == {}
    half = {("skills", "SQL"): C}  # Python not judged yet: skills is not settled
    assert not gold(Item, ITEM, half)


def test_a_value_judged_wrong_leaves_its_field_unknown_not_null_and_says_what_it_is_not() -> None:
    said = {
        ("title", "Data Engineer"): W,
        ("title", "Senior Data Engineer"): M,
        ("skills", "SQL"): W,
        ("skills", "Python"): W,
        ("years", "3"): W,
        ("low", "1"): C,
        ("high", "2"): W,
    }
    found = gold(Item, ITEM, said)
    assert found.fields == {"title": "Senior Data Engineer", "low": 1}  # a missing value is gold
    # Nothing right is known of skills, years and high: left out, with what they are not.
    assert found.wrong == {"skills": ["SQL", "Python"], "years": [3], "high": [2]}
    assert found.to_json("id", "7") == {
        "id": "7",
        "title": "Senior Data Engineer",
        "low": 1,
        JUDGED_WRONG: {"skills": ["SQL", "Python"], "years": [3], "high": [2]},
    }


def test_nested_objects_give_only_their_known_fields_and_untouched_fields_stay_unknown() -> None:
    extracted = {
        "title": "Dev",
        "recruiter": "Hays",
        "requirements": [{"text": "Python", "kind": "skill", "mandatory": True}],
        "salary": {"minimum": 35000.0, "maximum": None, "currency": "GBP", "period": "year", "text": "£35k"},
        "education": {"level": "bachelor", "fields": [], "mandatory": False},
    }
    specs = schema_fields(JobPosting)
    values = values_to_judge(specs, extracted)
    said = {("main", v.field, v.value): C for v in values}
    said[("main", "recruiter", "Hays")] = W
    said[("main", "education.mandatory", "false")] = W
    said[("main", "salary.maximum", "£45,000")] = M
    said[("main", "requirements", "a driving licence")] = M
    found = gold_record(judged_fields(specs), {"main": values}, said)
    assert found.fields["salary"] == {
        "minimum": 35000.0,
        "maximum": 45000,
        "currency": "GBP",
        "period": "year",
        "text": "£35k",
    }
    assert found.fields["education"] == {"level": "bachelor"}  # mandatory unknown: no null for a bool
    assert found.fields["requirements"] == [
        {"text": "Python", "kind": "skill", "mandatory": True},
        {"text": "a driving licence"},
    ]
    assert "recruiter" not in found.fields  # judged wrong: unknown, not null
    assert found.wrong == {"recruiter": ["Hays"], "education.mandatory": [False]}
    # Read, but nobody said a word of them (nothing given, nothing marked missing): unknown.
    assert "experience_years" not in found.fields and "explicit_skills" not in found.fields
    assert None not in _leaves(found.fields)
    # Every value of the type the schema's field takes (the partial requirement aside: kind unknown).
    JobPosting.model_validate({**_complete(), **found.fields, "requirements": []})


def test_two_answers_give_the_right_value_of_either_and_the_wrong_only_when_nothing_is_right() -> None:
    specs = schema_fields(Item)
    answers = {
        "main": values_to_judge(specs, ITEM),
        "big": values_to_judge(specs, {**ITEM, "title": "Engineer", "years": 4}),
    }
    said = {(variant, "title", "Data Engineer"): C for variant in ("main", "big")}
    said |= {("big", "title", "Engineer"): W, ("main", "years", "3"): W, ("big", "years", "4"): W}
    found = gold_record(judged_fields(specs), answers, said)
    assert found.fields == {"title": "Data Engineer"}
    assert found.wrong == {"years": [3, 4]}


def test_missing_text_is_read_as_the_fields_kind_or_refused_saying_what_it_takes() -> None:
    fields = {spec.name: spec for spec in schema_fields(JobPosting)}
    salary = {spec.name: spec for spec in fields["salary"].subfields}
    years = {spec.name: spec for spec in fields["experience_years"].subfields}
    assert typed_missing(salary["minimum"], "£35,000.50") == 35000.5
    assert typed_missing(years["minimum"], "5+ years") == 5
    assert typed_missing(fields["manages_people"], "Yes") is True
    assert typed_missing(fields["remote_policy"], "Hybrid") == "hybrid"
    assert typed_missing(fields["requirements"], "a driving licence") == {"text": "a driving licence"}
    with pytest.raises(ValueError, match="'competitive' has no number in it"):
        typed_missing(salary["minimum"], "competitive")
    with pytest.raises(ValueError, match=r"'2\.5 years' is not a whole number"):
        typed_missing(years["minimum"], "2.5 years")
    with pytest.raises(ValueError, match="'sort of senior' is not one of Intern, Apprentice"):
        typed_missing(fields["seniority"], "sort of senior")
    with pytest.raises(ValueError, match="'maybe' is not true or false"):
        typed_missing(fields["manages_people"], "maybe")


def test_a_missing_value_that_does_not_read_as_its_kind_is_left_out_and_counted() -> None:
    said = {("years", "3"): W, ("years", "a few years"): M, ("low", "1"): C}
    found = gold(Item, ITEM, said)
    assert found.fields == {"low": 1} and found.wrong == {"years": [3]} and found.unreadable == 1


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _complete() -> dict[str, Any]:
    """A valid posting: the fields a gold record may leave out, so its own can be checked by the schema."""
    return {
        "title": "Dev",
        "remote_policy": "onsite",
        "employment_type": "permanent",
        "working_time": "full-time",
        "seniority": "Junior",
        "manages_people": False,
        "explicit_skills": [],
        "inferred_capabilities": [],
    }
