"""What the judging page is sent: the session, one record, the progress; plain JSON values.

Blindness is decided here, once: with two variants nothing sent names a variant or a model; the answers
are "answer 1" and "answer 2" in the record's own order (:func:`pipeline.judging.session.answer_order`).

A record's texts and grounding spans go through the review page's own conversion
(:func:`pipeline.reports.review_page.page_data`: checked spans, offsets in UTF-16 units as JavaScript
counts them), and each span is tied to the items it locates, so the page highlights the value in focus.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.judging.session import JudgingSession, Progress, SessionRecord
from pipeline.quality.fields import values_at
from pipeline.reports.review_page import MATCH_KINDS, ReviewPage, ReviewRecord, VariantView, page_data

#: The best match first (exact, normalised, fuzzy, none): an item's spans may locate it several ways.
_MATCH_RANK = {kind: rank for rank, kind in enumerate(MATCH_KINDS)}


def session_data(session: JudgingSession, pending: int = 0) -> dict[str, Any]:
    """The session as the page starts from: who judges what, where to start, how far they are."""
    options = session.options
    return {
        "job": session.spec.name,
        "judge": options.judge,
        "blind": options.blind,
        "variant": None if options.blind else options.variants[0],
        "records": len(session.records),
        "start": session.start(),
        "fields": list(session.fields),
        "progress": progress_data(session.progress()),
        "pending": pending,
        "readCopy": session.read_copy.describe() if session.read_copy else None,
    }


def progress_data(progress: Progress) -> dict[str, Any]:
    return {
        "records": progress.records,
        "recordsDone": progress.records_done,
        "values": progress.values,
        "judged": progress.judged,
        "fields": [
            {
                "field": field.field,
                "values": field.values,
                "judged": field.judged,
                "correct": field.correct,
                "wrong": field.wrong,
                "missing": field.missing,
            }
            for field in progress.fields
        ],
    }


def record_data(session: JudgingSession, index: int) -> dict[str, Any]:
    """Record ``index``: its texts, its answers' spans, its items with their verdicts, its missing values."""
    record = session.records[index]
    converted = _converted(session, record)
    answers: list[dict[str, Any]] = []
    for answer, view in zip(record.answers, converted["variants"], strict=True):
        spans = [_span(record, answer.answer_id, span) for span in view["grounding"]]
        label = f"answer {answer.answer_id}" if session.options.blind else answer.variant
        model = None if session.options.blind else answer.view.model
        answers.append({"id": answer.answer_id, "label": label, "model": model, "spans": spans})
    items = []
    for number, item in enumerate(record.items):
        located = [span for a in answers for span in a["spans"] if number in span["items"]]
        verdict = session.item_verdict(record, item)
        items.append(
            {
                "field": item.field,
                "value": item.value,
                "answers": list(item.answers),
                "verdict": None if verdict is None else str(verdict),
                "found": _best_match(located),
            }
        )
    missing = [
        {"field": field, "value": text, "answers": list(ids)} for field, text, ids in session.missing(index)
    ]
    return {
        "index": index,
        "id": record.record_id,
        "texts": converted["texts"],
        "answers": answers,
        "items": items,
        "missing": missing,
        "unjudged": session.unjudged(index),
    }


def _converted(session: JudgingSession, record: SessionRecord) -> dict[str, Any]:
    """The record through the review page's conversion, under its answer ids, without extraction or
    model (what a blind page must not carry)."""
    views = {
        answer.answer_id: VariantView(
            extraction=None, failure=None, grounding=answer.view.grounding, model=None
        )
        for answer in record.answers
    }
    review = ReviewRecord(record.record_id, record.texts, views, disagreement=None, differing_fields=())
    page = ReviewPage(
        job=session.spec.name,
        variants=tuple(views),
        fields=(),
        grounded_paths=(),
        records=(review,),
        generated_at="",
    )
    converted: dict[str, Any] = page_data(page)["records"][0]
    return converted


def _span(record: SessionRecord, answer_id: str, span: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "path": span["path"],
        "value": span["value"],
        "field": span["field"],
        "start": span["start"],
        "end": span["end"],
        "match": span["match"],
        "items": _located_items(record, answer_id, span["path"], str(span["value"])),
    }


def _located_items(record: SessionRecord, answer_id: str, path: str, value: str) -> list[int]:
    """The items of ``answer_id`` that a span of ``path`` = ``value`` locates: the value itself, or an
    object of a list whose sub-field it is (``requirements[].text`` locates a requirement)."""
    found = []
    for number, item in enumerate(record.items):
        if answer_id not in item.answers:
            continue
        if path == item.field and value.strip() == item.value:
            found.append(number)
        elif path.startswith(item.field + "[]."):
            raw = record.raw_value(item)
            if isinstance(raw, Mapping) and value in values_at(raw, path[len(item.field) + 3 :]):
                found.append(number)
    return found


def _best_match(spans: list[dict[str, Any]]) -> str | None:
    """How well the item's value was found in the text: its best span's match (None: not grounded)."""
    if not spans:
        return None
    return str(min(spans, key=lambda span: _MATCH_RANK.get(span["match"], len(MATCH_KINDS)))["match"])
