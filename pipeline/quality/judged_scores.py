"""Precision and recall of a whole run from the judged values of a random sample of its records.

A judge (:mod:`pipeline.quality.judgments`) says of each value of a record that it is ``correct`` or
``wrong``, and marks values the model should have given as ``missing``. Per field path, and pooled over
every path:

* precision = correct / (correct + wrong): of the values the model gives, the share that are right;
* recall = correct / (correct + missing), only for a path where some value was marked missing: a
  judge who marked no miss anywhere in a field may not have looked for them ("misses not marked").

A value judged by several people counts once, split by their verdicts: two of three saying correct is
2/3 correct and 1/3 wrong (with one judge, the plain count). Each value then weighs the same, however
many people looked at it, and a disagreement is neither dropped nor settled by a vote.

The values of one record are not independent (a record with a garbled text has many wrong values), so
an interval that resampled values would be too narrow. Both ratios are ratios of sums over records, so
the intervals resample *records*, with the :class:`~pipeline.quality.bootstrap.Bootstrap` every eval
uses (the cluster bootstrap), and hold for the population the judged records were drawn from at
random: the run's records of that variant. Two variants judged on the same records are paired as
``eval --variants A,B`` pairs them: the difference B - A of precision, per path and overall, with its
simultaneous interval, verdict and the records a difference of that size would need
(:func:`pipeline.quality.intervals.difference`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.quality.bootstrap import Bootstrap, ratio, two_sided_z
from pipeline.quality.intervals import DIFFERENCE_RULE, Difference, difference
from pipeline.quality.judgments import Judgment, JudgmentVerdict
from pipeline.quality.scores import Interval, has_spread, interval_json
from pipeline.wording import counted

if TYPE_CHECKING:
    from pipeline.quality.bootstrap import Array

#: Per path, the columns of :attr:`Tally.columns`, in this order.
VERDICT_COLUMNS = (JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING)
CORRECT, WRONG, MISSING = range(len(VERDICT_COLUMNS))
WIDTH = len(VERDICT_COLUMNS)
OVERALL = "overall"
#: How several people's verdicts on one value count, in words (reports print it).
SEVERAL_JUDGES_RULE = (
    "a value judged by several people counts once, split by their verdicts (2 of 3 saying correct: "
    "2/3 correct)"
)
MISSES_NOT_MARKED = "misses not marked"

ValueKey = tuple[str, str, str, str]  # variant, record, field path, value


@dataclass(frozen=True, slots=True)
class Tally:
    """Judged values counted per record and field path: what the intervals resample.

    ``columns`` is records x (3 · paths), float64: for each path of ``paths``, in order, the values of
    each record judged correct, wrong and missing (:data:`VERDICT_COLUMNS`)."""

    record_ids: tuple[str, ...]
    paths: tuple[str, ...]
    columns: Array

    @property
    def records(self) -> int:
        return len(self.record_ids)

    def of_path(self, path: str) -> Array:
        """The records' (correct, wrong, missing) at ``path`` (records x 3)."""
        start = self.paths.index(path) * WIDTH
        return self.columns[:, start : start + WIDTH]

    def pooled(self, paths: Iterable[str] | None = None) -> Array:
        """The records' (correct, wrong, missing) summed over ``paths`` (default: every path)."""
        import numpy as np

        chosen = list(self.paths if paths is None else paths)
        pooled = np.zeros((self.records, WIDTH))
        for path in chosen:
            pooled += self.of_path(path)
        return pooled

    def aligned(self, record_ids: Sequence[str], paths: Sequence[str]) -> Tally:
        """This tally over ``record_ids`` and ``paths``, in that order; a record or path it lacks is
        zeros (judged nothing)."""
        import numpy as np

        columns = np.zeros((len(record_ids), WIDTH * len(paths)))
        rows = {record: index for index, record in enumerate(self.record_ids)}
        found = [(to, rows[record]) for to, record in enumerate(record_ids) if record in rows]
        to_rows, from_rows = [to for to, _ in found], [row for _, row in found]
        for index, path in enumerate(paths):
            if path in self.paths:
                columns[to_rows, index * WIDTH : (index + 1) * WIDTH] = self.of_path(path)[from_rows]
        return Tally(tuple(record_ids), tuple(paths), columns)


def verdict_shares(judgments: Iterable[Judgment]) -> dict[ValueKey, tuple[float, float, float]]:
    """Each judged value once, as the shares of its judges' verdicts (correct, wrong, missing)."""
    verdicts: dict[ValueKey, list[JudgmentVerdict]] = {}
    for judgment in judgments:
        key = (judgment.variant, judgment.record_id, judgment.field, judgment.value)
        verdicts.setdefault(key, []).append(JudgmentVerdict(judgment.verdict))
    return {
        key: (
            said.count(JudgmentVerdict.CORRECT) / len(said),
            said.count(JudgmentVerdict.WRONG) / len(said),
            said.count(JudgmentVerdict.MISSING) / len(said),
        )
        for key, said in verdicts.items()
    }


def tally_judgments(judgments: Iterable[Judgment], paths: Sequence[str] = ()) -> Tally:
    """The judged values of ``judgments`` (one variant's, those that count) per record and path.

    Records in the order first judged; paths in the order of ``paths`` (the schema's), then any other
    judged path (one an older schema had) by name. A path nobody judged is left out."""
    import numpy as np

    shares = verdict_shares(judgments)
    records = list(dict.fromkeys(key[1] for key in shares))
    judged = {key[2] for key in shares}
    ordered = [path for path in dict.fromkeys(paths) if path in judged]
    ordered += sorted(judged - set(ordered))
    row_of = {record: index for index, record in enumerate(records)}
    column_of = {path: index * WIDTH for index, path in enumerate(ordered)}
    columns = np.zeros((len(records), WIDTH * len(ordered)))
    for (_, record, path, _), share in shares.items():
        columns[row_of[record], column_of[path] : column_of[path] + WIDTH] += share
    return Tally(tuple(records), tuple(ordered), columns)


@dataclass(frozen=True, slots=True)
class Estimate:
    """Precision or recall over judged values, with its interval over records."""

    metric: str  # "precision" or "recall"
    value: float | None  # None: nothing judged
    ci: Interval | None
    judged: float  # the ratio's denominator: values judged correct or wrong (recall: correct or missing)
    correct: float
    records: int  # records with a value in the denominator
    standard_error: float | None  # of the value, over the bootstrap resamples

    @property
    def other(self) -> float:
        """Values judged wrong (precision) or missing (recall)."""
        return self.judged - self.correct

    def to_json(self) -> dict[str, Any]:
        other = "wrong" if self.metric == "precision" else "missing"
        return {
            "value": self.value,
            **(interval_json("ci", self.ci) if self.ci else {"ci": None}),
            "judged": _count(self.judged),
            "correct": _count(self.correct),
            other: _count(self.other),
            "records": self.records,
        }


def _count(value: float) -> float | int:
    """A count as an integer when it is one (it is not when several people split a value)."""
    return int(value) if float(value).is_integer() else round(value, 3)


@dataclass(frozen=True, slots=True)
class JudgedField:
    path: str  # a field path, or OVERALL
    precision: Estimate
    recall: Estimate | None  # None: misses not marked

    def to_json(self) -> dict[str, Any]:
        recall = {"recall": self.recall.to_json()} if self.recall else {"recall": None}
        return {"precision": self.precision.to_json(), **recall}


@dataclass(frozen=True, slots=True)
class JudgedScores:
    """Per path and overall, precision (and recall where misses were marked) over the judged records."""

    records: int  # records with a judged value
    fields: tuple[JudgedField, ...]  # in the tally's path order
    overall: JudgedField  # pooled over every path (recall: over the paths with misses marked)
    intervals: str  # how the intervals were drawn (Bootstrap.describe)
    recall_paths: tuple[str, ...]  # the paths with misses marked
    confidence: float = 0.95  # of the intervals

    def field(self, path: str) -> JudgedField:
        return next(field for field in (*self.fields, self.overall) if field.path == path)


def _extended(tally: Tally) -> tuple[Array, tuple[str, ...]]:
    """The tally's columns, then the overall (correct, wrong, missing), then those of the paths with
    misses marked: every block a ratio is made from, side by side (records x 3·(paths + 2))."""
    import numpy as np

    marked = tuple(path for path in tally.paths if tally.of_path(path)[:, MISSING].sum() > 0)
    blocks = [tally.columns, tally.pooled(), tally.pooled(marked)]
    return np.hstack(blocks), marked


def precision_of(sums: Array) -> Array:
    """Precision from (correct, wrong, missing) sums in the last axis; NaN where nothing was judged."""
    return ratio(sums[..., CORRECT], sums[..., CORRECT] + sums[..., WRONG])


def recall_of(sums: Array) -> Array:
    return ratio(sums[..., CORRECT], sums[..., CORRECT] + sums[..., MISSING])


def _estimate(metric: str, block: Array, resampled: Array, bootstrap: Bootstrap) -> Estimate:
    """One ratio of a block of (correct, wrong, missing) columns (records x 3) and of its sums in every
    resample (resamples x 3)."""
    import numpy as np

    other = WRONG if metric == "precision" else MISSING
    of_sums = precision_of if metric == "precision" else recall_of
    correct, judged = float(block[:, CORRECT].sum()), float(block[:, [CORRECT, other]].sum())
    records = int(np.count_nonzero(block[:, [CORRECT, other]].sum(axis=1)))
    if judged <= 0:
        return Estimate(metric, None, None, 0.0, 0.0, 0, None)
    values = of_sums(resampled)
    finite = values[np.isfinite(values)]
    error = float(np.std(finite)) if finite.size else None
    ci = bootstrap.interval(values, records)
    return Estimate(metric, correct / judged, ci, judged, correct, records, error)


def _scores(
    tally: Tally, extended: Array, marked: tuple[str, ...], sums: Array, bootstrap: Bootstrap
) -> JudgedScores:
    def field(path: str, index: int, recall: bool) -> JudgedField:
        block = slice(index * WIDTH, (index + 1) * WIDTH)
        precision = _estimate("precision", extended[:, block], sums[:, block], bootstrap)
        recall_block = slice(block.start + WIDTH, block.stop + WIDTH) if path == OVERALL else block
        found = _estimate("recall", extended[:, recall_block], sums[:, recall_block], bootstrap)
        return JudgedField(path, precision, found if recall and found.value is not None else None)

    fields = tuple(field(path, index, path in marked) for index, path in enumerate(tally.paths))
    overall = field(OVERALL, len(tally.paths), bool(marked))
    return JudgedScores(tally.records, fields, overall, bootstrap.describe(), marked, bootstrap.confidence)


def judged_scores(tally: Tally, bootstrap: Bootstrap) -> JudgedScores:
    """Precision per path and overall, and recall where misses were marked, each with its bootstrap
    interval over the tally's records."""
    extended, marked = _extended(tally)
    return _scores(tally, extended, marked, bootstrap.resampled_sums(extended), bootstrap)


@dataclass(frozen=True, slots=True)
class JudgedComparison:
    """B against A, both judged on the same records: each one's scores over those records, and B - A
    of precision per path and overall."""

    records: int  # judged in both variants
    a: JudgedScores
    b: JudgedScores
    fields: dict[str, Difference]  # per path judged in either
    overall: Difference
    rule: str  # how the difference intervals were made (DIFFERENCE_RULE)


def paired_precision(a: Tally, b: Tally, bootstrap: Bootstrap) -> JudgedComparison:
    """B - A of precision per path and overall, over the records judged in both, resampled with the
    same records on both sides (and with each record's two sides swapped at random, the
    randomization that stays honest when few records differ); intervals simultaneous over the paths
    and the overall difference."""
    import numpy as np

    both = set(b.record_ids)
    records = [record for record in a.record_ids if record in both]
    paths = list(dict.fromkeys([*a.paths, *b.paths]))
    a, b = a.aligned(records, paths), b.aligned(records, paths)
    (extended_a, marked_a), (extended_b, marked_b) = _extended(a), _extended(b)
    sums = bootstrap.resampled_sums(np.hstack([extended_a, extended_b]))
    width = extended_a.shape[1]
    sums_a, sums_b = sums[:, :width], sums[:, width:]
    swapped_a, swapped_b = bootstrap.swapped_sums(extended_a, extended_b)
    scores_a = _scores(a, extended_a, marked_a, sums_a, bootstrap)
    scores_b = _scores(b, extended_b, marked_b, sums_b, bootstrap)
    count = len(paths) + 1
    level = bootstrap.simultaneous(count)
    differences: dict[str, Difference] = {}
    for index, path in enumerate([*paths, OVERALL]):
        block = slice(index * WIDTH, (index + 1) * WIDTH)
        spread = (
            precision_of(sums_b[:, block]) - precision_of(sums_a[:, block]),
            precision_of(swapped_b[:, block]) - precision_of(swapped_a[:, block]),
        )
        values = [scores.field(path).precision.value for scores in (scores_a, scores_b)]
        differences[path] = difference("precision", values[0], values[1], spread, len(records), level)
    overall = differences.pop(OVERALL)
    rule = DIFFERENCE_RULE.format(
        differences=counted(count, "difference"), level=level, family=bootstrap.confidence
    )
    return JudgedComparison(len(records), scores_a, scores_b, differences, overall, rule)


def records_for_margin(estimate: Estimate, margin: float, confidence: float) -> int | None:
    """About how many judged records give an interval of ± ``margin``, from this sample's standard
    error (which shrinks as 1/√records). None without a spread to go by."""
    error = estimate.standard_error
    if not estimate.records or error is None or error <= 0 or margin <= 0:
        return None
    if estimate.ci is None or not has_spread(estimate.ci):
        return None  # resamples all alike: the error is float noise, not a spread
    return max(1, math.ceil(estimate.records * (two_sided_z(confidence) * error / margin) ** 2))


def planned_records(
    precision: float, values_per_record: float, correlation: float, margin: float, confidence: float = 0.95
) -> int:
    """How many judged records give ± ``margin`` on a precision near ``precision``, before judging:
    ``values_per_record`` values each, correlated within a record by ``correlation`` (r, the intraclass
    correlation: 0 when a record's values are right or wrong independently, 1 when all together).

    The variance of the ratio over n records of k values is p(1-p)/(n·k) · (1 + (k-1)·r), the binomial
    variance of n·k values times the design effect of clustering."""
    design_effect = 1 + (values_per_record - 1) * correlation
    variance_per_record = precision * (1 - precision) * design_effect / values_per_record
    return math.ceil(variance_per_record * (two_sided_z(confidence) / margin) ** 2)
