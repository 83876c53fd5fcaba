from __future__ import annotations

import numpy as np
import pytest

from pipeline.quality.bootstrap import Bootstrap, all_alike_bound
from pipeline.quality.intervals import Verdict
from pipeline.quality.judged_scores import (
    OVERALL,
    Tally,
    judged_scores,
    paired_precision,
    planned_records,
    records_for_margin,
    tally_judgments,
)
from pipeline.quality.judgments import Judgment, JudgmentVerdict

CORRECT, WRONG, MISSING = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING
BOOTSTRAP = Bootstrap()


def said(record: str, field: str, value: str, verdict: JudgmentVerdict, judge: str = "ann") -> Judgment:
    return Judgment(record, "main", field, value, verdict, judge)


def tally_of(right: list[int], wrong: list[int], path: str = "skills") -> Tally:
    """One path's tally: record i has right[i] values judged correct and wrong[i] wrong."""
    columns = np.column_stack([right, wrong, np.zeros(len(right))]).astype(float)
    return Tally(tuple(str(index) for index in range(len(right))), (path,), columns)


# Record 1: title right, skills SQL right and Excel wrong. Record 2: title wrong, skills Rust missed.
JUDGED = [
    said("1", "title", "Data Engineer", CORRECT),
    said("1", "skills", "SQL", CORRECT),
    said("1", "skills", "Excel", WRONG),
    said("2", "title", "Chef", WRONG),
    said("2", "skills", "Rust", MISSING),
    said("2", "older_field", "x", CORRECT),
]


def test_judged_values_are_counted_per_record_and_path_in_schema_order() -> None:
    tally = tally_judgments(JUDGED, ["title", "company", "skills"])
    assert tally.record_ids == ("1", "2")
    assert tally.paths == ("title", "skills", "older_field")  # nobody judged company; an old path last
    assert tally.of_path("title").tolist() == [[1, 0, 0], [0, 1, 0]]
    assert tally.of_path("skills").tolist() == [[1, 1, 0], [0, 0, 1]]
    assert tally.pooled().tolist() == [[2, 1, 0], [1, 1, 1]]


def test_a_value_several_people_judged_counts_once_split_by_their_verdicts() -> None:
    judged = [
        said("1", "title", "Chef", CORRECT, "ann"),
        said("1", "title", "Chef", CORRECT, "bob"),
        said("1", "title", "Chef", WRONG, "cy"),
        said("1", "skills", "SQL", WRONG, "ann"),
    ]
    tally = tally_judgments(judged, ["title", "skills"])
    assert tally.of_path("title")[0] == pytest.approx([2 / 3, 1 / 3, 0])
    precision = judged_scores(tally, BOOTSTRAP).field("title").precision
    assert precision.judged == 1
    assert precision.correct == precision.value == pytest.approx(2 / 3)
    assert precision.to_json()["correct"] == 0.667


def test_precision_counts_correct_and_wrong_and_recall_only_where_misses_were_marked() -> None:
    scores = judged_scores(tally_judgments(JUDGED, ["title", "skills"]), BOOTSTRAP)
    title, skills = scores.field("title"), scores.field("skills")
    assert (title.precision.value, title.precision.judged, title.precision.correct) == (0.5, 2, 1)
    assert title.recall is None  # no miss marked in titles: nobody may have looked
    assert (skills.precision.value, skills.recall and skills.recall.value) == (0.5, 0.5)
    assert scores.overall.precision.value == pytest.approx(3 / 5)  # 2 titles, 2 skills, 1 older
    assert scores.overall.recall is not None and scores.overall.recall.value == 0.5  # skills alone
    assert scores.recall_paths == ("skills",)
    # one record: every resample the same, no interval (not certainty)
    assert skills.to_json()["precision"] == {
        "value": 0.5,
        "ci": None,
        "ci_note": "sample too small",
        "judged": 2,
        "correct": 1,
        "wrong": 1,
        "records": 1,
    }
    assert skills.to_json()["recall"]["missing"] == 1


def test_the_interval_resamples_records_so_values_that_go_together_widen_it() -> None:
    # 1,000 values, half right, either 10 to a record that is all right or all wrong, or 1 to a record
    together = judged_scores(tally_of([10] * 50 + [0] * 50, [0] * 50 + [10] * 50), BOOTSTRAP)
    apart = judged_scores(tally_of([1] * 500 + [0] * 500, [0] * 500 + [1] * 500), BOOTSTRAP)
    low, high = together.overall.precision.ci or (0, 0)
    low_apart, high_apart = apart.overall.precision.ci or (0, 0)
    assert together.overall.precision.value == apart.overall.precision.value == 0.5
    # 100 records of 0 or 1: ±1.96·0.05 = ±0.098; 1,000 independent values: ±0.031 (√10 narrower)
    assert high - low == pytest.approx(0.196, abs=0.03)
    assert high_apart - low_apart == pytest.approx(0.062, abs=0.01)


def test_every_value_right_gets_the_exact_bound_of_its_records_not_certainty() -> None:
    scores = judged_scores(tally_of([3] * 40, [0] * 40), BOOTSTRAP)
    bound = all_alike_bound(40, 0.95)
    assert bound is not None
    assert scores.overall.precision.ci == pytest.approx((1 - bound, 1.0))


def test_records_for_a_margin_scale_with_the_square_of_the_standard_error() -> None:
    estimate = judged_scores(tally_of([4, 3, 5, 2] * 25, [1, 2, 0, 3] * 25), BOOTSTRAP).overall.precision
    assert estimate.standard_error is not None
    expected = 100 * (1.959964 * estimate.standard_error / 0.05) ** 2
    assert records_for_margin(estimate, 0.05, 0.95) == pytest.approx(expected, abs=1)
    assert records_for_margin(estimate, 0.025, 0.95) == pytest.approx(4 * expected, abs=4)


def test_records_for_a_margin_are_not_guessed_without_a_spread() -> None:
    every_record_alike = judged_scores(tally_of([1] * 30, [1] * 30), BOOTSTRAP).overall.precision
    assert every_record_alike.value == 0.5 and every_record_alike.ci is not None
    assert records_for_margin(every_record_alike, 0.05, 0.95) is None  # no width: nothing to go by
    all_right = judged_scores(tally_of([3] * 40, [0] * 40), BOOTSTRAP).overall.precision
    assert records_for_margin(all_right, 0.05, 0.95) is None


def test_planned_records_are_the_binomial_times_the_design_effect() -> None:
    # 0.8·0.2 / 5 values · (1.96 / 0.05)² = 49.2 records when values are independent
    assert planned_records(0.8, 5, 0.0, 0.05) == 50
    # correlation 0.2 within a record: design effect 1 + 4·0.2 = 1.8, so 88.5
    assert planned_records(0.8, 5, 0.2, 0.05) == 89
    assert planned_records(0.8, 1, 0.9, 0.05) == 246  # one value a record: nothing to cluster


def test_b_right_where_a_is_wrong_on_every_record_is_better() -> None:
    a = tally_of([2] * 60, [2] * 60)
    b = tally_of([4] * 60, [0] * 60)
    comparison = paired_precision(a, b, BOOTSTRAP)
    overall = comparison.overall
    assert (comparison.records, overall.value, overall.verdict) == (60, 0.5, Verdict.BETTER)
    assert comparison.fields["skills"].verdict is Verdict.BETTER
    assert comparison.a.overall.precision.value == 0.5 and comparison.b.overall.precision.value == 1.0
    assert set(overall.to_json()) >= {"metric", "value", "ci", "verdict", "records_needed"}
    assert overall.metric == "precision"
    assert "simultaneous over the 2 differences" in comparison.rule


def test_alike_variants_are_no_detectable_difference_and_only_shared_records_count() -> None:
    rng = np.random.default_rng(3)
    right = rng.integers(0, 5, 80).tolist()
    wrong = rng.integers(0, 3, 80).tolist()
    a = tally_of(right, wrong)
    b = tally_of([*right, 5, 5], [*wrong, 0, 0])  # two records judged in B only
    comparison = paired_precision(a, b, BOOTSTRAP)
    assert comparison.records == 80
    assert comparison.overall.value == 0.0
    assert comparison.overall.verdict is Verdict.NONE
    ci = comparison.overall.ci
    assert ci is not None and ci[0] < 0 < ci[1]


def test_a_small_difference_says_how_many_records_would_detect_it() -> None:
    rng = np.random.default_rng(4)
    right = rng.integers(1, 6, 50)
    wrong = rng.integers(0, 3, 50)
    better = right.copy()
    better[:6] += 1  # B has a few more right values on some records, fewer on others
    better[6:10] -= 1
    comparison = paired_precision(
        tally_of(right.tolist(), wrong.tolist()), tally_of(better.tolist(), wrong.tolist()), BOOTSTRAP
    )
    assert comparison.overall.value is not None and comparison.overall.value > 0
    assert comparison.overall.verdict is Verdict.NONE
    assert comparison.overall.records_needed is not None and comparison.overall.records_needed > 50


def test_a_path_judged_in_one_variant_only_has_no_difference() -> None:
    a = tally_of([1, 2], [1, 0], path="title")
    b = tally_of([1, 2], [1, 0], path="skills")
    comparison = paired_precision(a, b, BOOTSTRAP)
    assert comparison.fields["title"].value is None and comparison.fields["skills"].value is None
    assert OVERALL not in comparison.fields
