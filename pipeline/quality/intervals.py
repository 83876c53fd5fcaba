"""Intervals of an agreement report's scores, and paired differences between reports over the same
records: two variants against one gold file (``eval --variants A,B``), and A-vs-B agreement beside the
noise floor, A against a re-run of itself (``compare``). The resampling is
:mod:`pipeline.quality.bootstrap`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pipeline.quality.bootstrap import (
    Bootstrap,
    all_alike_bound,
    list_ratios,
    path_scores,
    records_to_detect,
    two_sided_z,
)
from pipeline.quality.scores import (
    CANDIDATE,
    COLUMNS,
    LIST_KINDS,
    REFERENCE,
    TOO_SMALL,
    TP,
    AgreementReport,
    Interval,
    has_spread,
    interval_json,
)
from pipeline.wording import counted

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


def _columns(report: AgreementReport) -> Array:
    """The report's per-record columns, every scored path side by side (records x 8·paths)."""
    import numpy as np

    records, width = len(report.record_ids), len(COLUMNS)
    blocks = [
        np.frombuffer(report.columns[score.path], dtype=np.float32).reshape(records, width)
        for score in report.fields
    ]
    return np.hstack(blocks) if blocks else np.zeros((records, 0), dtype=np.float32)


def _scored(report: AgreementReport, sums: Array) -> Resampled:
    """A report's scores from its column sums in every resample (resamples x 8·paths)."""
    import numpy as np

    width = len(COLUMNS)
    paths: dict[str, dict[str, Array]] = {}
    pooled = np.zeros((sums.shape[0], width))
    for index, score in enumerate(report.fields):
        path_sums = sums[:, index * width : (index + 1) * width]
        paths[score.path] = path_scores(path_sums, score.kind in LIST_KINDS)
        if score.in_overall:
            pooled += path_sums
    return Resampled(paths, _micro(pooled), _macro(report, paths, sums.shape[0]))


def _paired(reports: Sequence[AgreementReport]) -> None:
    ids = reports[0].record_ids
    if any(report.record_ids != ids for report in reports):
        raise ValueError("paired reports must score the same records in the same order")


def resample(reports: Sequence[AgreementReport], bootstrap: Bootstrap) -> list[Resampled]:
    """The scores of every report in the same bootstrap resamples of their records (which must be the
    same records, in the same order: that is what pairs them)."""
    import numpy as np

    _paired(reports)
    columns = [_columns(report) for report in reports]
    sums = bootstrap.resampled_sums(np.hstack(columns))
    resampled, offset = [], 0
    for report, block in zip(reports, columns, strict=True):
        resampled.append(_scored(report, sums[:, offset : offset + block.shape[1]]))
        offset += block.shape[1]
    return resampled


def swapped(
    first: AgreementReport, second: AgreementReport, bootstrap: Bootstrap
) -> tuple[Resampled, Resampled]:
    """Both reports' scores when each record's two candidates trade places at random: the paired
    comparison as it looks when the two are interchangeable."""
    _paired([first, second])
    first_sums, second_sums = bootstrap.swapped_sums(_columns(first), _columns(second))
    return _scored(first, first_sums), _scored(second, second_sums)


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
        dataclasses.replace(score, ci=_intervals(resampled.paths[score.path], bootstrap, score.scored))
        for score in report.fields
    )
    records = report.records_scored
    return dataclasses.replace(
        report,
        fields=fields,
        intervals=bootstrap.describe(),
        micro_ci=_intervals(resampled.micro, bootstrap, records) if report.micro else {},
        macro_ci=bootstrap.interval(resampled.macro, records) if report.macro is not None else None,
    )


def _intervals(scores: dict[str, Array], bootstrap: Bootstrap, records: int) -> dict[str, Interval]:
    return {
        name: interval for name, values in scores.items() if (interval := bootstrap.interval(values, records))
    }


@dataclass(frozen=True, slots=True)
class Difference:
    """A paired difference of one score, B - A (or, for the noise floor, noise - A-vs-B)."""

    metric: str
    value: float | None
    ci: Interval | None
    verdict: Verdict
    records: int  # the records both were scored on
    records_needed: int | None  # about how many would tell a difference this size from 0
    level: float = 0.95  # of this interval alone (simultaneous intervals: above the family's level)

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            **(interval_json("ci", self.ci) if self.ci else {"ci": None}),
            "verdict": str(self.verdict),
            "records": self.records,
            "records_needed": self.records_needed,
            "level": self.level,
        }

    def interval_text(self) -> str:
        """`` [-0.010, +0.050]``, `` [sample too small]``, or nothing without an interval."""
        if self.ci is None:
            return ""
        return f" [{self.ci[0]:+.3f}, {self.ci[1]:+.3f}]" if has_spread(self.ci) else f" [{TOO_SMALL}]"

    def describe(self) -> str:
        if self.value is None:
            return "not scored"
        needed = ""
        if self.verdict is Verdict.NONE and self.records_needed:
            needed = f"; ~{counted(self.records_needed, 'record')} would detect a difference this size"
        return f"{self.value:+.3f}{self.interval_text()} {self.verdict}{needed}"


#: Differences are shown to 3 decimals: one smaller than half the last digit shows as ±0.000, and how
#: many records would detect it is not worth saying.
SHOWN_ZERO = 0.0005


#: How the interval of a paired difference is made, in words (reports print it).
DIFFERENCE_RULE = (
    "intervals of a difference: simultaneous over the {differences} shown ({level:.1%} each, so "
    "all cover together at {family:.0%}), ± z standard errors, the larger of the paired bootstrap's and "
    "a sign-flip randomization's (which stays honest when only a few records differ)"
)


def difference(
    metric: str,
    a: float | None,
    b: float | None,
    spread: tuple[Array, Array],
    records: int,
    level: float,
) -> Difference:
    """``b - a`` with its interval: ``b - a`` ± z standard errors at ``level``, the larger of those of
    ``spread`` (the difference in the bootstrap resamples, and when the two sides are swapped at random)."""
    import numpy as np

    if a is None or b is None:
        return Difference(metric, None, None, Verdict.NONE, records, None, level)
    value = b - a
    deviations = [float(np.nanstd(values)) for values in spread if np.isfinite(values).any()]
    standard_error = max(deviations, default=math.nan)
    if not math.isfinite(standard_error):
        return Difference(metric, value, None, Verdict.NONE, records, None, level)
    z = two_sided_z(level)
    # Scores are shares (0..1), so their difference is within ±1 whatever the normal tails say.
    ci = (max(-1.0, value - z * standard_error), min(1.0, value + z * standard_error))
    if not has_spread(ci):  # every resample the same: B and A scored alike on every record
        if value == 0 and (share := all_alike_bound(records, level)):
            ci = (-share, share)  # a score cannot differ by more than the share of records that differ
        return Difference(metric, value, ci, Verdict.NONE, records, None, level)
    verdict = Verdict.BETTER if ci[0] > 0 else Verdict.WORSE if ci[1] < 0 else Verdict.NONE
    shown = abs(value) >= SHOWN_ZERO
    needed = records_to_detect(records, value, standard_error, z) if shown else None
    return Difference(metric, value, ci, verdict, records, needed, level)


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """B against A, both measured against the same reference over the same records."""

    fields: dict[str, Difference]  # per path, of its headline score (F1 or accuracy)
    micro_f1: Difference
    rule: str  # how the intervals were made (DIFFERENCE_RULE)


def paired_differences(a: AgreementReport, b: AgreementReport, bootstrap: Bootstrap) -> PairedComparison:
    """Per field, B's headline score minus A's, with its paired interval and verdict; and the overall
    micro F1's. ``a`` and ``b`` must score the same records against the same reference. The intervals
    are simultaneous over the fields and the overall score, so a verdict is not one of twenty chances."""
    resampled_a, resampled_b = resample([a, b], bootstrap)
    swapped_a, swapped_b = swapped(a, b, bootstrap)
    count = len(a.fields) + 1
    level = bootstrap.simultaneous(count)
    records = a.records_scored
    fields = {}
    for score_a, score_b in zip(a.fields, b.fields, strict=True):
        path = score_a.path
        spread = (
            resampled_b.paths[path]["agreement"] - resampled_a.paths[path]["agreement"],
            swapped_b.paths[path]["agreement"] - swapped_a.paths[path]["agreement"],
        )
        fields[path] = difference(
            score_a.headline_metric, score_a.agreement, score_b.agreement, spread, records, level
        )
    micro_a, micro_b = (side.micro.f1 if side.micro else None for side in (a, b))
    spread = (
        resampled_b.micro["f1"] - resampled_a.micro["f1"],
        swapped_b.micro["f1"] - swapped_a.micro["f1"],
    )
    micro = difference("f1", micro_a, micro_b, spread, records, level)
    rule = DIFFERENCE_RULE.format(
        differences=counted(count, "difference"), level=level, family=bootstrap.confidence
    )
    return PairedComparison(fields, micro, rule)


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
    (simultaneous) interval of that gap. Both reports take A as the reference over the same records."""
    resampled_versus, resampled_rerun = resample([versus, rerun], bootstrap)
    swapped_versus, swapped_rerun = swapped(versus, rerun, bootstrap)
    level = bootstrap.simultaneous(len(versus.fields))
    floors = {}
    for score, noise in zip(versus.fields, rerun.fields, strict=True):
        path = score.path
        noise_resampled = resampled_rerun.paths[path]["agreement"]
        spread = (
            noise_resampled - resampled_versus.paths[path]["agreement"],
            swapped_rerun.paths[path]["agreement"] - swapped_versus.paths[path]["agreement"],
        )
        gap = difference(
            score.headline_metric, score.agreement, noise.agreement, spread, versus.records_scored, level
        )
        floors[path] = NoiseFloor(
            agreement=score.agreement,
            noise_agreement=noise.agreement,
            noise_agreement_ci=bootstrap.interval(noise_resampled, noise.scored),
            gap=gap,
            beyond_noise=gap.verdict is Verdict.BETTER,
        )
    return floors
