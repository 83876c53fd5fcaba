"""Intervals of an agreement report's scores, and paired differences between reports over the same
records: two variants against one gold file (``eval --variants A,B``), and A-vs-B agreement beside the
noise floor, A against a re-run of itself (``compare``). The resampling is
:mod:`pipeline.quality.bootstrap`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pipeline.quality.bootstrap import Bootstrap, list_ratios, path_scores, records_to_detect
from pipeline.quality.scores import (
    CANDIDATE,
    COLUMNS,
    LIST_KINDS,
    REFERENCE,
    TP,
    AgreementReport,
    Interval,
)

if TYPE_CHECKING:
    from pipeline.quality.bootstrap import Array


class Verdict(StrEnum):
    BETTER = "better"
    WORSE = "worse"
    NONE = "no detectable difference"


@dataclass(frozen=True, slots=True)
class Resampled:
    """One report's scores in every resample: per path, per score name; the overall micro scores and
    the macro score."""

    paths: dict[str, dict[str, Array]]
    micro: dict[str, Array]
    macro: Array


def resample(reports: Sequence[AgreementReport], bootstrap: Bootstrap) -> list[Resampled]:
    """The scores of every report in the same resamples of their records (which must be the same
    records, in the same order: that is what pairs them)."""
    import numpy as np

    ids = reports[0].record_ids
    if any(report.record_ids != ids for report in reports):
        raise ValueError("paired reports must score the same records in the same order")
    width = len(COLUMNS)
    blocks = [
        np.frombuffer(report.columns[score.path], dtype=np.float32).reshape(len(ids), width)
        for report in reports
        for score in report.fields
    ]
    sums = bootstrap.resampled_sums(np.hstack(blocks) if blocks else np.zeros((len(ids), 0)))
    resampled, offset = [], 0
    for report in reports:
        paths: dict[str, dict[str, Array]] = {}
        pooled = np.zeros((bootstrap.resamples, width))
        for score in report.fields:
            path_sums = sums[:, offset : offset + width]
            offset += width
            paths[score.path] = path_scores(path_sums, score.kind in LIST_KINDS)
            if score.in_overall:
                pooled += path_sums
        resampled.append(Resampled(paths, _micro(pooled), _macro(report, paths, bootstrap.resamples)))
    return resampled


def _micro(pooled: Array) -> dict[str, Array]:
    precision, recall, f1 = list_ratios(pooled[:, TP], pooled[:, REFERENCE], pooled[:, CANDIDATE])
    return {"precision": precision, "recall": recall, "f1": f1}


def _macro(report: AgreementReport, paths: dict[str, dict[str, Array]], resamples: int) -> Array:
    import numpy as np

    headlines = [paths[score.path]["agreement"] for score in report.fields if score.in_overall]
    if not headlines:
        return np.full(resamples, np.nan)
    stacked = np.vstack(headlines)
    counted = np.isfinite(stacked).sum(axis=0)
    total = np.nansum(stacked, axis=0)
    return np.where(counted > 0, total / np.maximum(counted, 1), np.nan)


def with_intervals(report: AgreementReport, bootstrap: Bootstrap) -> AgreementReport:
    """``report`` with a bootstrap interval beside each of its scores."""
    (resampled,) = resample([report], bootstrap)
    fields = tuple(
        dataclasses.replace(score, ci=_intervals(resampled.paths[score.path], bootstrap))
        for score in report.fields
    )
    return dataclasses.replace(
        report,
        fields=fields,
        bootstrap=bootstrap,
        micro_ci=_intervals(resampled.micro, bootstrap) if report.micro else {},
        macro_ci=bootstrap.interval(resampled.macro) if report.macro is not None else None,
    )


def _intervals(scores: dict[str, Array], bootstrap: Bootstrap) -> dict[str, Interval]:
    return {name: interval for name, values in scores.items() if (interval := bootstrap.interval(values))}


@dataclass(frozen=True, slots=True)
class Difference:
    """A paired difference of one score, B - A (or, for the noise floor, noise - A-vs-B)."""

    metric: str
    value: float | None
    ci: Interval | None
    verdict: Verdict
    records: int  # the records both were scored on
    records_needed: int | None  # about how many would tell a difference this size from 0

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "ci": list(self.ci) if self.ci else None,
            "verdict": str(self.verdict),
            "records": self.records,
            "records_needed": self.records_needed,
        }

    def describe(self) -> str:
        if self.value is None:
            return "not scored"
        ci = f" [{self.ci[0]:+.3f}, {self.ci[1]:+.3f}]" if self.ci else ""
        needed = ""
        if self.verdict is Verdict.NONE and self.records_needed:
            needed = f"; ~{self.records_needed:,} records would detect a difference this size"
        return f"{self.value:+.3f}{ci} {self.verdict}{needed}"


def difference(
    metric: str, a: float | None, b: float | None, resampled: Array, records: int, bootstrap: Bootstrap
) -> Difference:
    """``b - a`` with the interval of its resampled values (``resampled``: B's minus A's)."""
    if a is None or b is None:
        return Difference(metric, None, None, Verdict.NONE, records, None)
    value = b - a
    ci = bootstrap.interval(resampled)
    verdict = Verdict.NONE
    if ci is not None and ci[0] > 0:
        verdict = Verdict.BETTER
    elif ci is not None and ci[1] < 0:
        verdict = Verdict.WORSE
    needed = records_to_detect(records, value, ci, bootstrap.z) if ci else None
    return Difference(metric, value, ci, verdict, records, needed)


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """B against A, both measured against the same reference over the same records."""

    fields: dict[str, Difference]  # per path, of its headline score (F1 or accuracy)
    micro_f1: Difference


def paired_differences(a: AgreementReport, b: AgreementReport, bootstrap: Bootstrap) -> PairedComparison:
    """Per field, B's headline score minus A's, with its paired interval and verdict; and the overall
    micro F1's. ``a`` and ``b`` must score the same records against the same reference."""
    resampled_a, resampled_b = resample([a, b], bootstrap)
    records = a.records_scored
    fields = {}
    for score_a, score_b in zip(a.fields, b.fields, strict=True):
        metric = score_a.headline_metric
        delta = resampled_b.paths[score_b.path]["agreement"] - resampled_a.paths[score_a.path]["agreement"]
        fields[score_a.path] = difference(
            metric, score_a.agreement, score_b.agreement, delta, records, bootstrap
        )
    micro_a = a.micro.f1 if a.micro else None
    micro_b = b.micro.f1 if b.micro else None
    micro = difference(
        "f1", micro_a, micro_b, resampled_b.micro["f1"] - resampled_a.micro["f1"], records, bootstrap
    )
    return PairedComparison(fields, micro)


@dataclass(frozen=True, slots=True)
class NoiseFloor:
    """One field's A-vs-B agreement beside A's agreement with a re-run of itself."""

    agreement: float | None  # A vs B
    noise_agreement: float | None  # A vs A's re-run
    noise_agreement_ci: Interval | None
    gap: Difference  # noise agreement minus A-vs-B agreement: how far B is beyond the noise
    beyond_noise: bool  # the gap's interval is above 0


def noise_floor(
    versus: AgreementReport, rerun: AgreementReport, bootstrap: Bootstrap
) -> dict[str, NoiseFloor]:
    """Per field: whether B disagrees with A by more than A disagrees with its own re-run, beyond the
    interval of that gap. Both reports take A as the reference over the same records."""
    resampled_versus, resampled_rerun = resample([versus, rerun], bootstrap)
    floors = {}
    for score, noise in zip(versus.fields, rerun.fields, strict=True):
        agreement_vs = resampled_versus.paths[score.path]["agreement"]
        agreement_noise = resampled_rerun.paths[noise.path]["agreement"]
        gap = difference(
            score.headline_metric,
            score.agreement,
            noise.agreement,
            agreement_noise - agreement_vs,
            versus.records_scored,
            bootstrap,
        )
        floors[score.path] = NoiseFloor(
            agreement=score.agreement,
            noise_agreement=noise.agreement,
            noise_agreement_ci=bootstrap.interval(agreement_noise),
            gap=gap,
            beyond_noise=gap.verdict is Verdict.BETTER,
        )
    return floors
