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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.job.spec import JobSpec
from pipeline.quality import read_gold
from pipeline.quality.intervals import Difference, PairedComparison, Verdict, paired_differences
from pipeline.reports.evaluation import (
    EvalReport,
    EvalSettings,
    eval_report,
    find_in_gold,
    gold_in_sample,
    measure_against_gold,
)
from pipeline.reports.reading import open_output


@dataclass(frozen=True, slots=True)
class PairedEvalReport:
    a: EvalReport  # scored over the gold records both variants have a result for
    b: EvalReport
    comparison: PairedComparison

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
        read_copy = output.read_copy
    both = {key: value for key, value in gold.records.items() if all(key in f.results for f in found)}
    reports = [
        dataclasses.replace(
            eval_report(one, gold, one_found, measure_against_gold(one, both, one_found, settings)),
            read_copy=read_copy,
        )
        for one, one_found in zip(specs, found, strict=True)
    ]
    comparison = paired_differences(reports[0].agreement, reports[1].agreement, settings.bootstrap)
    return PairedEvalReport(reports[0], reports[1], comparison)


def format_paired_eval(report: PairedEvalReport) -> str:
    """The paired table (each variant's headline score, B - A and the verdict, per field and overall),
    the interval rule, how many records would detect each difference, and the gold records without a
    result."""
    a, b = report.a, report.b
    lines = [
        f"{b.variant} (B) against {a.variant} (A), both against {a.gold.path}, over the "
        f"{report.records:,} gold records both have a result for",
        "",
        *_aligned(_rows(report)),
        "",
        f"scores: {a.agreement.intervals}" if a.agreement.intervals else "",
        report.comparison.rule,
        f"verdict: {Verdict.BETTER} or {Verdict.WORSE} when the interval of B - A excludes 0, else "
        f"{Verdict.NONE}",
        *_detect_lines(report),
        *_missing_lines(report),
    ]
    return "\n".join(lines)


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
                _with_ci(score_a.agreement, score_a.ci.get("agreement")),
                _with_ci(score_b.agreement, score_b.ci.get("agreement")),
                *_difference_cells(difference),
            )
        )
    micro_a, micro_b = (side.micro.f1 if side.micro else None for side in (a, b))
    rows.append(
        (
            "overall",
            "micro f1",
            _with_ci(micro_a, a.micro_ci.get("f1")),
            _with_ci(micro_b, b.micro_ci.get("f1")),
            *_difference_cells(report.comparison.micro_f1),
        )
    )
    return rows


def _with_ci(value: float | None, interval: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" [{interval[0]:.3f}-{interval[1]:.3f}]" if interval else "")


def _difference_cells(difference: Difference) -> tuple[str, str]:
    if difference.value is None:
        return ("-", "not scored")
    ci = f" [{difference.ci[0]:+.3f}, {difference.ci[1]:+.3f}]" if difference.ci else ""
    return (f"{difference.value:+.3f}{ci}", str(difference.verdict))


def _aligned(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _detect_lines(report: PairedEvalReport) -> list[str]:
    """For each difference not detected, about how many records would detect one of its size."""
    every = [*report.comparison.fields.items(), ("overall micro f1", report.comparison.micro_f1)]
    undetected = [
        (path, difference)
        for path, difference in every
        if difference.verdict is Verdict.NONE and difference.records_needed
    ]
    if not undetected:
        return []
    lines = [
        f"records to detect a difference of the size seen (80% power), against the {report.records:,} scored:"
    ]
    lines += [
        f"  {path}: {difference.value:+.3f} needs about {difference.records_needed:,} records"
        for path, difference in undetected
    ]
    return lines


def _missing_lines(report: PairedEvalReport) -> list[str]:
    counts = []
    for one in (report.a, report.b):
        missing = len(one.failed) + len(one.not_extracted) + len(one.not_in_source)
        counts.append(f"{one.variant} {missing:,}")
    return [f"gold records without a result (not scored for either): {', '.join(counts)}"]
