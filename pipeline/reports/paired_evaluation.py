"""``pipeline eval --variants A,B``: two variants against one gold file, and whether B is better.

Both are scored on the gold records *both* have a result for, so a variant is not judged on records the
other failed. Per field, the difference B - A of the headline score (F1 for lists, accuracy for the
rest) gets a paired bootstrap interval (:mod:`pipeline.quality.intervals`) and a verdict: ``better``,
``worse``, or ``no detectable difference`` when the interval contains 0; and about how many records
would tell a difference of the size seen from 0, so the user knows whether labelling more gold is worth
it. The overall micro F1 gets the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.job.commands import Asked
from pipeline.job.spec import JobSpec
from pipeline.quality.fields import grounded_paths
from pipeline.quality.gold import read_gold
from pipeline.quality.intervals import Difference, PairedComparison, Verdict, paired_differences
from pipeline.quality.scores import NO_SPREAD, TOO_SMALL, Interval, has_spread, some_without_spread
from pipeline.reports.evaluation import (
    EvalReport,
    EvalSettings,
    eval_report,
    find_in_gold,
    gold_in_sample,
    interval_notes,
    measure_against_gold,
    page_interval,
)
from pipeline.reports.reading import StoredResult, keys_scope, open_output
from pipeline.reports.review import (
    DISAGREEMENT_NOTE,
    ViewBuilder,
    page,
    prompt_fields,
    review_records,
    variant_agreement,
)
from pipeline.reports.review_page import ReviewPage, ScoreRow
from pipeline.wording import counted


@dataclass(frozen=True, slots=True)
class PairedEvalReport:
    a: EvalReport  # scored over the gold records both variants have a result for
    b: EvalReport
    comparison: PairedComparison
    review: ReviewPage | None = None  # A beside B on those records, with both scores and B - A

    @property
    def records(self) -> int:
        return self.a.agreement.records_scored

    def to_json(self) -> dict[str, Any]:
        a, b = self.a.agreement.to_json(), self.b.agreement.to_json()
        fields = {
            path: {
                "kind": a["fields"][path]["kind"],
                "a": a["fields"][path],
                "b": b["fields"][path],
                "difference": difference.to_json(),
            }
            for path, difference in self.comparison.fields.items()
        }
        return {
            "variants": {"a": self.a.variant, "b": self.b.variant},
            "gold": {"path": str(self.a.gold.path), "records": len(self.a.gold.records)},
            "records": self.records,
            "fields": fields,
            "micro": {"a": a["micro"], "b": b["micro"], "difference": self.comparison.micro_f1.to_json()},
            "macro": {"a": a["macro"], "b": b["macro"]},
            "intervals": a["intervals"],
            "difference_intervals": self.comparison.rule,
            "matching": a["matching"],
            "missing": {"a": _missing(self.a), "b": _missing(self.b)},
            "grounding": {"a": self.a.grounding.to_json(), "b": self.b.grounding.to_json()},
            "read_copy": self.a.read_copy.to_json() if self.a.read_copy else None,
        }


def _missing(report: EvalReport) -> dict[str, Any]:
    return {
        "failed": dict(report.failed),
        "not_extracted": list(report.not_extracted),
        "not_in_source": list(report.not_in_source),
    }


def evaluate_pair(
    spec: JobSpec, gold_path: str | Path, variants: Sequence[str], settings: EvalSettings | None = None
) -> PairedEvalReport:
    """Variant ``variants[1]`` (B) against ``variants[0]`` (A), both measured against the gold file on
    the gold records both have a result for. Raises :class:`ConfigError` as :func:`evaluate` does."""
    settings = settings or EvalSettings()
    specs = [spec.for_variant(name) for name in variants]
    gold = read_gold(Path(gold_path), spec.source.id_column, spec.schema_class)
    with open_output(spec) as output:
        for name in variants:
            output.require_results(name)
        gold = gold_in_sample(output, spec, gold, settings.sample)
        found = [find_in_gold(output, name, gold) for name in variants]
        both = {key: value for key, value in gold.records.items() if all(key in f.results for f in found)}
        texts = output.texts(keys_scope(both), prompt_fields(spec, variants)) if settings.review else {}
        read_copy = output.read_copy
    reports = [
        dataclasses.replace(
            eval_report(one, gold, one_found, measure_against_gold(one, both, one_found, settings)),
            read_copy=read_copy,
        )
        for one, one_found in zip(specs, found, strict=True)
    ]
    comparison = paired_differences(reports[0].agreement, reports[1].agreement, settings.bootstrap)
    pair = PairedEvalReport(reports[0], reports[1], comparison)
    if not settings.review:
        return pair
    results = [{key: f.results[key] for key in both} for f in found]
    return dataclasses.replace(pair, review=_pair_page(spec, pair, results, texts))


def _pair_page(
    spec: JobSpec,
    pair: PairedEvalReport,
    results: Sequence[Mapping[str, StoredResult]],
    texts: Mapping[str, Mapping[str, str]],
) -> ReviewPage:
    """A beside B on the gold records both have a result for, where they differ marked, with each
    one's scores against the gold and B - A above the records."""
    names = (pair.a.variant, pair.b.variant)
    one = Asked.of(spec).of_variant(names[0])
    look = one.command("eval", "--gold", str(pair.a.gold.path), "--html", f"eval-{names[0]}.html")
    builder = ViewBuilder(grounded_paths(spec.schema_class))
    shown = {key: value for key, value in texts.items() if key in results[0]}
    views = {name: builder.views(found, {}, shown) for name, found in zip(names, results, strict=True)}
    notes = [
        f"gold file {pair.a.gold.path}: {counted(len(pair.a.gold.records), 'record')}, {pair.records:,} of "
        f"them with a result of both {names[0]} and {names[1]}: each variant's scores against the gold and "
        f"B - A are above; `{look}` shows the gold beside one variant",
        DISAGREEMENT_NOTE.format(a=names[0], b=names[1]),
        pair.comparison.rule,
        *interval_notes(pair.a.agreement),
        *builder.note(),
    ]
    agreement = variant_agreement(spec, results[0], results[1])
    records = review_records(shown, views, agreement)
    return page(spec, names, records, notes, _pair_score_rows(pair), pair.a.read_copy)


def _pair_score_rows(pair: PairedEvalReport) -> list[ScoreRow]:
    """Per field and overall: A's score, B's, and B - A with its interval and verdict."""
    a, b = pair.a.agreement, pair.b.agreement
    rows = []
    for score_a, score_b in zip(a.fields, b.fields, strict=True):
        sides = [(side.agreement, side.ci.get("agreement"), side.scored) for side in (score_a, score_b)]
        path = score_a.path
        rows += _score_rows(pair, path, score_a.headline_metric, sides, pair.comparison.fields[path])
    sides = [
        (side.micro.f1 if side.micro else None, side.micro_ci.get("f1"), side.records_scored)
        for side in (a, b)
    ]
    return rows + _score_rows(pair, "overall", "micro f1", sides, pair.comparison.micro_f1)


def _score_rows(
    pair: PairedEvalReport,
    path: str,
    metric: str,
    sides: Sequence[tuple[float | None, Interval | None, int]],
    difference: Difference,
) -> list[ScoreRow]:
    names = (pair.a.variant, pair.b.variant)
    rows = [
        ScoreRow(path, f"{metric} ({name})", value, page_interval(interval), records)
        for name, (value, interval, records) in zip(names, sides, strict=True)
    ]
    verdict = f"B - A: {difference.verdict}"
    return [
        *rows,
        ScoreRow(path, verdict, difference.value, page_interval(difference.ci), difference.records),
    ]


#: When a paired difference is a verdict, in words (reports print it).
VERDICT_RULE = (
    f"verdict: {Verdict.BETTER} or {Verdict.WORSE} when the interval of B - A excludes 0, else {Verdict.NONE}"
)


def format_paired_eval(report: PairedEvalReport) -> str:
    """The paired table (each variant's headline score, B - A and the verdict, per field and overall),
    the interval rule, how many records would detect each difference, and the gold records without a
    result."""
    a, b = report.a, report.b
    lines = [
        f"{b.variant} (B) against {a.variant} (A), both against {a.gold.path}, over the "
        f"{counted(report.records, 'gold record')} both have a result for",
        "",
        *aligned(_rows(report)),
        "",
        _scores_line(report),
        report.comparison.rule,
        VERDICT_RULE,
        *_detect_lines(report),
        *_missing_lines(report),
    ]
    return "\n".join(lines)


def _scores_line(report: PairedEvalReport) -> str:
    a, b = report.a.agreement, report.b.agreement
    if not a.intervals:
        return ""
    without = (
        some_without_spread(a)
        or some_without_spread(b)
        or not all(
            difference.ci is None or has_spread(difference.ci)
            for difference in [*report.comparison.fields.values(), report.comparison.micro_f1]
        )
    )
    return f"scores: {a.intervals}" + (f"; {TOO_SMALL}: {NO_SPREAD}" if without else "")


def _rows(report: PairedEvalReport) -> list[tuple[str, ...]]:
    a, b = report.a.agreement, report.b.agreement
    header = ("field", "metric", report.a.variant, report.b.variant, "B - A", "verdict")
    rows: list[tuple[str, ...]] = [header]
    for score_a, score_b in zip(a.fields, b.fields, strict=True):
        difference = report.comparison.fields[score_a.path]
        rows.append(
            (
                score_a.path,
                difference.metric,
                with_ci(score_a.agreement, score_a.ci.get("agreement")),
                with_ci(score_b.agreement, score_b.ci.get("agreement")),
                *difference_cells(difference),
            )
        )
    micro_a, micro_b = (side.micro.f1 if side.micro else None for side in (a, b))
    rows.append(
        (
            "overall",
            "micro f1",
            with_ci(micro_a, a.micro_ci.get("f1")),
            with_ci(micro_b, b.micro_ci.get("f1")),
            *difference_cells(report.comparison.micro_f1),
        )
    )
    return rows


def with_ci(value: float | None, interval: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    if interval is None:
        return f"{value:.3f}"
    shown = f"{interval[0]:.3f}-{interval[1]:.3f}" if has_spread(interval) else TOO_SMALL
    return f"{value:.3f} [{shown}]"


def difference_cells(difference: Difference) -> tuple[str, str]:
    if difference.value is None:
        return ("-", "not scored")
    return (f"{difference.value:+.3f}{difference.interval_text()}", str(difference.verdict))


def aligned(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _detect_lines(report: PairedEvalReport) -> list[str]:
    every = [*report.comparison.fields.items(), ("overall micro f1", report.comparison.micro_f1)]
    return detect_lines(every, report.records)


def detect_lines(differences: Sequence[tuple[str, Difference]], records: int) -> list[str]:
    """For each difference not detected, about how many records would detect one of its size."""
    undetected = [
        (path, difference.value, difference.records_needed)
        for path, difference in differences
        if difference.verdict is Verdict.NONE and difference.records_needed
    ]
    if not undetected:
        return []
    lines = [f"records to detect a difference of the size seen (80% power), against the {records:,} scored:"]
    lines += [
        f"  {path}: {value:+.3f} needs about {counted(needed, 'record')}"
        for path, value, needed in undetected
        if needed is not None and value is not None
    ]
    return lines


def _missing_lines(report: PairedEvalReport) -> list[str]:
    counts = []
    for one in (report.a, report.b):
        missing = len(one.failed) + len(one.not_extracted) + len(one.not_in_source)
        counts.append(f"{one.variant} {missing:,}")
    return [f"gold records without a result (not scored for either): {', '.join(counts)}"]
