"""``pipeline eval``: one variant's results measured against a gold file, field by field.

Only the gold records' results and failures are read (filtered in SQL). Every gold record without a
result is accounted for: failed (with its class), not extracted yet, or not in the source at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.quality.agreement import measure_agreement
from pipeline.quality.bootstrap import Bootstrap
from pipeline.quality.fields import grounded_paths, schema_fields
from pipeline.quality.gold import Gold, read_gold
from pipeline.quality.intervals import with_intervals
from pipeline.quality.scores import (
    NO_SPREAD,
    TOO_SMALL,
    AgreementReport,
    Interval,
    format_table,
    has_spread,
    some_without_spread,
)
from pipeline.reports.reading import (
    JobOutput,
    Sample,
    StoredFailure,
    StoredResult,
    keys_scope,
    open_output,
    sample_scope,
)
from pipeline.reports.review import ViewBuilder, page, review_records
from pipeline.reports.review_page import ReviewPage, ScoreRow, VariantView
from pipeline.reports.shared import GroundingSummary, grounding_lines, grounding_summary, ids_text
from pipeline.store.read_copy import ReadCopy
from pipeline.wording import counted

GOLD_VIEW = "gold"
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class EvalSettings:
    fields: tuple[str, ...] | None = None  # top-level fields or scored paths; None: what the gold gives
    fuzzy_threshold: float | None = None
    numeric_tolerance: float = 0.0
    review: bool = False  # also build the review page (gold beside the variant)
    sample: Sample | None = None  # only the gold records of this sample of the source (as run --sample)
    bootstrap: Bootstrap = field(default_factory=Bootstrap)  # how the intervals beside every score are drawn


@dataclass(frozen=True, slots=True)
class EvalReport:
    variant: str
    gold: Gold
    agreement: AgreementReport
    grounding: GroundingSummary  # over the scored records (gold records with a result)
    failed: Mapping[str, str]  # gold records without a result whose last try failed: key -> class
    not_extracted: tuple[str, ...]  # gold records in the source with neither result nor failure
    not_in_source: tuple[str, ...]  # gold records whose id is not in the source
    review: ReviewPage | None = None
    read_copy: ReadCopy | None = None  # a run holds the database: read from its copy

    def to_json(self) -> dict[str, Any]:
        """The agreement report's JSON with the variant, the gold file, grounding and missing records."""
        return {
            **self.agreement.to_json(),
            "variant": self.variant,
            "gold": {"path": str(self.gold.path), "records": len(self.gold.records)},
            "grounding": self.grounding.to_json(),
            "failed": dict(self.failed),
            "not_extracted": list(self.not_extracted),
            "not_in_source": list(self.not_in_source),
            "read_copy": self.read_copy.to_json() if self.read_copy else None,
        }


@dataclass(frozen=True, slots=True)
class GoldFound:
    """What one variant has for the gold records: results, failures, and where the rest are."""

    results: dict[str, StoredResult]
    failures: dict[str, StoredFailure]
    in_source: set[str]  # of the gold records with neither


def evaluate(spec: JobSpec, gold_path: str | Path, settings: EvalSettings = EvalSettings()) -> EvalReport:
    """Measure ``spec.variant``'s results against the gold file. Raises :class:`ConfigError` for a bad
    gold file, an unknown field or a variant without results; ``DatabaseLockedError`` while a run
    holds the database."""
    gold = read_gold(Path(gold_path), spec.source.id_column, spec.schema_class)
    with open_output(spec) as output:
        output.require_results(spec.variant)
        gold = gold_in_sample(output, spec, gold, settings.sample)
        found = find_in_gold(output, spec.variant, gold)
        agreement = measure_against_gold(spec, gold.records, found, settings)
        review = _review(spec, output, gold, found.results, agreement) if settings.review else None
        read_copy = output.read_copy
    return dataclasses.replace(eval_report(spec, gold, found, agreement, review), read_copy=read_copy)


def gold_in_sample(output: JobOutput, spec: JobSpec, gold: Gold, sample: Sample | None) -> Gold:
    if sample is None:
        return gold
    in_sample = output.source_keys(sample_scope(spec, sample))
    return dataclasses.replace(gold, records={k: v for k, v in gold.records.items() if k in in_sample})


def find_in_gold(output: JobOutput, variant: str, gold: Gold) -> GoldFound:
    scope = keys_scope(gold.records)
    results = _only(output.results([variant], scope)[variant], gold.records)
    failures = _only(output.failures([variant], scope)[variant], gold.records)
    unaccounted = [key for key in gold.records if key not in results and key not in failures]
    in_source = output.source_keys(keys_scope(unaccounted)) if unaccounted else set()
    return GoldFound(results, failures, in_source)


def measure_against_gold(
    spec: JobSpec, gold: Mapping[str, Any], found: GoldFound, settings: EvalSettings
) -> AgreementReport:
    agreement = measure_agreement(
        gold,
        {key: result.extracted for key, result in found.results.items()},
        schema_fields(spec.schema_class),
        fields=settings.fields,
        numeric_tolerance=settings.numeric_tolerance,
        fuzzy_threshold=settings.fuzzy_threshold,
    )
    return with_intervals(agreement, settings.bootstrap)


def eval_report(
    spec: JobSpec, gold: Gold, found: GoldFound, agreement: AgreementReport, review: ReviewPage | None = None
) -> EvalReport:
    results, failures = found.results, found.failures
    unaccounted = [key for key in gold.records if key not in results and key not in failures]
    return EvalReport(
        variant=spec.variant,
        gold=gold,
        agreement=agreement,
        grounding=grounding_summary(
            grounded_paths(spec.schema_class), [results[key] for key in agreement.record_ids]
        ),
        failed={
            key: failures[key].failure_class for key in gold.records if key in failures and key not in results
        },
        not_extracted=tuple(key for key in unaccounted if key in found.in_source),
        not_in_source=tuple(key for key in unaccounted if key not in found.in_source),
        review=review,
    )


def _only(found: Mapping[str, V], keys: Mapping[str, Any]) -> dict[str, V]:
    """Rows whose key is exactly a gold key (a text id ``"42.0"`` is not gold record ``42``)."""
    return {key: value for key, value in found.items() if key in keys}


def _review(
    spec: JobSpec,
    output: JobOutput,
    gold: Gold,
    results: Mapping[str, StoredResult],
    agreement: AgreementReport,
) -> ReviewPage:
    """The gold beside the variant, over the gold records that have a result."""
    both = [key for key in gold.records if key in results]
    texts = {key: value for key, value in output.texts(keys_scope(both)).items() if key in results}
    builder = ViewBuilder(grounded_paths(spec.schema_class))
    gold_name = GOLD_VIEW if spec.variant != GOLD_VIEW else f"{GOLD_VIEW} file"
    gold_views = {key: VariantView(gold.records[key], None, (), None) for key in both}
    views = {
        gold_name: gold_views,
        spec.variant: builder.views(results, {}, {key: texts.get(key, {}) for key in both}),
    }
    notes = [
        f"gold file {gold.path}: {counted(len(gold.records), 'record')}, {len(both):,} of them with a result "
        f"of {spec.variant}",
        f"disagreement: 1 - the mean field agreement of {spec.variant} with the gold, over the fields "
        "each gold record gives",
        *interval_notes(agreement),
        *builder.note(),
    ]
    records = review_records(texts, views, agreement)
    return page(spec, [gold_name, spec.variant], records, notes, score_rows(agreement), output.read_copy)


def score_rows(agreement: AgreementReport) -> list[ScoreRow]:
    """The page's score table: every field's scores with their intervals, then the overall ones."""
    rows = []
    for score in agreement.fields:
        values = (
            {"precision": score.micro.precision, "recall": score.micro.recall, "f1": score.micro.f1}
            if score.micro
            else {"accuracy": score.accuracy}
        )
        for name, value in values.items():
            rows.append(ScoreRow(score.path, name, value, page_interval(score.ci.get(name)), score.scored))
    micro_f1 = agreement.micro.f1 if agreement.micro else None
    micro_ci, scored = page_interval(agreement.micro_ci.get("f1")), agreement.records_scored
    rows.append(ScoreRow("overall", "micro f1", micro_f1, micro_ci, scored))
    rows.append(ScoreRow("overall", "macro", agreement.macro, page_interval(agreement.macro_ci), scored))
    return rows


def interval_notes(agreement: AgreementReport) -> list[str]:
    """Why the page shows a score without an interval, when it does."""
    if not some_without_spread(agreement):
        return []
    return [f"a score without an interval: {TOO_SMALL} ({NO_SPREAD})"]


def page_interval(interval: Interval | None) -> Interval | None:
    """An interval the page shows; one of no width is none (the page's note says why)."""
    return interval if interval is not None and has_spread(interval) else None


def format_eval(report: EvalReport) -> str:
    """The report as text: the agreement table, the grounded shares, the gold records without a result."""
    gold, variant = report.gold, report.variant
    lines = [f"variant {variant} against {gold.path} ({counted(len(gold.records), 'gold record')})", ""]
    lines += [format_table(report.agreement), ""]
    if report.grounding.shares:
        lines.append(
            f"grounding of {variant} over the {counted(report.agreement.records_scored, 'scored record')} "
            "(values of grounded fields found in the record text):"
        )
        lines += grounding_lines(report.grounding)
    else:
        lines.append("grounding: the schema marks no field grounded")
    lines += ["", *_missing_lines(report)]
    return "\n".join(lines)


def _missing_lines(report: EvalReport) -> list[str]:
    missing = len(report.failed) + len(report.not_extracted) + len(report.not_in_source)
    if not missing:
        return [f"every gold record has a result of {report.variant}"]
    lines = [f"gold records without a result of {report.variant}: {missing:,}"]
    by_class: dict[str, list[str]] = {}
    for key, failure_class in report.failed.items():
        by_class.setdefault(failure_class, []).append(key)
    for failure_class, keys in sorted(by_class.items(), key=lambda item: (-len(item[1]), item[0])):
        lines.append(f"  failed ({failure_class}): {len(keys):,} ({ids_text(keys)})")
    for label, unextracted in (
        ("not extracted yet", report.not_extracted),
        ("not in the source", report.not_in_source),
    ):
        if unextracted:
            lines.append(f"  {label}: {len(unextracted):,} ({ids_text(unextracted)})")
    return lines


def parse_fields(text: str | None) -> tuple[str, ...] | None:
    """``--fields a,b`` as names (None when not given)."""
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ConfigError(f"--fields {text!r}: give field names, separated by commas")
    return names
