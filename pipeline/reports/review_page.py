"""The review page: one self-contained HTML file in which a person checks extractions by eye.

``render_review`` turns a :class:`ReviewPage` into a whole HTML document; ``write_review`` writes it
atomically. The page is the template ``review_page.html`` (markup, one style, one script) plus the data
as JSON in ``<script type="application/json" id="review-data">``; the page's script renders every card
in the browser, with ``textContent`` only, and keeps its filters in the URL fragment.

Safety and self-containment are enforced, not hoped for, by :mod:`pipeline.reports.html_page` (shared
with every page the pipeline writes): the JSON is escaped so that no record text can end its script
element (``</script>``, ``<!--``), and a Content-Security-Policy allows exactly the template's own
script and style (by hash) and nothing else: no injected script, and no network request of any kind.

A compare page (``pipeline compare --html``) also carries the numbers ``compare`` prints, as its
``--json`` gives them (:attr:`ReviewPage.comparison`): the page shows them above the records.

Grounding offsets arrive as Python ``str`` offsets (code points); JavaScript strings count UTF-16
units, so offsets are converted here and highlights after an emoji still land on the right text.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.quality.grounding import GroundedValue, MatchKind
from pipeline.reports.html_page import finite, finite_numbers, render_page, write_page

MATCH_KINDS = tuple(str(kind) for kind in MatchKind)
TEMPLATE = importlib.resources.files("pipeline.reports").joinpath("review_page.html")
_DATA_MARKER = "__REVIEW_DATA__"
# What the comparison section cannot do without (the rest of compare's JSON may be missing or null).
_COMPARISON_REQUIRED = {
    "title": str,
    "reference": str,
    "candidate": str,
    "fields": Mapping,
    "variants": Mapping,
}


@dataclass(frozen=True, slots=True)
class VariantView:
    extraction: Mapping[str, Any] | None  # the validated JSON (None: this variant has no result)
    failure: str | None  # failure class + message if it failed
    grounding: Sequence[GroundedValue]
    model: str | None
    chunks: int | None = None  # merged from this many chunks of a long record (None: sent whole)


@dataclass(frozen=True, slots=True)
class ReviewRecord:
    record_id: str
    texts: Mapping[str, str]  # source field -> text, in prompt order (title, description, ...)
    variants: Mapping[str, VariantView]  # variant name -> view; one or two variants
    disagreement: float | None  # 0..1 between two variants (None with one variant)
    differing_fields: Sequence[str]  # top-level field names whose values differ


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One score shown in the page's score table (``pipeline eval --html``), with its interval."""

    path: str  # a scored path, or "overall"
    metric: str  # "accuracy", "f1", "micro f1", ...
    value: float | None
    interval: tuple[float, float] | None  # the 95% interval (None: not drawn)
    records: int  # the records it is over


@dataclass(frozen=True, slots=True)
class ReviewPage:
    job: str
    variants: Sequence[str]  # 1 or 2 names, reference first
    fields: Sequence[str]  # top-level schema field names, in schema order
    grounded_paths: Sequence[str]
    records: Sequence[ReviewRecord]
    generated_at: str  # ISO time, shown in the header
    notes: Sequence[str] = ()  # e.g. "sample of 50 of 1,234 records, seed 0"
    scores: Sequence[ScoreRow] = ()  # eval's scores against the gold file, shown above the records
    read_copy: str | None = None  # a run holds the database: how old the copy read is, in words
    # compare's numbers, as its --json has them (fields, micro, macro, noise, variants, failures_over),
    # with the captions of its text (title, means_over, noise_hint): shown above the records
    comparison: Mapping[str, Any] | None = None


def render_review(page: ReviewPage) -> str:
    """The whole HTML document for ``page``: no external resource, data rendered by the page itself."""
    return render_page(_template(), page_data(page), _DATA_MARKER, name=TEMPLATE.name)


def write_review(page: ReviewPage, path: Path) -> Path:
    """Write the page to ``path`` atomically (a temporary file beside it, then a rename); return ``path``."""
    return write_page(render_review(page), path, "the review page")


def page_data(page: ReviewPage) -> dict[str, Any]:
    """What the page's script reads: plain JSON values, offsets in UTF-16 units, order kept in lists."""
    if not 1 <= len(page.variants) <= 2:
        raise ValueError(f"a review page shows one or two variants, not {len(page.variants)}")
    return {
        "job": page.job,
        "variants": list(page.variants),
        "fields": list(page.fields),
        "groundedPaths": list(page.grounded_paths),
        "generatedAt": page.generated_at,
        "notes": list(page.notes),
        "scores": [
            {
                "path": row.path,
                "metric": row.metric,
                "value": finite(row.value),
                "interval": [finite(bound) for bound in row.interval] if row.interval else None,
                "records": row.records,
            }
            for row in page.scores
        ],
        "comparison": None if page.comparison is None else _comparison_data(page.comparison),
        "records": [_record_data(record, page.variants) for record in page.records],
    }


def _comparison_data(comparison: Mapping[str, Any]) -> dict[str, Any]:
    """``comparison`` as the page's script reads it: checked for what it needs, non-finite numbers null."""
    for key, kind in _COMPARISON_REQUIRED.items():
        if not isinstance(comparison.get(key), kind):
            raise ValueError(
                f"comparison: {key!r} must be a {kind.__name__}, not {comparison.get(key)!r:.60}"
            )
    return dict(finite_numbers(comparison))


@functools.cache
def _template() -> str:
    return TEMPLATE.read_text(encoding="utf-8")


def _record_data(record: ReviewRecord, variants: Sequence[str]) -> dict[str, Any]:
    unknown = sorted(set(record.variants) - set(variants))
    if unknown:
        raise ValueError(
            f"record {record.record_id}: variant {unknown[0]!r} is not one of the page's variants"
        )
    offsets = _Utf16Offsets(record.texts)
    views = [record.variants.get(name) for name in variants]
    return {
        "id": record.record_id,
        "texts": [[field, text] for field, text in record.texts.items()],
        "variants": [
            None if view is None else _variant_data(view, offsets, f"record {record.record_id}")
            for view in views
        ],
        "disagreement": finite(record.disagreement),
        "differing": list(record.differing_fields),
    }


def _variant_data(view: VariantView, offsets: _Utf16Offsets, where: str) -> dict[str, Any]:
    return {
        "extraction": view.extraction,
        "failure": view.failure,
        "model": view.model,
        "chunks": view.chunks,
        "grounding": [_span_data(span, offsets, where) for span in view.grounding],
    }


def _span_data(span: GroundedValue, offsets: _Utf16Offsets, where: str) -> dict[str, Any]:
    if span.match not in MATCH_KINDS:
        raise ValueError(
            f"{where}: {span.path} has match {span.match!r}; use one of {', '.join(MATCH_KINDS)}"
        )
    field, start, end = span.source_field, span.start, span.end
    located = span.found
    if located:
        if field is None or start is None or end is None:
            raise ValueError(
                f"{where}: {span.path} = {span.value!r} is a {span.match} match without a location"
            )
        start, end = offsets.convert(field, start, end, f"{where}: {span.path} = {span.value!r}")
    return {
        "path": span.path,
        "value": span.value,
        "field": field if located else None,
        "start": start if located else None,
        "end": end if located else None,
        "match": str(span.match),  # a StrEnum member is a str too; embed its plain value
        "score": finite(span.score),
        "chunk": span.chunk,
    }


class _Utf16Offsets:
    """Code-point offsets into a record's texts, as UTF-16 offsets (what JavaScript strings count)."""

    def __init__(self, texts: Mapping[str, str]) -> None:
        self._texts = texts
        # Only characters outside the BMP take two UTF-16 units; most texts have none.
        self._astral = {
            field: len(text.encode("utf-16-le")) != 2 * len(text) for field, text in texts.items()
        }

    def convert(self, field: str, start: int, end: int, what: str) -> tuple[int, int]:
        text = self._texts.get(field)
        if text is None:
            raise ValueError(f"{what}: the record has no text field {field!r}")
        if not 0 <= start <= end <= len(text):
            raise ValueError(f"{what}: span {start}..{end} is outside {field!r} ({len(text)} characters)")
        if not self._astral[field]:
            return start, end
        return self._units(text, start), self._units(text, end)

    @staticmethod
    def _units(text: str, index: int) -> int:
        return len(text[:index].encode("utf-16-le")) // 2
