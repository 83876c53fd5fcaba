"""Whether the precision intervals of ``pipeline eval --judged`` hold, and what a model judge buys: on
synthetic judgments with a known truth, the coverage and width of the 95% intervals from people alone
(the cluster bootstrap) and from people and a model judge together (PPI++).

    .venv/bin/python benchmarks/judge_calibration.py                 # 1,000 trials per model accuracy
    .venv/bin/python benchmarks/judge_calibration.py --trials 200 --accuracies 0.7,0.9

Each trial draws N records (2,000) with about 5 values each (1 + Poisson(4)), each record with a
precision of its own drawn from a Beta of mean 0.8 whose intraclass correlation is 0.2 (a record's
values are right or wrong together more often than apart: that is what the record-level intervals are
for), and its values right or wrong by it. People judge the values of the first n records (100) as
they are (the truth); the model judges all N records' values, each right with probability
``accuracy`` (0.6, 0.8, 0.95), so its own precision is biased (0.56 at 0.6: it calls right values
wrong and wrong ones right alike). Coverage: the share of trials whose interval holds the true 0.8;
wanted: at least 0.93 for both, and the combined interval at most 0.7 of the people's width at 0.95.

The second table is the planning number for the README: how many judged records give ±0.05 on a
precision near 0.8 with 5 values per record, from the variance model of
:func:`pipeline.quality.judged_scores.planned_records` (binomial times the design effect of
clustering), checked by drawing that many records and measuring the interval's half-width.

Every number comes from the functions ``eval --judged`` calls (:func:`judged_scores`,
:func:`combined_precision`); the first trial of each accuracy also goes through
:func:`tally_judgments` from :class:`Judgment` objects, and must give the same tallies. Nothing here is
a pass/fail test; it prints tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.quality.bootstrap import Bootstrap
from pipeline.quality.judged_scores import OVERALL, Tally, judged_scores, planned_records, tally_judgments
from pipeline.quality.judgments import Judgment, JudgmentVerdict, model_judge
from pipeline.quality.ppi import NoInterval, combined_precision

Counts = npt.NDArray[np.int64]
PATH = "skills"


@dataclass(frozen=True)
class Synthetic:
    precision: float = 0.8
    correlation: float = 0.2  # intraclass: how much a record's values are right or wrong together
    values: float = 5.0  # per record, on average
    fixed_values: bool = False  # every record exactly ``values`` values (the planning table)

    def records(self, rng: np.random.Generator, count: int) -> tuple[Counts, Counts]:
        """Each record's values that are right and wrong."""
        size = (
            np.full(count, int(self.values)) if self.fixed_values else 1 + rng.poisson(self.values - 1, count)
        )
        if self.correlation > 0:
            spread = (1 - self.correlation) / self.correlation  # alpha + beta of the Beta
            own = rng.beta(self.precision * spread, (1 - self.precision) * spread, count)
        else:
            own = np.full(count, self.precision)
        right = rng.binomial(size, own)
        return right, size - right


def judged_by_model(
    rng: np.random.Generator, right: Counts, wrong: Counts, accuracy: float
) -> tuple[Counts, Counts]:
    """What a judge right with probability ``accuracy`` on each value says: (correct, wrong) per record."""
    missed_right = rng.binomial(right, 1 - accuracy)
    missed_wrong = rng.binomial(wrong, 1 - accuracy)
    said_correct = right - missed_right + missed_wrong
    return said_correct, right + wrong - said_correct


def tally(right: Counts, wrong: Counts) -> Tally:
    columns = np.column_stack([right, wrong, np.zeros_like(right)]).astype(np.float64)
    return Tally(tuple(str(index) for index in range(len(right))), (PATH,), columns)


def through_judgments(people: Tally, model: Tally) -> tuple[Tally, Tally]:
    """The same tallies made from judgments, as ``eval --judged`` makes them from the database."""

    def judgments(source: Tally, judge: str) -> list[Judgment]:
        made = []
        for record, (right, wrong, _) in zip(source.record_ids, source.columns, strict=True):
            verdicts = [JudgmentVerdict.CORRECT] * int(right) + [JudgmentVerdict.WRONG] * int(wrong)
            made += [Judgment(record, "main", PATH, f"v{i}", v, judge) for i, v in enumerate(verdicts)]
        return made

    return tally_judgments(judgments(people, "ann"), [PATH]), tally_judgments(
        judgments(model, model_judge("m")), [PATH]
    )


@dataclass
class Outcome:
    covered_people: int = 0
    covered_combined: int = 0
    width_people: float = 0.0
    width_combined: float = 0.0
    model_alone: float = 0.0
    combined: float = 0.0
    power: float = 0.0
    trials: int = 0

    def row(self, accuracy: float) -> str:
        t = self.trials
        ratio = self.width_combined / self.width_people
        return (
            f"{accuracy:>8.2f}  {self.covered_people / t:>10.3f}  {self.covered_combined / t:>10.3f}  "
            f"{self.width_people / t:>9.3f}  {self.width_combined / t:>9.3f}  {ratio:>11.2f}  "
            f"{self.model_alone / t:>11.3f}  {self.combined / t:>8.3f}  {self.power / t:>5.2f}"
        )


def trial(
    rng: np.random.Generator, args: argparse.Namespace, accuracy: float, bootstrap: Bootstrap, check: bool
) -> tuple[tuple[float, float], tuple[float, float], float, float, float]:
    synthetic = Synthetic(args.precision, args.correlation, args.values)
    right, wrong = synthetic.records(rng, args.records)
    model = tally(*judged_by_model(rng, right, wrong, accuracy))
    people = tally(right[: args.people], wrong[: args.people])
    if check:
        made = through_judgments(people, model)
        assert all(np.array_equal(a.columns, b.columns) for a, b in zip(made, (people, model), strict=True))
    alone = judged_scores(people, bootstrap).overall.precision
    combined = combined_precision(people, model, bootstrap.confidence)[OVERALL]
    # No spread among the people's records (all right): the combined estimate is theirs, and so is
    # the interval that holds for it (what eval --judged says of it).
    combined_ci = alone.ci if combined.no_interval is NoInterval.NO_SPREAD else combined.ci
    if alone.ci is None or combined_ci is None or combined.value is None or combined.model_alone is None:
        raise RuntimeError("a trial without an interval")
    return alone.ci, combined_ci, combined.model_alone, combined.value, combined.power


def calibration_table(args: argparse.Namespace) -> list[str]:
    bootstrap = Bootstrap(args.resamples, 0)
    truth = args.precision
    lines = [
        f"{args.trials:,} trials each: {args.people} people-judged records inside {args.records:,} "
        f"model-judged, ~{args.values:g} values a record, precision {truth}, intraclass correlation "
        f"{args.correlation}",
        "accuracy  cover ppl  cover comb  width ppl  width comb  comb / ppl  model alone  combined  λ",
    ]
    for accuracy in args.accuracies:
        rng = np.random.default_rng([args.seed, round(accuracy * 1000)])
        outcome = Outcome()
        for index in range(args.trials):
            people, combined, alone, value, power = trial(rng, args, accuracy, bootstrap, check=index == 0)
            outcome.covered_people += people[0] <= truth <= people[1]
            outcome.covered_combined += combined[0] <= truth <= combined[1]
            outcome.width_people += people[1] - people[0]
            outcome.width_combined += combined[1] - combined[0]
            outcome.model_alone += alone
            outcome.combined += value
            outcome.power += power
            outcome.trials += 1
        lines.append(outcome.row(accuracy))
    return lines


def planning_table(args: argparse.Namespace) -> list[str]:
    """Records for ±0.05 by the variance model, and the half-width and coverage drawn at that size."""
    bootstrap, truth, values = Bootstrap(args.resamples, 0), args.precision, 5
    lines = [
        f"records for ±0.05 at precision {truth}, {values} values a record ({args.plan_trials:,} draws each)",
        "correlation  records (model)  half-width (drawn)  coverage",
    ]
    for correlation in (0.0, 0.1, 0.2, 0.3):
        needed = planned_records(truth, values, correlation, 0.05)
        synthetic = Synthetic(truth, correlation, values, fixed_values=True)
        rng = np.random.default_rng([args.seed, 7, round(correlation * 100)])
        half, covered = 0.0, 0
        for _ in range(args.plan_trials):
            ci = judged_scores(tally(*synthetic.records(rng, needed)), bootstrap).overall.precision.ci
            if ci is None:
                raise RuntimeError("a draw without an interval")
            half += (ci[1] - ci[0]) / 2
            covered += ci[0] <= truth <= ci[1]
        lines.append(
            f"{correlation:>11.1f}  {needed:>15,}  {half / args.plan_trials:>18.3f}  "
            f"{covered / args.plan_trials:>8.3f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=1000, help="trials per model accuracy")
    parser.add_argument(
        "--accuracies", type=lambda text: [float(x) for x in text.split(",")], default=[0.6, 0.8, 0.95]
    )
    parser.add_argument("--people", type=int, default=100, help="records people judge (n)")
    parser.add_argument("--records", type=int, default=2000, help="records the model judges (N)")
    parser.add_argument("--precision", type=float, default=0.8)
    parser.add_argument("--correlation", type=float, default=0.2, help="intraclass correlation of values")
    parser.add_argument("--values", type=float, default=5.0, help="values per record, on average")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (as eval)")
    parser.add_argument("--plan-trials", type=int, default=500, help="draws per row of the planning table")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    for line in [*calibration_table(args), "", *planning_table(args)]:
        print(line, flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
