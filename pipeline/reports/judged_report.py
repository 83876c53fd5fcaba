"""What ``pipeline eval --judged`` reports, and how: its JSON, its text, and the notes and score rows of
its page. The reading and measuring is :mod:`pipeline.reports.judged_evaluation`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.quality.judged_scores import (
    MISSES_NOT_MARKED,
    OVERALL,
    SEVERAL_JUDGES_RULE,
    Estimate,
    JudgedComparison,
    JudgedField,
    JudgedScores,
    records_for_margin,
)
from pipeline.quality.ppi import PPI_RULE, Combined, JudgeAgreement, NoInterval
from pipeline.quality.scores import NO_SPREAD, TOO_SMALL, has_spread
from pipeline.reports.evaluation import page_interval
from pipeline.reports.paired_evaluation import VERDICT_RULE, aligned, detect_lines, difference_cells, with_ci
from pipeline.reports.review_page import ReviewPage, ScoreRow
from pipeline.store.read_copy import ReadCopy
from pipeline.wording import counted

#: The margin the report says how many judged records would give (± this on the overall precision).
MARGIN = 0.05
METRICS_RULE = (
    "precision: correct / (correct + wrong) over the values judged; recall: correct / (correct + "
    "missing), only in fields where misses were marked (in a field with none marked, nobody may have "
    "looked for them)"
)
CLUSTER_NOTE = "a record's values are resampled together (the values of one record are not independent)"
#: What a combined precision without an interval shows in place of one; a line under the table (``*``)
#: says why, and what would give one.
NO_INTERVAL_MARK = "no interval*"
NO_INTERVAL_WHY = {
    NoInterval.NO_SPREAD: (
        "people found the same precision in each of the {people} the model judged too, so there is no "
        "spread to weigh the model by: λ = 0, the combined precision is the people's own, and their "
        "interval is the one that holds; a record people judge otherwise gives the combined one (judge "
        "more records: a larger `judge --sample`)"
    ),
    NoInterval.FEW_RECORDS: (
        "people judged {people} of the model's records, and an interval needs 2 or more: judge more of "
        "them (the samples nest: `judge --sample N` with the model's --seed)"
    ),
}


@dataclass(frozen=True, slots=True)
class Judges:
    """Whose judgments count: the table's judges, and the model judge calibrated by them."""

    table: tuple[str, ...]  # people; a model judge when no person judged (``by_model_only``)
    model: str | None
    by_model_only: bool = False
    others: tuple[str, ...] = ()  # model judges not used (``--judge`` picks one)

    def describe(self) -> str:
        if self.by_model_only:
            return f"{self.table[0]} only (no person judged: uncalibrated)"
        return f"{'person' if len(self.table) == 1 else 'people'} ({', '.join(self.table)})"


@dataclass(frozen=True, slots=True)
class ModelCalibration:
    """A model judge beside the people: its agreement with them, and precision from both (PPI++)."""

    judge: str
    records: int  # the records it judged
    agreement: JudgeAgreement
    combined: Mapping[str, Combined]  # per path the people judged, and OVERALL

    def to_json(self) -> dict[str, Any]:
        fields = {path: one.to_json() for path, one in self.combined.items() if path != OVERALL}
        return {
            "judge": self.judge,
            "records": self.records,
            "agreement": self.agreement.to_json(),
            "combined": {"fields": fields, "overall": self.combined[OVERALL].to_json()},
        }


def covers(variant: str, population: int) -> str:
    """What the intervals hold for."""
    return (
        f"the whole run the sample was drawn from: the {counted(population, 'record')} of variant {variant} "
        "with a result (the judged records taken as a random sample of them)"
    )


@dataclass(frozen=True, slots=True)
class JudgedEvalReport:
    job: str  # the job file, for the commands a report suggests
    variant: str
    population: int  # the variant's results: what the judged sample was drawn from
    judges: Judges
    scores: JudgedScores
    model: ModelCalibration | None = None
    stale: int = 0  # judgments of results redone since (kept, not counted)
    review: ReviewPage | None = None
    read_copy: ReadCopy | None = None

    def margin_records(self) -> int | None:
        """About how many judged records give ± :data:`MARGIN` on the overall precision."""
        return records_for_margin(self.scores.overall.precision, MARGIN, self.scores.confidence)

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "judges": list(self.judges.table),
            "judged_by_model_only": self.judges.by_model_only,
            "population": {"records": self.population, "covers": covers(self.variant, self.population)},
            "records": self.scores.records,
            "fields": {one.path: one.to_json() for one in self.scores.fields},
            "overall": self.scores.overall.to_json(),
            "recall_fields": list(self.scores.recall_paths),
            "intervals": self.scores.intervals,
            "margin": {"precision": MARGIN, "records": self.margin_records()},
            "model": self.model.to_json() if self.model else None,
            "stale_judgments": self.stale,
            "read_copy": self.read_copy.to_json() if self.read_copy else None,
        }


@dataclass(frozen=True, slots=True)
class PairedJudgedReport:
    variants: tuple[str, str]  # A, B
    populations: tuple[int, int]
    judges: Judges
    comparison: JudgedComparison
    review: ReviewPage | None = None
    read_copy: ReadCopy | None = None

    def to_json(self) -> dict[str, Any]:
        comparison = self.comparison
        a, b = comparison.a, comparison.b
        return {
            "variants": {"a": self.variants[0], "b": self.variants[1]},
            "judges": list(self.judges.table),
            "population": dict(zip(("a", "b"), self.populations, strict=True)),
            "records": comparison.records,
            "fields": {
                path: {"a": a.field(path).to_json(), "b": b.field(path).to_json(), "difference": d.to_json()}
                for path, d in comparison.fields.items()
            },
            "overall": {
                "a": a.overall.to_json(),
                "b": b.overall.to_json(),
                "difference": comparison.overall.to_json(),
            },
            "intervals": a.intervals,
            "difference_intervals": comparison.rule,
            "read_copy": self.read_copy.to_json() if self.read_copy else None,
        }


def _count(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _cell(estimate: Estimate | None) -> str:
    return with_ci(estimate.value, estimate.ci) if estimate and estimate.value is not None else "-"


def _row(field: JudgedField) -> tuple[str, ...]:
    precision, recall = field.precision, field.recall
    recall_cell = MISSES_NOT_MARKED if recall is None else f"{_cell(recall)} ({_count(recall.other)} missed)"
    return (field.path, _count(precision.judged), _count(precision.correct), _cell(precision), recall_cell)


def _table(scores: JudgedScores) -> list[str]:
    header = ("field", "values judged", "correct", "precision [95%]", "recall [95%]")
    return aligned([header, *(_row(field) for field in (*scores.fields, scores.overall))])


def _without_spread(estimates: list[Estimate | None]) -> bool:
    return any(one is not None and one.ci is not None and not has_spread(one.ci) for one in estimates)


def _interval_note(*every_scores: JudgedScores) -> str:
    """How the intervals were drawn, and why one has no width when one has none."""
    every = [
        one
        for scores in every_scores
        for field in (*scores.fields, scores.overall)
        for one in (field.precision, field.recall)
    ]
    why = f"; {TOO_SMALL}: {NO_SPREAD}" if _without_spread(every) else ""
    return f"{every_scores[0].intervals}; {CLUSTER_NOTE}{why}"


def _single_notes(report: JudgedEvalReport) -> list[str]:
    scores, judges = report.scores, report.judges
    notes = [f"the intervals cover {covers(report.variant, report.population)}", METRICS_RULE]
    notes.append(_interval_note(scores))
    if len(judges.table) > 1:
        notes.append(SEVERAL_JUDGES_RULE)
    if (needed := report.margin_records()) is not None:
        notes.append(margin_line(needed, scores.overall.precision.records))
    if judges.by_model_only:
        notes.append(
            f"{judges.table[0]}'s own opinion, not calibrated by people: when people judge some of these "
            "records too, the combined precision holds whatever the model's bias"
        )
    if judges.others:
        notes.append(f"also judged by {', '.join(judges.others)} (choose the model judge with --judge)")
    if report.stale:
        notes.append(f"{counted(report.stale, 'judgment')} of results redone since: kept, not counted")
    return notes


def margin_line(needed: int, judged: int) -> str:
    """How many judged records give ± :data:`MARGIN` on the overall precision (``needed``, from the
    spread of the ``judged``), said against those judged: one below them is reached already."""
    head = f"±{MARGIN} on the overall precision:"
    if needed <= judged:
        done = f"reached with the {counted(judged, 'record')} judged"
        return f"{head} {done} (about {needed:,} would do, from their spread)"
    more = f"{needed - judged:,} more than the {judged:,} judged"
    return f"{head} about {counted(needed, 'judged record')}, {more} (from their spread)"


def _paired_notes(report: PairedJudgedReport) -> list[str]:
    (a, b), (size_a, size_b) = report.variants, report.populations
    comparison = report.comparison
    every = [*comparison.fields.items(), ("overall precision", comparison.overall)]
    return [
        f"the intervals cover the whole runs the sample was drawn from: the {counted(size_a, 'record')} of "
        f"{a} and the {size_b:,} of {b} with a result (the judged records taken as a random sample of them)",
        METRICS_RULE,
        f"scores: {_interval_note(comparison.a, comparison.b)}",
        comparison.rule,
        VERDICT_RULE,
        *detect_lines(every, comparison.records),
        *([SEVERAL_JUDGES_RULE] if len(report.judges.table) > 1 else []),
    ]


def judged_notes(report: JudgedEvalReport | PairedJudgedReport) -> list[str]:
    """What the numbers mean and what they cover: the lines under the text's table, the page's notes."""
    if isinstance(report, PairedJudgedReport):
        return _paired_notes(report)
    model = report.model
    return [
        *_single_notes(report),
        *(
            [
                _agreement_line(model),
                *_no_interval_lines(model),
                PPI_RULE.format(level=report.scores.confidence),
            ]
            if model
            else []
        ),
    ]


def _agreement_line(model: ModelCalibration) -> str:
    agreement, combined = model.agreement, model.combined[OVERALL]
    people = combined.human_records
    head = f"model judge {model.judge} on {counted(model.records, 'record')} (people on {people:,} of them)"
    if not agreement.values:
        return f"{head}: no value judged by both"
    kappa = f", Cohen's kappa {agreement.kappa:.2f}" if agreement.kappa is not None else ""
    return (
        f"{head}: agrees with people on {agreement.agreeing:,} of the {counted(agreement.values, 'value')} "
        f"both judged ({agreement.share:.1%}){kappa}"
    )


def _model_table(report: JudgedEvalReport, model: ModelCalibration) -> list[str]:
    rows: list[tuple[str, ...]] = [("field", "people only [95%]", "combined [95%]", "model alone", "λ")]
    for field in (*report.scores.fields, report.scores.overall):
        combined = model.combined.get(field.path)
        if combined is None:
            continue
        alone = f"{combined.model_alone:.3f}" if combined.model_alone is not None else "-"
        value = with_ci(combined.value, combined.ci)
        if combined.no_interval is not None:
            value = (
                f"{combined.value:.3f} [{NO_INTERVAL_MARK}]"
                if combined.value is not None
                else NO_INTERVAL_MARK
            )
        rows.append((field.path, _cell(field.precision), value, alone, f"{combined.power:.2f}"))
    return [*aligned(rows), *_no_interval_lines(model)]


def _no_interval_lines(model: ModelCalibration) -> list[str]:
    """Why a combined precision has no interval, and what would give one: a line per reason."""
    lines = []
    for reason, text in NO_INTERVAL_WHY.items():
        paths = [path for path, one in model.combined.items() if one.no_interval is reason]
        if paths:
            people = model.combined[paths[0]].human_records
            why = text.format(people=counted(people, "record"))
            lines.append(f"* no combined interval for {', '.join(paths)}: {why}")
    return lines


def format_judged_eval(report: JudgedEvalReport) -> str:
    """The table (per field: values judged, correct, precision and recall with their intervals, then
    overall), what the intervals cover and how they are made; with a model judge, the people's
    precision beside the combined one."""
    judged = counted(report.scores.records, "record")
    lines = [
        f"variant {report.variant}: {judged} judged by {report.judges.describe()}",
        "",
        *_table(report.scores),
        "",
        *_single_notes(report),
    ]
    if report.model is not None:
        model = report.model
        lines += ["", _agreement_line(model), *_model_table(report, model)]
        lines.append(PPI_RULE.format(level=report.scores.confidence))
    return "\n".join(lines)


def format_paired_judged(report: PairedJudgedReport) -> str:
    """Per field and overall: each variant's precision, B - A with its interval, the verdict."""
    (a, b), comparison = report.variants, report.comparison
    rows: list[tuple[str, ...]] = [("field", f"{a} precision", f"{b} precision", "B - A", "verdict")]
    for path, difference in [*comparison.fields.items(), (OVERALL, comparison.overall)]:
        cells = (_cell(scores.field(path).precision) for scores in (comparison.a, comparison.b))
        rows.append((path, *cells, *difference_cells(difference)))
    title = (
        f"{b} (B) against {a} (A): precision judged by {report.judges.describe()} on the "
        f"{counted(comparison.records, 'record')} judged in both"
    )
    return "\n".join([title, "", *aligned(rows), "", *_paired_notes(report)])


def judged_score_rows(report: JudgedEvalReport) -> list[ScoreRow]:
    """The page's score table: per field and overall, precision and recall; with a model judge, the
    combined precision and the model's own."""
    rows = []
    for field in (*report.scores.fields, report.scores.overall):
        for estimate in (field.precision, field.recall):
            if estimate is not None and estimate.value is not None:
                interval = page_interval(estimate.ci)
                rows.append(ScoreRow(field.path, estimate.metric, estimate.value, interval, estimate.records))
        combined = report.model.combined.get(field.path) if report.model else None
        if report.model is not None and combined is not None:
            name, records = report.model.judge, combined.model_records
            rows.append(
                ScoreRow(
                    field.path,
                    f"precision (people + {name})",
                    combined.value,
                    page_interval(combined.ci),
                    records,
                )
            )
            rows.append(
                ScoreRow(field.path, f"precision ({name} alone)", combined.model_alone, None, records)
            )
    return rows


def paired_judged_score_rows(report: PairedJudgedReport) -> list[ScoreRow]:
    """Per field and overall: A's precision, B's, and B - A with its interval and verdict."""
    comparison, rows = report.comparison, []
    for path, difference in [*comparison.fields.items(), (OVERALL, comparison.overall)]:
        for name, scores in zip(report.variants, (comparison.a, comparison.b), strict=True):
            estimate = scores.field(path).precision
            rows.append(
                ScoreRow(
                    path, f"precision ({name})", estimate.value, page_interval(estimate.ci), estimate.records
                )
            )
        verdict = f"B - A: {difference.verdict}"
        rows.append(
            ScoreRow(path, verdict, difference.value, page_interval(difference.ci), difference.records)
        )
    return rows
