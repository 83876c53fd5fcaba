"""The review page of a job's results (``pipeline review``, and ``--html`` of ``eval`` and ``compare``):
records with their text as sent, each variant's extraction or failure, and where its grounded values
are in the text.

Grounding comes from what the run stored. A result stored without it (made before grounding was
recorded), or whose spans no longer fit the text shown (the record was edited since), is grounded
again here against the text on the page, with the run's own rules, so every highlight is right.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.job.spec import JobSpec
from pipeline.quality.agreement import id_order, measure_agreement
from pipeline.quality.fields import grounded_paths, schema_fields, top_field
from pipeline.quality.grounding import GroundedValue, MatchKind, ground
from pipeline.quality.scores import AgreementReport
from pipeline.reports.reading import (
    Sample,
    Scope,
    StoredFailure,
    StoredResult,
    open_output,
    sample_scope,
)
from pipeline.reports.review_page import ReviewPage, ReviewRecord, ScoreRow, VariantView
from pipeline.reports.shared import schema_extraction
from pipeline.store.read_copy import ReadCopy
from pipeline.wording import counted

#: The threshold the run grounds with (:meth:`pipeline.quality.grounding.Grounder.for_schema`).
GROUNDING_FUZZY_THRESHOLD = 90.0
DISAGREEMENT_NOTE = (
    "disagreement: 1 - the mean field agreement of {b} with {a} as the reference, over the records "
    "both extracted (none where one of them has no result)"
)

Views = Mapping[str, VariantView]  # record key -> one variant's view


@dataclass(slots=True)
class ViewBuilder:
    """Builds each variant's view of a record, counting the results grounded again on the way."""

    grounded_paths: tuple[str, ...]
    regrounded: int = 0

    def views(
        self,
        results: Mapping[str, StoredResult],
        failures: Mapping[str, StoredFailure],
        texts: Mapping[str, Mapping[str, str]],
    ) -> dict[str, VariantView]:
        """record key -> view, for every record of ``texts`` with a result or a failure."""
        views: dict[str, VariantView] = {}
        for key, record_texts in texts.items():
            result, failure = results.get(key), failures.get(key)
            if result is None and failure is None:
                continue
            views[key] = VariantView(
                extraction=result.extracted if result else None,
                failure=f"{failure.failure_class}: {failure.message}" if failure else None,
                grounding=self._spans(result, record_texts) if result else (),
                model=result.model if result else failure.model if failure else None,
                chunks=result.chunks if result else None,
            )
        return views

    def _spans(self, result: StoredResult, texts: Mapping[str, str]) -> tuple[GroundedValue, ...]:
        if not self.grounded_paths:
            return ()
        stored = result.grounding
        if stored is not None and all(fits(span, texts) for span in stored):
            return stored
        self.regrounded += 1
        grounding = ground(
            result.extracted, texts, self.grounded_paths, fuzzy_threshold=GROUNDING_FUZZY_THRESHOLD
        )
        return grounding.values

    def note(self) -> list[str]:
        if not self.regrounded:
            return []
        return [
            f"grounding of {counted(self.regrounded, 'result')} located again in the text shown (stored "
            "without grounding, or the record's text changed since it was extracted)"
        ]


def fits(span: GroundedValue, texts: Mapping[str, str]) -> bool:
    """Whether a stored span still locates its value in ``texts``."""
    if not span.found:
        return True
    text = texts.get(span.source_field or "")
    if text is None or span.start is None or span.end is None or not 0 <= span.start <= span.end <= len(text):
        return False
    return span.match != MatchKind.EXACT or text[span.start : span.end] == span.value


def review_records(
    texts: Mapping[str, Mapping[str, str]],
    views: Mapping[str, Views],
    agreement: AgreementReport | None,
) -> list[ReviewRecord]:
    """One record per key that some variant has a view of, in id order; with two variants, the
    disagreement and the differing top-level fields from ``agreement``'s per-record results."""
    measured = {record.record_id: record for record in agreement.records} if agreement else {}
    keys = sorted({key for by_key in views.values() for key in by_key}, key=id_order)
    records = []
    for key in keys:
        scored = measured.get(key)
        differing = (
            dict.fromkeys(top_field(difference.path) for difference in scored.differences) if scored else {}
        )
        records.append(
            ReviewRecord(
                record_id=key,
                texts=texts.get(key, {}),
                variants={name: by_key[key] for name, by_key in views.items() if key in by_key},
                disagreement=scored.disagreement if scored else None,
                differing_fields=tuple(differing),
            )
        )
    return records


def variant_agreement(
    spec: JobSpec,
    reference: Mapping[str, StoredResult],
    candidate: Mapping[str, StoredResult],
    fuzzy_threshold: float | None = None,
) -> AgreementReport:
    """Agreement of ``candidate`` with ``reference`` over every field of the schema."""
    specs = schema_fields(spec.schema_class)
    names = [field.name for field in specs]
    return measure_agreement(
        {key: schema_extraction(result.extracted, names) for key, result in reference.items()},
        {key: schema_extraction(result.extracted, names) for key, result in candidate.items()},
        specs,
        fuzzy_threshold=fuzzy_threshold,
    )


def prompt_fields(spec: JobSpec, variants: Sequence[str]) -> tuple[str, ...]:
    """The fields the variants' templates read, each once (a variant may have a template of its own)."""
    fields = (field for name in variants for field in spec.for_variant(name).content_fields())
    return tuple(dict.fromkeys(fields))


def page(
    spec: JobSpec,
    variants: Sequence[str],
    records: Sequence[ReviewRecord],
    notes: Sequence[str],
    scores: Sequence[ScoreRow] = (),
    read_copy: ReadCopy | None = None,
    comparison: Mapping[str, Any] | None = None,
) -> ReviewPage:
    """The page; with ``read_copy`` (a run holds the database), a first note saying how old it is;
    ``comparison``: compare's numbers, shown above the records."""
    if read_copy is not None:
        notes = [f"a run holds the database: read from its copy, {read_copy.describe()}", *notes]
    return ReviewPage(
        job=spec.name,
        variants=tuple(variants),
        fields=tuple(field.name for field in schema_fields(spec.schema_class)),
        grounded_paths=grounded_paths(spec.schema_class),
        records=tuple(records),
        generated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        notes=tuple(notes),
        scores=tuple(scores),
        read_copy=read_copy.describe() if read_copy else None,
        comparison=comparison,
    )


def read_review(spec: JobSpec, variants: Sequence[str], sample: Sample) -> ReviewPage:
    """The review page of one or two variants over the records of ``sample`` that some of them has
    a result or a failure for. Raises :class:`ConfigError` for a variant with neither."""
    with open_output(spec) as output:
        for name in variants:
            output.require_results(name, or_failures=True)
        scope = Scope.all_of(sample_scope(spec, sample), output.attempted_by_any(variants))
        texts = output.texts(scope, prompt_fields(spec, variants))
        results = output.results(variants, scope)
        failures = output.failures(variants, scope)
        read_copy = output.read_copy
    builder = ViewBuilder(grounded_paths(spec.schema_class))
    views = {name: builder.views(results[name], failures[name], texts) for name in variants}
    agreement = (
        variant_agreement(spec, results[variants[0]], results[variants[1]]) if len(variants) == 2 else None
    )
    notes = [f"{sample.describe()}: {len(texts):,} with a result or a failure of {' or '.join(variants)}"]
    if agreement is not None:
        notes.append(DISAGREEMENT_NOTE.format(a=variants[0], b=variants[1]))
    records = review_records(texts, views, agreement)
    return page(spec, variants, records, [*notes, *builder.note()], read_copy=read_copy)
