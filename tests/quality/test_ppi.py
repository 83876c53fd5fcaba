from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.quality.bootstrap import Bootstrap
from pipeline.quality.judged_scores import OVERALL, Tally, judged_scores
from pipeline.quality.judgments import Judgment, JudgmentVerdict
from pipeline.quality.ppi import (
    NoInterval,
    combined_precision,
    judge_agreement,
    ppi_ratio,
    t_quantile,
    verdict_pairs,
)

CORRECT, WRONG, MISSING = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING


def arrays(*values: list[float]) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(value, dtype=float) for value in values)


def tally(right: np.ndarray, wrong: np.ndarray, first: int = 0) -> Tally:
    ids = tuple(str(first + index) for index in range(len(right)))
    return Tally(ids, ("skills",), np.column_stack([right, wrong, np.zeros(len(right))]).astype(float))


def test_a_small_case_by_hand() -> None:
    # People on records 1-2: 1 of 2 and 2 of 2 right; the model says the same there, and on records
    # 3-4 (judged by it alone) 2 of 2 and 0 of 2.
    y, k, f, g = arrays([1, 2], [2, 2], [1, 2], [2, 2])
    f_all, g_all = arrays([1, 2, 2, 0], [2, 2, 2, 2])
    combined = ppi_ratio((y, k), (f, g), (f_all, g_all), 0.95)
    # At the people's 3/4: residuals a = b = (-0.5, 0.5) on records 1-2, so λ = cov/var = 1.
    assert combined.power == 1.0
    # θ = (1·1.25 + 1.5 - 1·1.5) / (1·2 + 2 - 1·2) = 1.25 / 2: the model's own mean over all four
    assert combined.value == pytest.approx(0.625)
    assert combined.model_alone == pytest.approx(0.625)
    assert (combined.human_records, combined.model_records) == (2, 4)
    # at θ = 5/8: a_all = (-0.25, 0.75, 0.75, -1.25), var 11/12; on records 1-2 b = a = (-0.25, 0.75);
    # κ = λ·2/4 = 0.5, so b - κa = a/2, var 1/8; the numerator's variance is 0.5²·(11/12)/2 + (1/8)/2,
    # its standard error over the denominator 2 that of θ
    expected = math.sqrt(0.25 * (11 / 12) / 2 + (1 / 8) / 2) / 2
    assert combined.standard_error == pytest.approx(expected)
    half = t_quantile(0.95, 1) * expected
    assert combined.ci == pytest.approx((max(0.0, 0.625 - half), min(1.0, 0.625 + half)))


def test_a_model_that_says_nothing_the_people_do_not_weighs_nothing() -> None:
    y, k = arrays([1, 2, 0], [2, 2, 2])
    f, g = arrays([1, 1, 1], [2, 2, 2])  # the same verdicts on every record: no information
    f_all, g_all = arrays([1, 1, 1, 2, 0], [2, 2, 2, 2, 2])
    combined = ppi_ratio((y, k), (f, g), (f_all, g_all), 0.95)
    assert combined.power == 0.0
    assert combined.value == pytest.approx(0.5)  # the people's 3 of 6


def test_too_few_records_judged_by_both_give_no_estimate_and_say_so() -> None:
    y, k = arrays([1], [2])
    f_all, g_all = arrays([1, 1], [2, 2])
    combined = ppi_ratio((y, k), (y, k), (f_all, g_all), 0.95)
    assert combined.value is None and combined.ci is None and combined.model_alone == 0.5
    assert combined.no_interval is NoInterval.FEW_RECORDS
    assert combined.to_json()["ci_note"] == "few_records"


def test_people_finding_every_value_right_give_their_own_estimate_and_no_interval_of_no_width() -> None:
    y, k = arrays([2, 3, 1], [2, 3, 1])  # every value people judged is right
    f, g = arrays([1, 3, 1], [2, 3, 1])  # the model calls one of them wrong
    f_all, g_all = arrays([1, 3, 1, 0, 2], [2, 3, 1, 1, 2])
    combined = ppi_ratio((y, k), (f, g), (f_all, g_all), 0.95)
    assert (combined.value, combined.power) == (1.0, 0.0)  # λ = 0: the people's own precision
    assert combined.ci is None and combined.no_interval is NoInterval.NO_SPREAD
    assert combined.to_json()["ci"] is None and combined.to_json()["ci_note"] == "no_spread"
    # One wrong value among people's gives a spread, and an interval.
    y, k = arrays([2, 2, 1], [2, 3, 1])
    assert ppi_ratio((y, k), (f, g), (f_all, g_all), 0.95).ci is not None


def test_the_t_quantile_matches_the_tables() -> None:
    assert t_quantile(0.95, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.95, 2) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(0.95, 5) == pytest.approx(2.571, abs=1e-3)
    assert t_quantile(0.95, 10) == pytest.approx(2.228, abs=1e-3)
    assert t_quantile(0.99, 30) == pytest.approx(2.750, abs=1e-3)
    assert t_quantile(0.95, 10_000) == pytest.approx(1.960, abs=1e-3)


def draw(rng: np.random.Generator, records: int, precision: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    values = 1 + rng.poisson(4, records)
    right = rng.binomial(values, rng.beta(precision * 4, (1 - precision) * 4, records))
    return right, values - right


def test_a_model_that_agrees_with_people_narrows_the_interval_to_its_own_sample() -> None:
    rng = np.random.default_rng(1)
    right, wrong = draw(rng, 2000)
    people, model = tally(right[:100], wrong[:100]), tally(right, wrong)
    combined = combined_precision(people, model, 0.95)[OVERALL]
    alone = judged_scores(people, Bootstrap()).overall.precision
    assert combined.power == pytest.approx(1.0)
    assert combined.value == pytest.approx(right.sum() / (right + wrong).sum())  # the model's, over 2,000
    assert combined.ci is not None and alone.ci is not None
    assert (combined.ci[1] - combined.ci[0]) < 0.5 * (alone.ci[1] - alone.ci[0])


def lenient(rng: np.random.Generator, right: np.ndarray, wrong: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A model judge that calls half the wrong values right (and every right one right)."""
    passed = rng.binomial(wrong, 0.5)
    return right + passed, wrong - passed


def test_a_biased_model_leaves_the_combined_estimate_unbiased_and_its_interval_honest() -> None:
    rng = np.random.default_rng(2)
    values, alone, covered = [], [], 0
    for _ in range(400):
        right, wrong = draw(rng, 1000)
        model = tally(*lenient(rng, right, wrong))
        combined = combined_precision(tally(right[:60], wrong[:60]), model, 0.95)[OVERALL]
        assert combined.value is not None and combined.ci is not None and combined.model_alone is not None
        values.append(combined.value)
        alone.append(combined.model_alone)
        covered += combined.ci[0] <= 0.8 <= combined.ci[1]
    assert np.mean(alone) == pytest.approx(0.9, abs=0.01)  # the model alone: 0.8 + 0.2 / 2
    assert np.mean(values) == pytest.approx(0.8, abs=0.005)  # ~0.0015 is the noise of 400 means
    assert covered / 400 >= 0.91


def test_only_records_the_model_judged_too_calibrate_it() -> None:
    rng = np.random.default_rng(3)
    right, wrong = draw(rng, 300)
    people = tally(right[:50], wrong[:50], first=250)  # records 250-299: 50 people-judged
    model = tally(right, wrong)  # records 0-299
    combined = combined_precision(people, model, 0.95)
    assert set(combined) == {"skills", OVERALL}
    assert (combined[OVERALL].human_records, combined[OVERALL].model_records) == (50, 300)
    outside = tally(right[:50], wrong[:50], first=1000)  # none of them judged by the model
    assert combined_precision(outside, model, 0.95)[OVERALL].value is None


def judgment(record: str, value: str, verdict: JudgmentVerdict, judge: str) -> Judgment:
    return Judgment(record, "main", "skills", value, verdict, judge)


def test_agreement_and_kappa_by_hand() -> None:
    people = [
        judgment("1", "SQL", CORRECT, "ann"),
        judgment("1", "Excel", CORRECT, "ann"),
        judgment("2", "Chef", WRONG, "ann"),
        judgment("2", "Rust", CORRECT, "ann"),
        judgment("2", "Rust", CORRECT, "bob"),  # a second person on the same value: a pair of its own
        judgment("3", "Go", CORRECT, "ann"),  # the model did not judge this one
    ]
    model = [
        judgment("1", "SQL", CORRECT, "model:m"),
        judgment("1", "Excel", CORRECT, "model:m"),
        judgment("2", "Chef", WRONG, "model:m"),
        judgment("2", "Rust", WRONG, "model:m"),
    ]
    pairs = verdict_pairs(people, model)
    assert len(pairs) == 5
    agreement = judge_agreement(pairs)
    assert (agreement.values, agreement.agreeing, agreement.share) == (5, 3, 0.6)
    # people: 4 correct, 1 wrong; model: 2 correct, 3 wrong. chance = 4/5·2/5 + 1/5·3/5 = 11/25
    assert agreement.kappa == pytest.approx((0.6 - 11 / 25) / (1 - 11 / 25))


def test_agreement_without_values_both_judged_or_with_one_verdict_only() -> None:
    assert judge_agreement([]).share is None
    same = judge_agreement([(CORRECT, CORRECT)] * 3)
    assert (same.share, same.kappa) == (1.0, None)  # chance agrees on everything: kappa says nothing
