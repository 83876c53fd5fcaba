"""A model judge calibrated by people: prediction-powered inference (PPI) of precision.

People judge a small sample of records (n), a model judges a large one (N) that holds it (the seeded
samples are nested: the n records of ``--sample n`` are among those of ``--sample N``). The model's
precision alone is biased by however often it calls a wrong value right; the people's alone is unbiased
but wide. PPI (Angelopoulos, Bates, Fannjiang, Jordan, Zrnic, *Science* 2023) keeps the people's
target and borrows the model's sample size: the model's mean over N records, corrected by how far the
model is from the people on the n records both judged (the *rectifier*), is unbiased whatever the
model's bias. PPI++ (Angelopoulos, Duchi, Zrnic 2023) weighs the model by λ in [0, 1], tuned to the
smallest variance: λ = 0 is the people alone (a useless model costs nothing), λ near 1 a model that
tracks the people.

Precision is a ratio of sums over records, not a mean of values: per record, Y correct and K judged
values by people, F correct and G judged by the model. It is the root θ of E[Y - θK] = 0, and PPI of
that estimating equation (its M-estimation form) gives

    θ = (λ·mean_N(F) + mean_n(Y) - λ·mean_n(F)) / (λ·mean_N(G) + mean_n(K) - λ·mean_n(G)).

Its variance is the delta method's: with residuals a = F - θG (the model's) and b = Y - θK (the
people's), the n records inside the N and the other N - n independent of them, the numerator's
variance is κ²·var(a)/(N - n) + var(b - κa)/n with κ = λ(N - n)/N, divided by the denominator
squared; the λ that minimises it is cov(a, b)/var(a). The interval is ± t standard errors (Student's
t of n - 1 degrees of freedom: the variance is mostly that of the n records), valid for any model:
the model only changes its width.

When there is no interval, :class:`Combined` says why (:class:`NoInterval`): fewer than two records
judged by both, or no spread: people found the same precision in each of them (most often every value
right). Then the people's residuals are all zero, λ is 0 (the combined estimate is the people's own)
and the delta method's interval has no width; the people-only interval (for a perfect or zero score
the exact binomial bound) is the one that holds, and a record people judge otherwise gives one.

Also: how often the model agrees with people on the values both judged, and Cohen's kappa.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pipeline.quality.bootstrap import two_sided_z
from pipeline.quality.judged_scores import CORRECT, OVERALL, WRONG, Tally
from pipeline.quality.judgments import Judgment, JudgmentVerdict
from pipeline.quality.scores import Interval, interval_json

if TYPE_CHECKING:
    from pipeline.quality.bootstrap import Array

#: How the combined estimate is made, in words (reports print it).
PPI_RULE = (
    "combined: prediction-powered inference (PPI++): the model's precision over its records, corrected "
    "by where it differs from people on the records both judged, the model weighed by λ (0: people "
    "only) for the narrowest interval; unbiased whatever the model's bias; {level:.0%} interval of ± t "
    "standard errors (delta method over records)"
)
MIN_LABELLED = 2  # records both judged, below which there is no variance to go by


class NoInterval(StrEnum):
    """Why a combined estimate has no interval (the report says what would give one)."""

    FEW_RECORDS = "few_records"  # fewer than MIN_LABELLED records judged by both people and the model
    NO_SPREAD = "no_spread"  # people found the same precision in each of them (all right, most often)


@dataclass(frozen=True, slots=True)
class Combined:
    """Precision from people and a model judge together (PPI++), beside the model's own."""

    value: float | None  # None: too few records both judged
    ci: Interval | None
    standard_error: float | None
    power: float  # λ: how much the model's judgments count (0: not at all)
    human_records: int  # n: records judged by both people and the model
    model_records: int  # N: records the model judged
    model_alone: float | None  # the model's own precision over its N records: biased as the model is
    no_interval: NoInterval | None = None  # why ``ci`` is None

    def to_json(self) -> dict[str, Any]:
        why = {"ci_note": str(self.no_interval)} if self.no_interval else {}
        return {
            "value": self.value,
            **(interval_json("ci", self.ci) if self.ci else {"ci": None, **why}),
            "lambda": self.power,
            "records": {"people_and_model": self.human_records, "model": self.model_records},
            "model_alone": self.model_alone,
        }


def ppi_ratio(
    people: tuple[Array, Array],
    model_there: tuple[Array, Array],
    model: tuple[Array, Array],
    confidence: float,
) -> Combined:
    """The PPI++ estimate of sum(Y)/sum(K) with its interval.

    ``people``: (Y, K) per labelled record; ``model_there``: the model's (F, G) on the same records in
    the same order; ``model``: its (F, G) on every record it judged, the labelled ones among them."""
    import numpy as np

    (y, k), (f, g), (f_all, g_all) = people, model_there, model
    n, total = len(y), len(f_all)
    model_alone = float(f_all.sum() / g_all.sum()) if g_all.sum() > 0 else None
    if n < MIN_LABELLED or k.sum() <= 0:
        return Combined(None, None, None, 0.0, n, total, model_alone, NoInterval.FEW_RECORDS)
    power = _tuned_power(people, model_there)
    numerator = power * f_all.mean() + y.mean() - power * f.mean()
    denominator = power * g_all.mean() + k.mean() - power * g.mean()
    if denominator <= 0:  # people judged next to none of the values the model judged
        return Combined(None, None, None, power, n, total, model_alone, NoInterval.FEW_RECORDS)
    theta = float(numerator / denominator)
    others = total - n
    kappa = power * others / total if total else 0.0
    a_all, a, b = f_all - theta * g_all, f - theta * g, y - theta * k
    unlabelled = kappa**2 * float(np.var(a_all, ddof=1)) / others if others > 0 and total > 1 else 0.0
    variance = unlabelled + float(np.var(b - kappa * a, ddof=1)) / n
    error = math.sqrt(max(variance, 0.0)) / float(denominator)
    if error <= 0:  # every residual zero: the same precision in each record, so λ = 0 and no spread
        return Combined(theta, None, 0.0, power, n, total, model_alone, NoInterval.NO_SPREAD)
    half = t_quantile(confidence, n - 1) * error  # t: the variance is mostly the n records' own
    ci = (max(0.0, theta - half), min(1.0, theta + half))
    return Combined(theta, ci, error, power, n, total, model_alone)


def _tuned_power(people: tuple[Array, Array], model_there: tuple[Array, Array]) -> float:
    """λ = cov(a, b) / var(a) at the people's own estimate, clipped to [0, 1] (PPI++ power tuning).

    Both over the records both judged: the slope of the people's residual on the model's. Its
    variance over the model's N records would be steadier alone, but the slope's two estimates err
    together, so it scatters less from sample to sample (which an interval that treats λ as known
    needs: a λ tuned on noise makes it too narrow)."""
    import numpy as np

    (y, k), (f, g) = people, model_there
    start = float(y.sum() / k.sum())
    a, b = f - start * g, y - start * k
    spread = float(np.var(a, ddof=1))
    if spread <= 0:
        return 0.0
    covariance = float(np.cov(a, b, ddof=1)[0, 1])
    return min(1.0, max(0.0, covariance / spread)) if math.isfinite(covariance) else 0.0


def t_quantile(level: float, degrees: int) -> float:
    """The two-sided quantile of Student's t at ``level`` (2.228 for 95% and 10 degrees of freedom),
    by its expansion around the normal's (Abramowitz and Stegun 26.7.5; within 0.005 from 3 degrees),
    exact for 1 and 2."""
    upper = 1 - (1 - level) / 2
    if degrees == 1:
        return math.tan(math.pi * (upper - 0.5))
    if degrees == 2:
        return (2 * upper - 1) / math.sqrt(2 * upper * (1 - upper))
    z = two_sided_z(level)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / float(degrees) ** (power + 1) for power, term in enumerate(terms))


def _precision_sums(block: Array) -> tuple[Array, Array]:
    """(correct, correct + wrong) per record of a (correct, wrong, missing) block."""
    return block[:, CORRECT], block[:, CORRECT] + block[:, WRONG]


def combined_precision(people: Tally, model: Tally, confidence: float) -> dict[str, Combined]:
    """Per path the people judged, and :data:`OVERALL`: precision from the people's judgments on the
    records the model also judged and the model's on all of its records (PPI++)."""
    judged_by_model = set(model.record_ids)
    both = [record for record in people.record_ids if record in judged_by_model]
    paths = people.paths
    labelled = people.aligned(both, paths)
    model_all = model.aligned(model.record_ids, paths)
    model_there = model_all.aligned(both, paths)
    combined = {}
    for path in [*paths, OVERALL]:
        blocks = (
            (one.pooled() if path == OVERALL else one.of_path(path))
            for one in (labelled, model_there, model_all)
        )
        sums = [_precision_sums(block) for block in blocks]
        combined[path] = ppi_ratio(sums[0], sums[1], sums[2], confidence)
    return combined


@dataclass(frozen=True, slots=True)
class JudgeAgreement:
    """How often a model judge says what people say, over the values both judged."""

    values: int  # pairs: a person's verdict and the model's on the same value
    agreeing: int
    kappa: float | None  # Cohen's kappa; None when chance alone would agree on every value

    @property
    def share(self) -> float | None:
        return self.agreeing / self.values if self.values else None

    def to_json(self) -> dict[str, Any]:
        return {"values": self.values, "agreeing": self.agreeing, "share": self.share, "kappa": self.kappa}


def verdict_pairs(
    people: Iterable[Judgment], model: Iterable[Judgment]
) -> list[tuple[JudgmentVerdict, JudgmentVerdict]]:
    """(a person's verdict, the model's) for every value both judged; one pair per person."""
    by_value = {(j.variant, j.record_id, j.field, j.value): JudgmentVerdict(j.verdict) for j in model}
    pairs = []
    for judgment in people:
        found = by_value.get((judgment.variant, judgment.record_id, judgment.field, judgment.value))
        if found is not None:
            pairs.append((JudgmentVerdict(judgment.verdict), found))
    return pairs


def judge_agreement(pairs: Iterable[tuple[JudgmentVerdict, JudgmentVerdict]]) -> JudgeAgreement:
    """The share of pairs that agree, and Cohen's kappa: (observed - chance) / (1 - chance), chance
    being the agreement of two judges who said what they said independently of the value."""
    listed = list(pairs)
    agreeing = sum(person == model for person, model in listed)
    if not listed:
        return JudgeAgreement(0, 0, None)
    total = len(listed)
    chance = sum(
        (sum(person == verdict for person, _ in listed) / total)
        * (sum(model == verdict for _, model in listed) / total)
        for verdict in JudgmentVerdict
    )
    kappa = (agreeing / total - chance) / (1 - chance) if chance < 1 else None
    return JudgeAgreement(total, agreeing, kappa)
