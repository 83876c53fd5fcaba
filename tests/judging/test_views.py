"""What the page is sent: spans tied to the items they locate, offsets as JavaScript counts them, and
nothing of who gave a blind answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.job.spec import load_job
from pipeline.judging.session import Answer, JudgingSession, SessionOptions, SessionRecord, items_of
from pipeline.judging.state import JudgeState
from pipeline.judging.views import record_data, session_data
from pipeline.quality.fields import schema_fields
from pipeline.quality.grounding import GroundedValue, MatchKind
from pipeline.quality.judgments import judged_paths, values_to_judge
from pipeline.reports import Sample
from pipeline.reports.review_page import VariantView
from schemas.linkedin import JobPosting

REPO = Path(__file__).resolve().parents[2]
TEXT = "Acme 😀 needs 5 years of Python. Pay: £35,000 a year."
EXTRACTED: dict[str, Any] = {
    "title": "Developer",
    "company": "Acme",
    "requirements": [{"text": "5 years of Python", "kind": "experience", "mandatory": True}],
    "salary": {"minimum": 35000.0, "currency": "GBP", "period": "year", "text": "£35,000"},
}


def span(path: str, value: str, match: str = "exact") -> GroundedValue:
    start = TEXT.find(value)
    if start < 0:
        return GroundedValue(path, value, None, None, None, MatchKind.NONE, 0.0)
    return GroundedValue(path, value, "description", start, start + len(value), MatchKind(match), 100.0)


def session(*variants: str) -> JudgingSession:
    spec = load_job(REPO / "jobs" / "linkedin.yaml")
    specs = schema_fields(JobPosting)
    grounding = (
        span("company", "Acme"),
        span("requirements[].text", "5 years of Python"),
        span("salary.text", "£35,000", "normalised"),
    )
    answers = tuple(
        Answer(
            answer_id,
            variant,
            f"key-{variant}",
            tuple(values_to_judge(specs, EXTRACTED)),
            VariantView(EXTRACTED, None, grounding, model=f"model-of-{variant}"),
        )
        for answer_id, variant in zip(("1", "2"), variants, strict=False)
    )
    paths = [path.path for path in judged_paths(specs)]
    record = SessionRecord("7", {"description": TEXT}, answers, items_of(paths, answers))
    options = SessionOptions(tuple(variants), Sample(10), "ann")
    return JudgingSession(spec, options, [record], JudgeState())


def test_spans_locate_their_items_also_inside_a_list_of_objects_with_utf16_offsets() -> None:
    data = record_data(session("main"), 0)
    items = {item["field"]: (number, item) for number, item in enumerate(data["items"])}
    spans = {span["path"]: span for span in data["answers"][0]["spans"]}
    requirement, _ = items["requirements"]
    assert spans["requirements[].text"]["items"] == [requirement]
    assert items["requirements"][1]["found"] == "exact"
    assert items["salary.text"][1]["found"] == "normalised" and items["title"][1]["found"] is None
    # After the emoji, JavaScript counts one more unit than Python: the page gets JavaScript's offsets.
    assert spans["salary.text"]["start"] == TEXT.find("£35,000") + 1
    assert data["answers"][0]["label"] == "main" and data["answers"][0]["model"] == "model-of-main"


def test_a_blind_record_says_answer_1_and_2_and_nothing_of_who_gave_them() -> None:
    blind = session("main", "zero-shot")
    data = record_data(blind, 0)
    assert [(a["id"], a["label"], a["model"]) for a in data["answers"]] == [
        ("1", "answer 1", None),
        ("2", "answer 2", None),
    ]
    assert all(item["answers"] == ["1", "2"] for item in data["items"])  # the same answer: one item each
    text = str(data) + str(session_data(blind))
    assert "main" not in text and "zero-shot" not in text and "model-of" not in text
