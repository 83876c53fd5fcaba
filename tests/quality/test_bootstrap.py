"""Bootstrap intervals and paired differences: they cover the known truth in seeded simulations, agree
with the point scores, and are paired (what two measurements share cancels out)."""

from __future__ import annotations

import math
import random
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.quality.agreement import measure_agreement
from pipeline.quality.bootstrap import Bootstrap, all_alike_bound, list_ratios, records_to_detect
from pipeline.quality.intervals import (
    Verdict,
    noise_floor,
    paired_differences,
    resample,
    swapped,
    with_intervals,
)
from pipeline.quality.intervals import difference as paired_difference
from pipeline.quality.scores import TOO_SMALL, AgreementReport, FieldScore, format_table
from tests.support.quality_schemas import posting_fields

SKILLS = [f"skill {index}" for index in range(40)]


def simulated(
    rng: random.Random, records: int, match: float, found: float
) -> tuple[dict[int, Any], dict[int, Any]]:
    """Gold and an extraction whose right answers are known in expectation: ``level`` is right with
    probability ``match``; each gold skill is found with probability ``found`` and one wrong skill is
    added with probability 0.3."""
    gold, extracted = {}, {}
    for record in range(records):
        wanted = rng.sample(SKILLS, rng.randint(0, 4))
        got = [skill for skill in wanted if rng.random() < found]
        if rng.random() < 0.3:
            got.append("wrong skill")
        level = rng.choice(["junior", "senior"])
        other = "senior" if level == "junior" else "junior"
        gold[record] = {"level": level, "skills": wanted}
        extracted[record] = {"level": level if rng.random() < match else other, "skills": got}
    return gold, extracted


def measured(
    gold: dict[int, Any], extracted: dict[int, Any], bootstrap: Bootstrap | None = None
) -> AgreementReport:
    return with_intervals(measure_agreement(gold, extracted, posting_fields()), bootstrap or Bootstrap())


def by_path(report: AgreementReport, path: str) -> FieldScore:
    (score,) = [score for score in report.fields if score.path == path]
    return score


def test_a_95_percent_interval_covers_the_truth_in_at_least_90_percent_of_200_seeded_trials() -> None:
    # Truth: level accuracy 0.7; skills: each of a mean 2 gold skills found with p 0.6, plus 0.3 wrong
    # ones per record, so E[TP] = 1.2, E[reference] = 2, E[candidate] = 1.5 and micro F1 = 2.4 / 3.5.
    true_accuracy, true_f1 = 0.7, 2 * 1.2 / (2 + 1.5)
    covered_accuracy = covered_f1 = 0
    for trial in range(200):
        gold, extracted = simulated(random.Random(trial), 200, match=0.7, found=0.6)
        report = measured(gold, extracted, Bootstrap(resamples=1000, seed=trial))
        low, high = by_path(report, "level").ci["accuracy"]
        covered_accuracy += low <= true_accuracy <= high
        low, high = by_path(report, "skills").ci["f1"]
        covered_f1 += low <= true_f1 <= high
    assert covered_accuracy >= 180, covered_accuracy
    assert covered_f1 >= 180, covered_f1


def test_intervals_surround_the_point_scores_and_shrink_with_more_records() -> None:
    small = measured(*simulated(random.Random(1), 100, match=0.8, found=0.5))
    large = measured(*simulated(random.Random(1), 2000, match=0.8, found=0.5))
    for report in (small, large):
        level, skills = by_path(report, "level"), by_path(report, "skills")
        assert level.accuracy is not None and skills.micro and skills.macro and report.micro and report.macro
        assert level.ci["accuracy"][0] <= level.accuracy <= level.ci["accuracy"][1]
        for name, value in (("precision", skills.micro.precision), ("f1", skills.micro.f1)):
            assert skills.ci[name][0] <= value <= skills.ci[name][1]
        assert skills.ci["macro_f1"][0] <= skills.macro.f1 <= skills.ci["macro_f1"][1]
        assert report.micro_ci["f1"][0] <= report.micro.f1 <= report.micro_ci["f1"][1]
        assert report.macro_ci is not None
        assert report.macro_ci[0] <= report.macro <= report.macro_ci[1]

    def width(report: AgreementReport) -> float:
        low, high = by_path(report, "level").ci["accuracy"]
        return float(high - low)

    assert width(large) < width(small) / 3  # about 1/sqrt(20)


def test_the_same_seed_draws_the_same_intervals_and_another_seed_other_ones() -> None:
    gold, extracted = simulated(random.Random(5), 150, match=0.6, found=0.5)
    first = by_path(measured(gold, extracted, Bootstrap(seed=3)), "skills").ci
    again = by_path(measured(gold, extracted, Bootstrap(seed=3)), "skills").ci
    other = by_path(measured(gold, extracted, Bootstrap(seed=4)), "skills").ci
    assert first == again
    assert first != other


def test_resampled_sums_are_weights_times_columns_with_n_draws_per_resample() -> None:
    columns = np.arange(12, dtype=np.float32).reshape(4, 3)
    ones = np.ones((4, 1), dtype=np.float32)
    sums = Bootstrap(resamples=200, seed=1).resampled_sums(np.hstack([columns, ones]))
    assert sums.shape == (200, 4)
    assert np.all(sums[:, 3] == 4)  # each resample draws as many records as there are
    # Every row of columns is (3k, 3k+1, 3k+2): the sums keep that shape, whatever was drawn.
    assert np.allclose(sums[:, 1] - sums[:, 0], 4) and np.allclose(sums[:, 2] - sums[:, 0], 8)


def test_pooled_ratios_follow_the_list_rules_including_empty_sides() -> None:
    tp, reference, candidate = (np.array(values, dtype=float) for values in ([0, 2, 0], [0, 4, 3], [0, 2, 0]))
    precision, recall, f1 = list_ratios(tp, reference, candidate)
    assert list(precision) == [1.0, 1.0, 0.0]
    assert list(recall) == [1.0, 0.5, 0.0]
    assert list(f1) == [1.0, pytest.approx(4 / 6), 0.0]


def test_a_variant_against_itself_is_no_detectable_difference_within_the_bound_of_its_records() -> None:
    """Alike on all 300 records: no resample moves the difference, so the interval is the exact bound of
    the share of records that could differ, at the difference's (simultaneous) level."""
    gold, extracted = simulated(random.Random(2), 300, match=0.7, found=0.6)
    report = measured(gold, extracted)
    paired = paired_differences(report, report, Bootstrap())
    for difference in [*paired.fields.values(), paired.micro_f1]:
        share = all_alike_bound(300, difference.level)
        assert share is not None and 0.01 < share < 0.03
        assert difference.value == 0 and difference.ci == (-share, share)
        assert difference.verdict is Verdict.NONE and difference.records_needed is None
        assert difference.describe() == f"+0.000 [{-share:+.3f}, {share:+.3f}] no detectable difference"
        assert difference.to_json()["ci"] == [-share, share]


def test_one_record_says_the_sample_is_too_small_and_a_perfect_score_gives_the_exact_bound() -> None:
    """Before: ``1.000 [1.000-1.000]``, as if one record, or 40 that all agree, made the score certain.
    One record is too small a sample to say anything; 40 that all agree say the score is at least
    1 - 0.025^(1/40) = 0.912 (Clopper-Pearson, 95%), which no resample can show."""
    one = measured({1: {"level": "junior", "skills": ["sql"]}}, {1: {"level": "junior", "skills": ["sql"]}})
    level = by_path(one, "level")
    assert level.ci["accuracy"][0] == level.ci["accuracy"][1] == 1.0
    table = format_table(one)
    assert "1.000-1.000" not in table and TOO_SMALL in table
    assert f"F1 1.000 [{TOO_SMALL}]" in table
    data = one.to_json()["fields"]["level"]
    assert data["accuracy_ci"] is None and data["accuracy_ci_note"] == TOO_SMALL
    assert one.to_json()["macro"]["score_ci"] is None
    gold, _ = simulated(random.Random(12), 40, match=1.0, found=1.0)
    perfect = measured(gold, gold)
    low = 1 - 0.025 ** (1 / 40)
    assert by_path(perfect, "level").ci["accuracy"] == pytest.approx((1 - low, 1.0))
    table = format_table(perfect)
    assert TOO_SMALL not in table and f"F1 1.000 [{1 - low:.3f}-1.000]" in table
    assert "a perfect or zero score: the exact binomial bound for that many records" in table
    assert perfect.to_json()["fields"]["level"]["accuracy_ci"] == pytest.approx([1 - low, 1.0])
    # a score with a spread keeps its interval
    spread = measured(*simulated(random.Random(13), 40, match=0.7, found=0.6))
    assert TOO_SMALL not in format_table(spread) and spread.to_json()["fields"]["level"]["accuracy_ci"]


def test_a_difference_shown_as_zero_is_given_no_records_to_detect_it() -> None:
    """+0.0002 prints as +0.000: "needs about 22,065 records" to detect a difference the report shows
    as none would be noise about noise."""
    spread = (np.full(1000, 0.0002) + np.linspace(-0.01, 0.01, 1000), np.linspace(-0.01, 0.01, 1000))
    tiny = paired_difference("f1", 0.5, 0.5002, spread, 300, 0.95)
    assert tiny.verdict is Verdict.NONE and tiny.records_needed is None
    assert "records" not in tiny.describe() and tiny.describe().startswith("+0.000 [")
    shown = paired_difference("f1", 0.5, 0.503, spread, 300, 0.95)
    assert shown.records_needed is not None and shown.records_needed > 300


def test_a_better_variant_is_better_and_a_worse_one_worse() -> None:
    rng = random.Random(3)
    gold, weak = simulated(rng, 400, match=0.6, found=0.4)
    strong = {
        key: {
            "level": gold[key]["level"] if rng.random() < 0.9 else weak[key]["level"],
            "skills": gold[key]["skills"],
        }
        for key in gold
    }
    a, b = measured(gold, weak), measured(gold, strong)
    forward = paired_differences(a, b, Bootstrap())
    assert forward.fields["level"].verdict is Verdict.BETTER and forward.fields["level"].metric == "accuracy"
    assert forward.fields["skills"].verdict is Verdict.BETTER and forward.fields["skills"].metric == "f1"
    assert forward.micro_f1.verdict is Verdict.BETTER
    skills_a, skills_b = by_path(a, "skills").agreement, by_path(b, "skills").agreement
    assert skills_a is not None and skills_b is not None
    assert forward.fields["skills"].value == pytest.approx(skills_b - skills_a)
    backward = paired_differences(b, a, Bootstrap())
    assert backward.fields["skills"].verdict is Verdict.WORSE
    assert "worse" in backward.fields["skills"].describe()


def test_pairing_detects_a_small_difference_that_two_separate_intervals_would_not() -> None:
    # B fixes 6% of A's wrong levels and changes nothing else: the separate intervals overlap, the
    # paired one does not (the records both get right or both get wrong cancel out).
    rng = random.Random(4)
    gold, a_side = simulated(rng, 300, match=0.7, found=0.6)
    b_side = {key: dict(value) for key, value in a_side.items()}
    wrong = [key for key in gold if a_side[key]["level"] != gold[key]["level"]]
    for key in wrong[: len(wrong) // 5]:
        b_side[key]["level"] = gold[key]["level"]
    a, b = measured(gold, a_side), measured(gold, b_side)
    a_ci, b_ci = by_path(a, "level").ci["accuracy"], by_path(b, "level").ci["accuracy"]
    assert a_ci[1] > b_ci[0]  # the separate intervals overlap
    assert paired_differences(a, b, Bootstrap()).fields["level"].verdict is Verdict.BETTER


def test_a_few_records_that_all_favour_b_are_not_a_detectable_difference() -> None:
    # B fixes A's level on 4 of 300 records and changes nothing else. A percentile bootstrap alone
    # calls that better (a resample misses all 4 only e^-4 = 1.8% of the time); 4 of 4 the same way
    # happens 1 time in 8 by chance, which the sign-flip spread keeps in the interval.
    gold, a_side = simulated(random.Random(9), 300, match=0.7, found=0.6)
    b_side = {key: dict(value) for key, value in a_side.items()}
    for key in [key for key in gold if a_side[key]["level"] != gold[key]["level"]][:4]:
        b_side[key]["level"] = gold[key]["level"]
    a, b = measured(gold, a_side), measured(gold, b_side)
    (boot_a, boot_b) = resample([a, b], Bootstrap())
    delta = boot_b.paths["level"]["agreement"] - boot_a.paths["level"]["agreement"]
    alone = Bootstrap().interval(delta)
    assert alone is not None and alone[0] > 0  # the bootstrap alone is too sure
    level = paired_differences(a, b, Bootstrap()).fields["level"]
    assert level.value == pytest.approx(4 / 300) and level.verdict is Verdict.NONE
    assert level.ci is not None and level.ci[0] < 0 < level.ci[1]


def test_intervals_of_differences_are_simultaneous_over_the_fields() -> None:
    gold, a_side = simulated(random.Random(10), 300, match=0.7, found=0.6)
    _, b_side = simulated(random.Random(11), 300, match=0.7, found=0.6)
    a, b = measured(gold, a_side), measured(gold, b_side)
    paired = paired_differences(a, b, Bootstrap())
    # two fields and the overall micro F1: each at 1 - 0.05/3
    for difference in [*paired.fields.values(), paired.micro_f1]:
        assert difference.level == pytest.approx(1 - 0.05 / 3)
    assert "simultaneous over the 3 differences shown (98.3% each" in paired.rule
    # ± z standard errors: z of the simultaneous level, the larger of the two spreads' deviations
    level = paired.fields["skills"]
    boot_a, boot_b = resample([a, b], Bootstrap())
    swap_a, swap_b = swapped(a, b, Bootstrap())
    deviation = max(
        float(np.std(boot_b.paths["skills"]["agreement"] - boot_a.paths["skills"]["agreement"])),
        float(np.std(swap_b.paths["skills"]["agreement"] - swap_a.paths["skills"]["agreement"])),
    )
    z = NormalDist().inv_cdf(1 - 0.05 / 6)
    assert level.ci is not None and level.value is not None
    assert level.ci == pytest.approx((level.value - z * deviation, level.value + z * deviation))


def test_records_needed_grows_as_the_difference_shrinks() -> None:
    z = Bootstrap().z
    assert z == pytest.approx(1.96, abs=0.001)
    wide = records_to_detect(200, 0.02, 0.025, z)
    narrow = records_to_detect(200, 0.04, 0.025, z)
    assert wide is not None and narrow is not None and wide > narrow > 200
    # (z + z_power)^2 * se^2 / d^2 * n: (1.96 + 0.8416)^2 * 0.025^2 / 0.02^2 * 200
    assert wide == math.ceil(200 * ((z + 0.8416212) * 0.025 / 0.02) ** 2)
    assert records_to_detect(200, 0.0, 0.01, z) is None


def test_the_noise_floor_flags_only_the_fields_beyond_it() -> None:
    rng = random.Random(6)
    _, a_side = simulated(rng, 400, match=1.0, found=1.0)
    rerun = {key: {"level": value["level"], "skills": list(value["skills"])} for key, value in a_side.items()}
    for key in list(rerun)[::25]:  # the re-run differs a little (batch non-determinism)
        rerun[key]["skills"] = rerun[key]["skills"][:-1]
    other = {key: {"level": value["level"], "skills": []} for key, value in a_side.items()}  # B drops skills
    versus = measure_agreement(a_side, other, posting_fields())
    noise = measure_agreement(a_side, rerun, posting_fields())
    floors = noise_floor(versus, noise, Bootstrap())
    assert floors["skills"].beyond_noise and (floors["skills"].noise_agreement or 0) > 0.9
    assert not floors["level"].beyond_noise  # B agrees with A on level as well as the re-run does
    same = noise_floor(noise, noise, Bootstrap())
    assert not any(floor.beyond_noise for floor in same.values())


def test_paired_reports_must_score_the_same_records() -> None:
    gold, extracted = simulated(random.Random(7), 20, match=0.5, found=0.5)
    fewer = {key: value for key, value in extracted.items() if key < 10}
    with pytest.raises(ValueError, match="same records"):
        resample([measured(gold, extracted), measured(gold, fewer)], Bootstrap())


def test_intervals_are_in_the_json_beside_each_score_and_in_the_table() -> None:
    report = measured(*simulated(random.Random(8), 120, match=0.7, found=0.6))
    data = report.to_json()
    level, skills = data["fields"]["level"], data["fields"]["skills"]
    assert set(level) >= {"accuracy", "accuracy_ci", "exact_ci", "agreement_ci"}
    assert level["accuracy_ci"][0] <= level["accuracy"] <= level["accuracy_ci"][1]
    assert set(skills) >= {"precision_ci", "recall_ci", "f1_ci"} and "f1_ci" in skills["macro"]
    assert "f1_ci" in data["micro"] and "score_ci" in data["macro"]
    assert "1,000 resamples, seed 0" in data["intervals"]
    table = format_table(report)
    low, high = report.fields[[s.path for s in report.fields].index("level")].ci["accuracy"]
    assert f"{low:.3f}-{high:.3f}" in table
    assert "95% intervals: percentile bootstrap over records" in table


def test_a_field_no_record_scores_has_no_interval() -> None:
    report = measured({1: {"level": "junior"}}, {2: {"level": "junior"}})
    assert report.records_scored == 0
    assert by_path(report, "level").ci == {}


def test_bad_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="resamples 10"):
        Bootstrap(resamples=10)
    with pytest.raises(ConfigError, match="confidence 1.5"):
        Bootstrap(confidence=1.5)
