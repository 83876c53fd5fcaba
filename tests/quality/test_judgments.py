from __future__ import annotations

from pipeline.quality.fields import FieldKind, schema_fields
from pipeline.quality.judgments import (
    Judgment,
    JudgmentVerdict,
    blind_pair,
    judged_fields,
    judged_paths,
    model_judge,
    values_to_judge,
)
from schemas.linkedin import JobPosting


def test_each_leaf_value_is_judged_once_and_objects_through_their_fields() -> None:
    specs = schema_fields(JobPosting)
    paths = [path.path for path in judged_paths(specs)]
    assert "salary.minimum" in paths and "requirements" in paths and "requirements[].text" not in paths
    extracted = {
        "title": " Data Engineer ",
        "explicit_skills": ["SQL", "Python", "SQL"],
        "salary": {"minimum": 35000.0, "maximum": None, "currency": "GBP"},
        "requirements": [{"text": "SQL", "mandatory": True}, {"text": "SQL", "mandatory": True}],
        "manages_people": False,
    }
    values = [(v.field, v.value) for v in values_to_judge(specs, extracted)]
    assert ("title", "Data Engineer") in values
    assert [v for f, v in values if f == "explicit_skills"] == ["SQL", "Python"]
    assert ("salary.minimum", "35000") in values and not [v for f, v in values if f == "salary.maximum"]
    assert [v for f, v in values if f == "requirements"] == ['{"mandatory":true,"text":"SQL"}']
    assert ("manages_people", "false") in values
    raw = {v.field: v.raw for v in values_to_judge(specs, extracted)}
    assert raw["salary.minimum"] == 35000.0


def test_a_model_judge_is_told_from_a_person_by_its_name() -> None:
    by_model = Judgment("1", "main", "title", "x", JudgmentVerdict.CORRECT, model_judge("gpt-oss"))
    assert by_model.judge == "model:gpt-oss" and by_model.by_model
    assert not Judgment("1", "main", "title", "x", JudgmentVerdict.WRONG, "ann").by_model


def test_judged_fields_are_the_judged_paths_each_with_its_fields_spec() -> None:
    specs = schema_fields(JobPosting)
    fields = judged_fields(specs)
    assert list(fields) == [path.path for path in judged_paths(specs)]
    assert fields["salary.minimum"].kind is FieldKind.NUMBER and fields["salary.minimum"].name == "minimum"
    assert fields["requirements"].kind is FieldKind.OBJECT_LIST
    assert fields["remote_policy"].choices == ("onsite", "hybrid", "remote", "unspecified")


def test_a_blind_pair_is_named_the_same_whatever_the_order_of_its_variants() -> None:
    assert blind_pair(["main", "big"]) == blind_pair(["big", "main"]) == "big,main"
