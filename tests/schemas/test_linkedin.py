from __future__ import annotations

import json
from typing import Any

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


def longest_answer(schema: dict[str, Any], node: dict[str, Any]) -> Any:
    """The longest instance the bounds allow: every list full, every string at its longest."""
    if "$ref" in node:
        return longest_answer(schema, schema["$defs"][node["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in node:
        options = [longest_answer(schema, option) for option in node["anyOf"]]
        return max(options, key=lambda value: len(json.dumps(value)))
    if "enum" in node:
        return max(node["enum"], key=lambda value: len(str(value)))
    kind = node.get("type")
    if kind == "object":
        return {name: longest_answer(schema, sub) for name, sub in node["properties"].items()}
    if kind == "array":
        return [longest_answer(schema, node["items"])] * node["maxItems"]
    if kind == "string":
        return "GBP" if "pattern" in node else "x" * node["maxLength"]  # the one pattern: a currency
    scalars: dict[str, object] = {"integer": 50, "number": 1234567.5, "boolean": False, "null": None}
    return scalars[str(kind)]


def test_the_longest_answer_the_bounds_allow_fits_the_jobs_budget() -> None:
    """A model looping within the bounds must close the JSON before max_tokens (4096) runs out: the
    longest answer is under 14,000 characters, 4,000 tokens even at 3.5 characters a token."""
    schema = JobPosting.model_json_schema()
    longest = json.dumps(longest_answer(schema, schema), separators=(",", ":"))
    assert len(longest) < 14_000
    JobPosting.model_validate_json(longest)  # a valid answer: the bounds are the schema's own
