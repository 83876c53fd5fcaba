"""What an agreement measurement reports (:mod:`pipeline.quality.agreement` measures): per-field scores,
per-record agreement and the overall micro/macro scores, and how the report is written out, as JSON
and as a plain-text table."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.quality.fields import FieldKind
from pipeline.quality.matching import MatchSettings, Scores
from pipeline.wording import counted, number

LIST_KINDS = frozenset({FieldKind.LIST, FieldKind.OBJECT_LIST})

#: A confidence interval: (low, high).
Interval = tuple[float, float]
#: What a report shows for an interval of no width: every resample gave the same score, and too few
#: records for a bound (one record). That is not certainty. (Many records all scored alike, a perfect or
#: a zero score, get the exact binomial bound instead: :func:`pipeline.quality.bootstrap.all_alike_bound`.)
TOO_SMALL = "sample too small"
#: How a report says where the interval of a perfect or zero score comes from.
ALL_ALIKE = (
    "a perfect or zero score: the exact binomial bound for that many records (every resample gives the "
    "same score)"
)


def has_spread(interval: Interval) -> bool:
    """Whether an interval says something: its resamples did not all give the same score."""
    return interval[1] > interval[0]


def interval_json(name: str, interval: Interval) -> dict[str, Any]:
    """``{name: [low, high]}``; for one of no width ``{name: None, name_note: TOO_SMALL}``."""
    if has_spread(interval):
        return {name: list(interval)}
    return {name: None, f"{name}_note": TOO_SMALL}


#: The per-record columns of one scored path, in this order: whether the reference gives the field,
#: the matched items (a scalar: 1 or 0), the reference's and the candidate's items (a scalar: 1 each),
#: exact equality (scalars), and the record's own precision, recall and F1 (lists; a scalar: 1 or 0).
#: Every score is a ratio of their sums, which is what :mod:`pipeline.quality.bootstrap` resamples.
COLUMNS = ("scored", "tp", "reference", "candidate", "exact", "precision", "recall", "f1")
SCORED, TP, REFERENCE, CANDIDATE, EXACT, PRECISION, RECALL, F1 = range(len(COLUMNS))


@dataclass(frozen=True, slots=True)
class FieldScore:
    path: str
    kind: FieldKind
    scored: int  # records where the reference gives this field and both sides have the record
    agreement: float | None  # the headline: accuracy, or micro F1 for lists; None if none scored
    in_overall: bool = True
    accuracy: float | None = None  # scalar kinds
    exact: float | None = None  # scalar kinds
    micro: Scores | None = None  # list kinds: from TP/FP/FN pooled over records
    macro: Scores | None = None  # list kinds: mean of per-record scores
    # Pooled counts: of list items; for a scalar, one value per record, a match being a true positive
    # and a mismatch one false positive and one false negative (a wrong value, and the right one missed).
    true_positives: int = 0
    false_positives: int = 0
    false_negatives: int = 0
    # Bootstrap intervals by score name (agreement, accuracy, exact, precision, recall, f1,
    # macro_precision, macro_recall, macro_f1); empty when none were drawn.
    ci: Mapping[str, Interval] = field(default_factory=dict)

    @property
    def headline_metric(self) -> str:
        """The name of the headline score: F1 for lists, accuracy for the rest."""
        return "f1" if self.kind in LIST_KINDS else "accuracy"


@dataclass(frozen=True, slots=True)
class FieldDifference:
    path: str
    reference: Any
    candidate: Any
    agreement: float


@dataclass(frozen=True, slots=True)
class RecordAgreement:
    record_id: str
    fields_scored: int
    agreement: float  # mean over the record's scored fields (those counted in the overall scores)
    differences: tuple[FieldDifference, ...]  # the fields with agreement below 1, in schema order

    @property
    def disagreement(self) -> float:
        return 1.0 - self.agreement


@dataclass(frozen=True, slots=True)
class AgreementReport:
    records_scored: int  # records present on both sides
    fields: tuple[FieldScore, ...]  # in schema order
    micro: Scores | None  # P/R/F1 pooled over every scored value of the counted fields; None if none
    true_positives: int  # the pooled counts: list items, and one per scalar (a match is a TP,
    false_positives: int  # a mismatch one FP and one FN)
    false_negatives: int
    macro: float | None  # mean over the counted fields of each field's agreement (F1 or accuracy)
    macro_fields: int
    only_in_reference: tuple[str, ...]  # ids the candidate lacks
    only_in_candidate: tuple[str, ...]  # ids the reference lacks
    records: tuple[RecordAgreement, ...]  # the most disagreeing first
    settings: MatchSettings
    # The scored records in the order of the columns below (id order).
    record_ids: tuple[str, ...] = field(default=(), repr=False, compare=False)
    # Per scored path, each record's COLUMNS, row after row (float32): what intervals and paired
    # differences resample. A record the reference does not give the path for is zeros.
    columns: Mapping[str, array[float]] = field(default_factory=dict, repr=False, compare=False)
    intervals: str | None = None  # how the intervals were drawn, in words; None: no intervals
    micro_ci: Mapping[str, Interval] = field(default_factory=dict)  # precision, recall, f1
    macro_ci: Interval | None = None

    def to_json(self, *, disagreements: int = 20) -> dict[str, Any]:
        """The report as JSON-ready data; ``disagreements``: how many of the worst records to list."""
        return {
            "records": self.records_scored,
            "fields": {score.path: _field_json(score) for score in self.fields},
            "micro": _with_ci(_scores_json(self.micro), self.micro_ci)
            | {"tp": self.true_positives, "fp": self.false_positives, "fn": self.false_negatives},
            "macro": {"score": self.macro, "fields": self.macro_fields}
            | (interval_json("score_ci", self.macro_ci) if self.macro_ci else {}),
            "intervals": self.intervals,
            "missing": {
                "reference_only": list(self.only_in_reference),
                "candidate_only": list(self.only_in_candidate),
            },
            "matching": self.settings.rules(),
            "disagreements": [
                _record_json(record) for record in self.records[:disagreements] if record.differences
            ],
        }


def _scores_json(scores: Scores | None) -> dict[str, float | None]:
    if scores is None:
        return {"precision": None, "recall": None, "f1": None}
    return {"precision": scores.precision, "recall": scores.recall, "f1": scores.f1}


def _with_ci(scores: dict[str, Any], intervals: Mapping[str, Interval], prefix: str = "") -> dict[str, Any]:
    """``scores`` with ``x_ci: [low, high]`` after each score ``x`` that has an interval."""
    out: dict[str, Any] = {}
    for name, value in scores.items():
        out[name] = value
        interval = intervals.get(prefix + name)
        if interval is not None:
            out |= interval_json(f"{name}_ci", interval)
    return out


def _field_json(score: FieldScore) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": str(score.kind),
        "scored": score.scored,
        "agreement": score.agreement,
        "in_overall": score.in_overall,
    }
    if score.kind not in LIST_KINDS:
        return _with_ci(data | {"accuracy": score.accuracy, "exact": score.exact}, score.ci)
    return _with_ci(data | _scores_json(score.micro), score.ci) | {
        "macro": _with_ci(_scores_json(score.macro), score.ci, "macro_"),
        "tp": score.true_positives,
        "fp": score.false_positives,
        "fn": score.false_negatives,
    }


def _record_json(record: RecordAgreement) -> dict[str, Any]:
    return {
        "id": record.record_id,
        "disagreement": record.disagreement,
        "fields": [
            {"path": d.path, "reference": d.reference, "candidate": d.candidate, "agreement": d.agreement}
            for d in record.differences
        ],
    }


def _number(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


TABLE_HEADER = ("field", "kind", "records", "accuracy", "exact", "precision", "recall", "f1", "macro f1")


def _table_row(score: FieldScore) -> tuple[str, ...]:
    head = (score.path, str(score.kind), str(score.scored))
    if score.kind not in LIST_KINDS:
        return (*head, _number(score.accuracy), _number(score.exact), "", "", "", "")
    micro = score.micro or Scores(math.nan, math.nan, math.nan)
    macro_f1 = score.macro.f1 if score.macro else math.nan
    return (*head, "", "", *(_number(value) for value in (micro.precision, micro.recall, micro.f1, macro_f1)))


_TABLE_INTERVALS = {False: ("accuracy", "exact"), True: ("precision", "recall", "f1", "macro_f1")}


def _interval(interval: Interval | None) -> str:
    if interval is None:
        return ""
    return f"{_number(interval[0])}-{_number(interval[1])}" if has_spread(interval) else TOO_SMALL


def _interval_row(score: FieldScore) -> tuple[str, ...]:
    """The intervals of a field's scores, in the columns of its scores."""
    is_list = score.kind in LIST_KINDS
    cells = [_interval(score.ci.get(name)) for name in _TABLE_INTERVALS[is_list]]
    return ("", "", "", *(["", "", *cells] if is_list else [*cells, "", "", "", ""]))


def _ids(ids: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(ids[:limit])
    return f" ({shown}{', …' if len(ids) > limit else ''})" if ids else ""


def _with_interval(value: float | None, interval: Interval | None) -> str:
    return _number(value) + (f" [{_interval(interval)}]" if interval else "")


def _micro_line(report: AgreementReport) -> str:
    micro = report.micro or Scores(math.nan, math.nan, math.nan)
    ci = report.micro_ci
    return (
        f"micro P {_with_interval(micro.precision, ci.get('precision'))}  "
        f"R {_with_interval(micro.recall, ci.get('recall'))}  F1 {_with_interval(micro.f1, ci.get('f1'))}  "
        f"(pooled over every value: {report.true_positives:,} TP, {report.false_positives:,} FP, "
        f"{report.false_negatives:,} FN; a scalar counts once)"
    )


def _bootstrap_line(report: AgreementReport) -> list[str]:
    if report.intervals is None:
        return []
    why = f"; {TOO_SMALL}: {NO_SPREAD}" if some_without_spread(report) else ""
    why += f"; {ALL_ALIKE}" if some_all_alike(report) else ""
    return [f"{report.intervals} (the row under a field's scores; [low-high]{why})"]


NO_SPREAD = "every resample gave the same score, as one record does"


def some_all_alike(report: AgreementReport) -> bool:
    """Whether some score is perfect or zero with an interval: the exact bound, not the bootstrap's."""
    micro = report.micro
    pairs = [
        *((_values(score).get(name), ci) for score in report.fields for name, ci in score.ci.items()),
        *(((getattr(micro, name), ci) for name, ci in report.micro_ci.items()) if micro else ()),
        (report.macro, report.macro_ci),
    ]
    return any(value in (0.0, 1.0) and ci is not None and has_spread(ci) for value, ci in pairs)


def _values(score: FieldScore) -> dict[str, float | None]:
    """A field's scores by the names of its intervals (``score.ci``)."""
    values = {"agreement": score.agreement, "accuracy": score.accuracy, "exact": score.exact}
    for prefix, scores in (("", score.micro), ("macro_", score.macro)):
        if scores is not None:
            values |= {f"{prefix}{name}": getattr(scores, name) for name in ("precision", "recall", "f1")}
    return values


def some_without_spread(report: AgreementReport) -> bool:
    """Whether some interval of the report has no width (:data:`TOO_SMALL`)."""
    intervals = [
        *(interval for score in report.fields for interval in score.ci.values()),
        *report.micro_ci.values(),
        *([report.macro_ci] if report.macro_ci else []),
    ]
    return not all(has_spread(interval) for interval in intervals)


def format_table(report: AgreementReport) -> str:
    """The report as a plain-text table: one row per scored field (with intervals, a second row of
    them), then the overall scores, the matching rules and the records missing on either side (up to
    10 ids each)."""
    rows: list[tuple[str, ...]] = [TABLE_HEADER]
    for score in report.fields:
        rows.append(_table_row(score))
        if score.ci:
            rows.append(_interval_row(score))
    widths = [max(len(row[column]) for row in rows) for column in range(len(TABLE_HEADER))]
    lines = [
        "  ".join(
            cell.ljust(width) if column < 2 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    missing_candidate, missing_reference = report.only_in_reference, report.only_in_candidate
    return "\n".join(
        [
            *lines,
            _micro_line(report),
            f"macro {_with_interval(report.macro, report.macro_ci)}  (mean of each field's F1 or accuracy, "
            f"{counted(report.macro_fields, 'field')})",
            *_bootstrap_line(report),
            report.settings.describe(),
            f"records: {number(report.records_scored)} on both sides; "
            f"{number(len(missing_candidate))} only in the reference{_ids(missing_candidate)}; "
            f"{number(len(missing_reference))} only in the candidate{_ids(missing_reference)}",
        ]
    )
