from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pipeline.extraction.prompt import PromptBuilder, response_format_for
from pipeline.job.spec import load_job
from schemas.linkedin import JobPosting, unique_case_insensitive
from tests.support.processes import REPO

MINIMAL = {
    "title": "Head of Finance",
    "remote_policy": "hybrid",
    "employment_type": "permanent",
    "working_time": "full-time",
    "seniority": "Head of",
    "manages_people": True,
    "explicit_skills": ["IFRS", "ifrs ", "Budgeting", "budgeting"],
    "inferred_capabilities": ["Board reporting"],
    "requirements": [{"text": "ACA, ACCA or CIMA qualified", "kind": "certification", "mandatory": True}],
}


def test_minimal_posting_and_deduplication() -> None:
    posting = JobPosting.model_validate(MINIMAL)
    assert posting.explicit_skills == ["IFRS", "Budgeting"]
    assert posting.salary is None and posting.culture_signals == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seniority": "senior-ish"}, "seniority"),
        ({"salary": {"minimum": 80000, "maximum": 60000}}, "salary minimum is larger than maximum"),
        ({"experience_years": {"minimum": 8, "maximum": 3}}, "experience minimum is larger than maximum"),
        (
            {"requirements": [{"text": "x" * 300, "kind": "skill", "mandatory": True}]},
            "at most 200 characters",
        ),
        ({"unknown": 1}, "Extra inputs are not permitted"),
    ],
)
def test_rejects_what_needs_the_model_again(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JobPosting.model_validate({**MINIMAL, **change})


def test_specific_seniority_levels_exist() -> None:
    levels = JobPosting.model_json_schema()["properties"]["seniority"]["enum"]
    assert {"Director", "Head of", "Principal", "Graduate", "C-level"} <= set(levels)


def test_descriptions_reach_the_prompt_and_the_response_format() -> None:
    spec = load_job(REPO / "jobs" / "linkedin.yaml")
    system = PromptBuilder(spec).system_message["content"]
    assert "ONE atomic requirement" in system
    schema = response_format_for(JobPosting)["json_schema"]["schema"]
    assert schema["additionalProperties"] is False


def test_sample_data_is_well_formed() -> None:
    lines = (REPO / "data" / "sample_postings.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) >= 10
    assert len({row["id"] for row in rows}) == len(rows)
    assert all(set(row) == {"id", "title", "company", "location", "description"} for row in rows)


def test_unique_case_insensitive() -> None:
    assert unique_case_insensitive(["SQL", "sql", " Python", "python ", "Go"]) == ["SQL", " Python", "Go"]


def test_every_list_and_string_is_bounded() -> None:
    """Constrained decoding enforces these bounds, so a looping model must close the JSON."""
    schema = JobPosting.model_json_schema()
    unbounded: list[str] = []

    def visit(node: object, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "array" and "maxItems" not in node:
                unbounded.append(path)
            if node.get("type") == "string" and not {"maxLength", "enum", "pattern", "const"} & set(node):
                unbounded.append(path)
            for key, value in node.items():
                visit(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, f"{path}[{index}]")

    visit(schema, "$")
    assert unbounded == []
