"""``pipeline eval``: one variant's results measured against a gold file, field by field.

Only the gold records' results and failures are read (filtered in SQL). Every gold record without a
result is accounted for: failed (with its class), not extracted yet, or not in the source at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.quality import (
    AgreementReport,
    Gold,
    format_table,
    grounded_paths,
    measure_agreement,
    read_gold,
    schema_fields,
)
from pipeline.quality.review_page import ReviewPage, VariantView
from pipeline.reports.reading import JobOutput, Sample, StoredResult, keys_scope, open_output, sample_scope
from pipeline.reports.review import ViewBuilder, page, review_records
from pipeline.reports.shared import GroundingSummary, grounding_lines, grounding_summary, ids_text

GOLD_VIEW = "gold"
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class EvalSettings:
    fields: tuple[str, ...] | None = None  # top-level fields or scored paths; None: what the gold gives
    fuzzy_threshold: float | None = None
    numeric_tolerance: float = 0.0
    review: bool = False  # also build the review page (gold beside the variant)
    sample: Sample | None = None  # only the gold records of this sample of the source (as run --sample)


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
        }


def evaluate(spec: JobSpec, gold_path: Path, settings: EvalSettings = EvalSettings()) -> EvalReport:
    """Measure ``spec.variant``'s results against the gold file. Raises :class:`ConfigError` for a bad
    gold file, an unknown field or a variant without results; ``DatabaseLockedError`` while a run
    holds the database."""
    gold = read_gold(gold_path, spec.source.id_column, spec.schema_class)
    variant = spec.variant
    with open_output(spec) as output:
        output.require_results(variant)
        if settings.sample is not None:
            in_sample = output.source_keys(sample_scope(spec, settings.sample))
            records = {key: value for key, value in gold.records.items() if key in in_sample}
            gold = dataclasses.replace(gold, records=records)
        scope = keys_scope(gold.records)
        results = _only(output.results([variant], scope)[variant], gold.records)
        failures = _only(output.failures([variant], scope)[variant], gold.records)
        unaccounted = [key for key in gold.records if key not in results and key not in failures]
        in_source = output.source_keys(keys_scope(unaccounted)) if unaccounted else set()
        agreement = measure_agreement(
            gold.records,
            {key: result.extracted for key, result in results.items()},
            schema_fields(spec.schema_class),
            fields=settings.fields,
            numeric_tolerance=settings.numeric_tolerance,
            fuzzy_threshold=settings.fuzzy_threshold,
        )
        review = _review(spec, output, gold, results, agreement) if settings.review else None
    scored = [results[key] for key in gold.records if key in results]
    return EvalReport(
        variant=variant,
        gold=gold,
        agreement=agreement,
        grounding=grounding_summary(grounded_paths(spec.schema_class), scored),
        failed={
            key: failures[key].failure_class for key in gold.records if key in failures and key not in results
        },
        not_extracted=tuple(key for key in unaccounted if key in in_source),
        not_in_source=tuple(key for key in unaccounted if key not in in_source),
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
        f"gold file {gold.path}: {len(gold.records):,} records, {len(both):,} of them with a result "
        f"of {spec.variant}",
        f"disagreement: 1 - the mean field agreement of {spec.variant} with the gold, over the fields "
        "each gold record gives",
        *builder.note(),
    ]
    return page(spec, [gold_name, spec.variant], review_records(texts, views, agreement), notes)


def format_eval(report: EvalReport) -> str:
    """The report as text: the agreement table, the grounded shares, the gold records without a result."""
    gold, variant = report.gold, report.variant
    lines = [f"variant {variant} against {gold.path} ({len(gold.records):,} gold records)", ""]
    lines += [format_table(report.agreement), ""]
    if report.grounding.shares:
        lines.append(
            f"grounding of {variant} over the {report.agreement.records_scored:,} scored records "
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
