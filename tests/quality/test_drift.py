"""Drift: seeded simulations of nightly runs whose truth is known; ordinary run-to-run noise flags
nothing, an emptied field is flagged on that field alone, small runs are judged with their small n."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipeline.quality.drift import RUN, Drift, find_drift, judge, share
from pipeline.quality.profile import profile_fields
from tests.support.quality_schemas import posting_fields

LEVELS = ("junior", "senior")


def nightly(rng: random.Random, records: int, *, salary: float = 0.6, senior: float = 0.4) -> dict[str, Any]:
    """One run's stored profile: fields drawn around fixed rates, tokens and speed with noise."""
    extractions = [
        {
            "title": f"Role {rng.randint(1, 50)}",
            "level": "senior" if rng.random() < senior else "junior",
            "skills": [f"s{rng.randint(1, 30)}" for _ in range(rng.randint(0, 6))],
            "pay": {"low": 1.0} if rng.random() < salary else None,
        }
        for _ in range(records)
    ]
    grounded = {"skills": (int(records * 2.5 * rng.uniform(0.78, 0.82)), int(records * 2.5))}
    completion = [rng.gauss(600, 80) for _ in range(records)]
    return {
        "records": records,
        "failed": (failed := sum(rng.random() < 0.01 for _ in range(records))),
        "attempted": records + failed,
        "failures": {"truncated": failed} if failed else {},
        "tokens": {"completion": {"mean": sum(completion) / records, "sd": 80.0}},
        "latency_s": {"p50": rng.uniform(200, 230), "p90": rng.uniform(280, 320)},
        "records_per_min": rng.uniform(60, 70),
        "fields": profile_fields(posting_fields(), extractions, grounded),
    }


def runs(profiles: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return list(enumerate(profiles, start=1))


@pytest.mark.parametrize("seed", range(20))
def test_ordinary_noise_over_five_runs_flags_nothing(seed: int) -> None:
    rng = random.Random(seed)
    assert find_drift(runs([nightly(rng, rng.choice([300, 800, 1500])) for _ in range(5)])) == []


@pytest.mark.parametrize("seed", range(10))
def test_an_emptied_field_is_flagged_on_that_field_and_no_other(seed: int) -> None:
    rng = random.Random(seed)
    history = [nightly(rng, 500) for _ in range(5)]
    drift = find_drift(runs([*history, nightly(rng, 500, salary=0.0)]))
    assert {(entry.field, entry.measure) for entry in drift} == {("pay", "fill_rate")}
    (entry,) = drift
    assert entry.run_id == 6 and entry.now == 0.0 and 0.5 < entry.before < 0.7
    assert entry.describe().startswith("pay fill_rate 0.")


def test_a_choice_value_that_stops_being_given_is_flagged() -> None:
    rng = random.Random(1)
    drift = find_drift(runs([*(nightly(rng, 400) for _ in range(4)), nightly(rng, 400, senior=0.0)]))
    assert ("level", "share[senior]") in {(entry.field, entry.measure) for entry in drift}
    assert ("level", "share[junior]") in {(entry.field, entry.measure) for entry in drift}


def test_a_small_run_is_judged_with_its_small_n() -> None:
    rng = random.Random(2)
    history = [nightly(rng, 1000) for _ in range(5)]
    # 12 records: 3 of 12 with pay (0.25 against 0.6) is within what 12 records can show
    assert find_drift(runs([*history, nightly(random.Random(7), 12, salary=0.25)])) == []
    # but none of 30 is not
    emptied = find_drift(runs([*history, nightly(rng, 30, salary=0.0)]))
    assert ("pay", "fill_rate") in {(entry.field, entry.measure) for entry in emptied}
    # and a run far smaller than usual is not judged on speed: it never fills the server
    slow = nightly(rng, 10)
    slow["records_per_min"] = 3.0
    assert (RUN, "records_per_min") not in {(e.field, e.measure) for e in find_drift(runs([*history, slow]))}


def test_speed_and_tokens_drift_at_the_run_level() -> None:
    rng = random.Random(3)
    history = [nightly(rng, 800) for _ in range(5)]
    last = nightly(rng, 800)
    last["records_per_min"] = 20.0
    last["tokens"]["completion"]["mean"] = 1400.0
    found = {(entry.field, entry.measure) for entry in find_drift(runs([*history, last]))}
    assert found == {(RUN, "records_per_min"), (RUN, "tokens_completion")}


def test_one_run_or_none_before_it_is_no_drift() -> None:
    assert find_drift(runs([nightly(random.Random(4), 100)])) == []
    assert find_drift([]) == []


def test_the_threshold_has_a_floor_and_grows_with_the_spread() -> None:
    big = share(6000, 10000)
    assert big is not None
    before, threshold, drifted = judge(big, [share(6000, 10000)] * 4)  # type: ignore[list-item]
    assert (before, threshold, drifted) == (0.6, 0.05, False)  # 4 sampling errors (0.028) < the floor
    small = share(60, 100)
    assert small is not None
    _, allowed, _ = judge(small, [share(600, 1000)] * 4)  # type: ignore[list-item]
    assert allowed > 0.2  # 100 records say less than 10,000
    spread = [share(k, 10000) for k in (5000, 6000, 7000, 6500)]
    _, wider, _ = judge(big, spread)  # type: ignore[arg-type]
    assert wider > 0.25  # 4 x 1.4826 x their median absolute deviation (0.05)


def test_drift_entries_are_json() -> None:
    entry = Drift(6, "pay", "fill_rate", 0.6, 0.0, 0.08)
    assert entry.to_json() == {
        "run_id": 6,
        "field": "pay",
        "measure": "fill_rate",
        "before": 0.6,
        "now": 0.0,
        "threshold": 0.08,
    }


def test_the_speed_of_a_run_of_seconds_is_judged_loosely_and_of_an_hour_closely() -> None:
    """A 1.5 s run's records/min is mostly its start-up, which a loaded machine stretches."""
    rng = random.Random(5)

    def timed(duration_s: float, per_min: float) -> dict[str, Any]:
        profile = nightly(rng, 500)
        profile["records_per_min"], profile["duration_s"] = per_min, duration_s
        return profile

    short = [timed(1.5, rate) for rate in (6000.0, 5800.0, 6100.0)]
    assert find_drift(runs([*short, timed(1.9, 4600.0)])) == []  # -24%: the start-up, not the server
    hourly = [timed(3600.0, rate) for rate in (60.0, 58.0, 61.0)]
    slower = {(entry.field, entry.measure) for entry in find_drift(runs([*hourly, timed(3600.0, 46.0)]))}
    assert slower == {(RUN, "records_per_min")}
