"""``pipeline compare``: two variants of a job side by side, on the records both extracted.

* agreement, field by field, of B with A as the reference (the metrics of ``pipeline eval``);
* per variant, over the same records: mean tokens per record (every attempt counted) and latency,
  the grounded share of each grounded path;
* failures, counted over the records *both variants attempted* (each has a result or a failure for
  them), so that a variant is not charged for records the other never tried;
* the records that disagree most, field by field;
* the noise floor (:mod:`pipeline.reports.noise`): per field, A-vs-B agreement beside A against a
  re-run of itself, and whether B is beyond that noise; without a re-run, the commands that make one.

With ``review``, the report also holds its page (``compare --html``): these numbers, as ``--json``
gives them, above both variants' records side by side.

Every agreement has a bootstrap interval. With ``--sample N`` only the records of the seeded sample are
read (the sample of ``pipeline run --sample``: the same records for every variant).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.defaults import DEFAULT_SHOWN
from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.job.variants import rerun_name
from pipeline.quality.bootstrap import Bootstrap
from pipeline.quality.fields import grounded_paths
from pipeline.quality.intervals import with_intervals
from pipeline.quality.scores import AgreementReport, RecordAgreement, format_table
from pipeline.reports.noise import (
    NoiseReport,
    measure_noise,
    noise_floor_hint,
    noise_lines,
)
from pipeline.reports.reading import JobOutput, Sample, Scope, StoredResult, open_output, sample_scope
from pipeline.reports.review import (
    DISAGREEMENT_NOTE,
    ViewBuilder,
    page,
    prompt_fields,
    review_records,
    variant_agreement,
)
from pipeline.reports.review_page import ReviewPage, ReviewRecord
from pipeline.reports.shared import (
    GroundingSummary,
    class_counts,
    grounding_summary,
    shown_value,
)
from pipeline.reports.variants import last_run_options
from pipeline.store.read_copy import ReadCopy
from pipeline.wording import counted

FAILURES_BASE = "over the {records} both variants attempted (each has a result or a failure for them)"


def failures_base(attempted: int) -> str:
    """What compare's failure counts are over: :data:`FAILURES_BASE` with its count said."""
    return FAILURES_BASE.format(records=counted(attempted, "record"))


#: What the page takes of the report's JSON: everything but the matching rules and the disagreements
#: (the page's cards are the records, most differing first).
PAGE_KEYS = (
    "reference",
    "candidate",
    "records",
    "fields",
    "micro",
    "macro",
    "intervals",
    "noise",
    "variants",
    "failures_over",
)


@dataclass(frozen=True, slots=True)
class CompareSettings:
    sample: Sample | None = None
    fuzzy_threshold: float | None = None
    review: bool = False  # also build the review page of both variants
    bootstrap: Bootstrap = field(default_factory=Bootstrap)  # the intervals of every agreement


@dataclass(frozen=True, slots=True)
class VariantSummary:
    name: str
    records: int  # the records both extracted: what the means are over
    prompt_tokens: float | None  # means per record, every attempt counted
    completion_tokens: float | None
    reasoning_tokens: float | None
    latency_s: float | None  # mean of each record's latency summed over its attempts
    failures: Mapping[str, int]  # class -> count, over the records both attempted
    grounding: GroundingSummary

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "tokens_per_record": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "reasoning": self.reasoning_tokens,
            },
            "latency_s_per_record": self.latency_s,
            "failures": dict(self.failures),
            "grounding": self.grounding.to_json(),
        }


@dataclass(frozen=True, slots=True)
class CompareReport:
    reference: str  # A
    candidate: str  # B
    sample: Sample | None
    agreement: AgreementReport  # B against A, over the records both extracted
    variants: tuple[VariantSummary, VariantSummary]  # A, B
    attempted: int  # records both attempted: what the failure counts are over
    noise: NoiseReport | None = None  # None: A has no re-run (A~rerun) to measure the noise floor with
    reference_options: tuple[str, ...] = ()  # the command-line options A was made with: its re-run's too
    review: ReviewPage | None = None
    read_copy: ReadCopy | None = None  # a run holds the database: read from its copy

    def disagreements(self, show: int) -> list[RecordAgreement]:
        """The ``show`` records that disagree most (only records with a differing field)."""
        return [record for record in self.agreement.records if record.differences][:show]

    def to_json(self, show: int = DEFAULT_SHOWN) -> dict[str, Any]:
        agreement = self.agreement.to_json()
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "sample": {"size": self.sample.size, "seed": self.sample.seed} if self.sample else None,
            "records": self.agreement.records_scored,
            "fields": {
                path: data | (self.noise.field_json(path) if self.noise else {})
                for path, data in agreement["fields"].items()
            },
            "micro": agreement["micro"],
            "macro": agreement["macro"],
            "intervals": agreement["intervals"],
            "noise": self.noise.to_json() if self.noise else None,
            "read_copy": self.read_copy.to_json() if self.read_copy else None,
            "matching": agreement["matching"],
            "variants": {summary.name: summary.to_json() for summary in self.variants},
            "failures_over": {"records": self.attempted, "rule": failures_base(self.attempted)},
            "disagreements": [
                {
                    "id": record.record_id,
                    "disagreement": record.disagreement,
                    "differences": [
                        {"path": difference.path, "a": difference.reference, "b": difference.candidate}
                        for difference in record.differences
                    ],
                }
                for record in self.disagreements(show)
            ],
        }


def parse_variants(text: str, *, most: int = 2, least: int = 2) -> tuple[str, ...]:
    """``--variants A,B`` as distinct names; :class:`ConfigError` unless there are ``least``..``most``."""
    names = tuple(name.strip() for name in text.split(","))
    wanted = f"exactly {most}" if least == most else f"{least} or {most}"
    if not least <= len(names) <= most or not all(names):
        raise ConfigError(f"--variants {text!r}: give {wanted} variant names, separated by commas")
    if len(set(names)) != len(names):
        raise ConfigError(f"--variants {text!r}: give {wanted} different variants")
    return names


def compare_variants(
    spec: JobSpec, reference: str, candidate: str, settings: CompareSettings = CompareSettings()
) -> CompareReport:
    """Compare ``candidate`` (B) with ``reference`` (A). Raises :class:`ConfigError` when one of them has
    no results at all; ``DatabaseLockedError`` while a run holds the database."""
    names = (reference, candidate)
    with open_output(spec) as output:
        for name in names:
            output.require_results(name)
        sampled = sample_scope(spec, settings.sample)
        results = output.results(names, Scope.all_of(sampled, output.extracted_by_all(names)))
        attempted = Scope.all_of(sampled, output.attempted_by_all(names))
        failures = output.failures(names, attempted)
        attempted_count = output.count_attempted(names, attempted)
        rerun = _rerun_results(output, names, sampled)
        options = last_run_options(output.connection, spec, reference) if rerun is None else ()
        shown = _review_records(spec, output, names, attempted) if settings.review else None
        read_copy = output.read_copy
    agreement = variant_agreement(spec, results[reference], results[candidate], settings.fuzzy_threshold)
    agreement = with_intervals(agreement, settings.bootstrap)
    noise_settings = (settings.fuzzy_threshold, settings.bootstrap)
    noise = measure_noise(spec, results, names, rerun, noise_settings) if rerun is not None else None
    paths = grounded_paths(spec.schema_class)
    summaries = [
        _summary(name, results[name], class_counts(f.failure_class for f in failures[name].values()), paths)
        for name in names
    ]
    report = CompareReport(
        reference=reference,
        candidate=candidate,
        sample=settings.sample,
        agreement=agreement,
        variants=(summaries[0], summaries[1]),
        attempted=attempted_count,
        noise=noise,
        reference_options=options,
        read_copy=read_copy,
    )
    return report if shown is None else dataclasses.replace(report, review=_review(spec, report, *shown))


def _rerun_results(
    output: JobOutput, names: tuple[str, str], sampled: Scope
) -> dict[str, StoredResult] | None:
    """The re-run of A's results on the records A, B and it all extracted; None when it has none."""
    rerun = rerun_name(names[0])
    if rerun not in output.variants_with_results():
        return None
    scope = Scope.all_of(sampled, output.extracted_by_all([*names, rerun]))
    return output.results([rerun], scope)[rerun]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _summary(
    name: str, results: Mapping[str, StoredResult], failures: Mapping[str, int], paths: Sequence[str]
) -> VariantSummary:
    rows = list(results.values())
    return VariantSummary(
        name=name,
        records=len(rows),
        prompt_tokens=_mean([row.prompt_tokens for row in rows]),
        completion_tokens=_mean([row.completion_tokens for row in rows]),
        reasoning_tokens=_mean([row.reasoning_tokens for row in rows]),
        latency_s=_mean([row.latency_s for row in rows]),
        failures=failures,
        grounding=grounding_summary(paths, rows),
    )


def _review_records(
    spec: JobSpec, output: JobOutput, names: Sequence[str], scope: Scope
) -> tuple[list[ReviewRecord], list[str]]:
    """Both variants over the records both attempted (in the sample), and the page's notes on them."""
    texts = output.texts(scope, prompt_fields(spec, names))
    results = output.results(names, scope)
    failures = output.failures(names, scope)
    builder = ViewBuilder(grounded_paths(spec.schema_class))
    views = {name: builder.views(results[name], failures[name], texts) for name in names}
    agreement = variant_agreement(spec, results[names[0]], results[names[1]])
    notes = [
        f"the {counted(len(texts), 'record')} both variants attempted (a result or a failure each)",
        DISAGREEMENT_NOTE.format(a=names[0], b=names[1]),
        *builder.note(),
    ]
    return review_records(texts, views, agreement), notes


def _review(
    spec: JobSpec, report: CompareReport, records: list[ReviewRecord], notes: list[str]
) -> ReviewPage:
    """The compare page: the report's numbers above the records. Its noise-floor commands name the job
    file and the database in full, so that they work from any folder."""
    data = report.to_json(show=0)
    hint = noise_floor_hint(
        report.reference,
        report.candidate,
        report.sample,
        str(spec.source_file),
        str(spec.database),
        report.reference_options,
    )
    comparison = {key: data[key] for key in PAGE_KEYS} | {
        "title": _title(report),
        "means_over": _means_over(report),
        "noise_hint": hint,
    }
    names = (report.reference, report.candidate)
    return page(spec, names, records, notes, read_copy=report.read_copy, comparison=comparison)


def format_compare(
    report: CompareReport, *, job: str, show: int = DEFAULT_SHOWN, database: str | None = None
) -> str:
    """The report as text; ``job`` (the job file as given) and ``database`` (``--database``, if given)
    go into the noise-floor commands."""
    a, b = report.reference, report.candidate
    lines = [
        _title(report),
        "",
        format_table(report.agreement),
        "",
        *_variant_lines(report),
        "",
        *_disagreement_lines(report, show),
        "",
        *noise_lines(
            report.noise, noise_floor_hint(a, b, report.sample, job, database, report.reference_options)
        ),
    ]
    return "\n".join(lines)


def _title(report: CompareReport) -> str:
    scope = f" ({report.sample.describe()})" if report.sample else ""
    return (
        f"{report.candidate} compared with {report.reference} (the reference) over the "
        f"{counted(report.agreement.records_scored, 'record')} both extracted{scope}"
    )


def _means_over(report: CompareReport) -> str:
    return f"means per record over the {counted(report.agreement.records_scored, 'record')} both extracted"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _variant_lines(report: CompareReport) -> list[str]:
    header = ("variant", "prompt tok", "completion tok", "reasoning tok", "latency s")
    rows = [header] + [
        (
            summary.name,
            _number(summary.prompt_tokens),
            _number(summary.completion_tokens),
            _number(summary.reasoning_tokens),
            _number(summary.latency_s, 2),
        )
        for summary in report.variants
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [f"{_means_over(report)}:"]
    lines += [
        "  "
        + "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return lines + _failure_lines(report) + _grounding_lines(report)


def _failure_lines(report: CompareReport) -> list[str]:
    lines = [f"failures, {failures_base(report.attempted)}:"]
    for summary in report.variants:
        counts = ", ".join(f"{name} {count:,}" for name, count in summary.failures.items())
        lines.append(
            f"  {summary.name}: {sum(summary.failures.values()):,}" + (f" ({counts})" if counts else "")
        )
    return lines


def _grounding_lines(report: CompareReport) -> list[str]:
    shares = [(summary.name, summary.grounding) for summary in report.variants]
    if not shares[0][1].shares:
        return []
    lines = ["grounding (values of grounded fields found in the record text, same records):"]
    for index, share in enumerate(shares[0][1].shares):
        per_variant = " · ".join(f"{name} {grounding.shares[index].describe()}" for name, grounding in shares)
        lines.append(f"  {share.path}: {per_variant}")
    for name, grounding in shares:
        if grounding.without_grounding:
            lines.append(
                f"  ({name}: {counted(grounding.without_grounding, 'result')} stored without grounding)"
            )
    return lines


def _disagreement_lines(report: CompareReport, show: int) -> list[str]:
    differing = [record for record in report.agreement.records if record.differences]
    if not differing:
        return ["no record differs"]
    shown = report.disagreements(show)
    lines = [
        f"records that differ most ({len(shown):,} of {len(differing):,} that differ), per differing "
        f"field {report.reference} | {report.candidate}:"
    ]
    for record in shown:
        lines.append(f"  id {record.record_id}  (disagreement {record.disagreement:.2f})")
        for difference in record.differences:
            a, b = shown_value(difference.reference), shown_value(difference.candidate)
            lines.append(f"    {difference.path}: {a} | {b}")
    return lines
