"""What an agreement measurement reports (:mod:`pipeline.quality.agreement` measures): per-field scores,
per-record agreement and the overall micro/macro scores, and how the report is written out, as JSON
and as a plain-text table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.quality.fields import FieldKind
from pipeline.quality.matching import MatchSettings, Scores

LIST_KINDS = frozenset({FieldKind.LIST, FieldKind.OBJECT_LIST})


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

    def to_json(self, *, disagreements: int = 20) -> dict[str, Any]:
        """The report as JSON-ready data; ``disagreements``: how many of the worst records to list."""
        return {
            "records": self.records_scored,
            "fields": {score.path: _field_json(score) for score in self.fields},
            "micro": _scores_json(self.micro)
            | {"tp": self.true_positives, "fp": self.false_positives, "fn": self.false_negatives},
            "macro": {"score": self.macro, "fields": self.macro_fields},
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


def _field_json(score: FieldScore) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": str(score.kind),
        "scored": score.scored,
        "agreement": score.agreement,
        "in_overall": score.in_overall,
    }
    if score.kind not in LIST_KINDS:
        return data | {"accuracy": score.accuracy, "exact": score.exact}
    return data | {
        **_scores_json(score.micro),
        "macro": _scores_json(score.macro),
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


def _ids(ids: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(ids[:limit])
    return f" ({shown}{', …' if len(ids) > limit else ''})" if ids else ""


def _micro_line(report: AgreementReport) -> str:
    micro = report.micro or Scores(math.nan, math.nan, math.nan)
    return (
        f"micro P {_number(micro.precision)}  R {_number(micro.recall)}  F1 {_number(micro.f1)}  "
        f"(pooled over every value: {report.true_positives:,} TP, {report.false_positives:,} FP, "
        f"{report.false_negatives:,} FN; a scalar counts once)"
    )


def format_table(report: AgreementReport) -> str:
    """The report as a plain-text table: one row per scored field, then the overall scores, the
    matching rules and the records missing on either side (up to 10 ids each)."""
    rows = [TABLE_HEADER, *(_table_row(score) for score in report.fields)]
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
            f"macro {_number(report.macro)}  (mean of each field's F1 or accuracy, {report.macro_fields} "
            f"field{'' if report.macro_fields == 1 else 's'})",
            report.settings.describe(),
            f"records: {report.records_scored} on both sides; "
            f"{len(missing_candidate)} only in the reference{_ids(missing_candidate)}; "
            f"{len(missing_reference)} only in the candidate{_ids(missing_reference)}",
        ]
    )
