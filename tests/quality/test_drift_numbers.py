"""The numbers drift judges: the threshold's floor and how it grows with the spread of earlier runs,
and which side of each number is the worse one (the run's costs have one, the output's profile none)."""

from __future__ import annotations

import pytest

from pipeline.quality.drift import Drift
from pipeline.quality.drift_numbers import RUN, Change, Measure, change_of, judge, share


def known_share(found: float, records: float) -> Measure:
    measure = share(found, records)
    assert measure is not None  # records > 0: a share is known
    return measure


def test_the_threshold_has_a_floor_and_grows_with_the_spread() -> None:
    big = known_share(6000, 10000)
    before, threshold, drifted = judge(big, [known_share(6000, 10000)] * 4)
    assert (before, threshold, drifted) == (0.6, 0.05, False)  # 4 sampling errors (0.028) < the floor
    _, allowed, _ = judge(known_share(60, 100), [known_share(600, 1000)] * 4)
    assert allowed > 0.2  # 100 records say less than 10,000
    spread = [known_share(k, 10000) for k in (5000, 6000, 7000, 6500)]
    _, wider, _ = judge(big, spread)
    assert wider > 0.25  # 4 x 1.4826 x their median absolute deviation (0.05)


# ---- which way: the run's costs have a better side, the output's profile has none


@pytest.mark.parametrize(
    ("field", "measure", "before", "now", "change"),
    [
        (RUN, "failure_rate", 0.01, 0.11, Change.WORSE),
        (RUN, "failure_rate", 0.11, 0.0, Change.BETTER),
        (RUN, "failure_rate[truncated]", 0.0, 0.2, Change.WORSE),
        (RUN, "tokens_completion", 600.0, 1400.0, Change.WORSE),
        (RUN, "tokens_reasoning", 800.0, 100.0, Change.BETTER),
        (RUN, "latency_p90", 0.4, 1.4, Change.WORSE),
        (RUN, "latency_p50", 1.0, 0.3, Change.BETTER),
        (RUN, "records_per_min", 3900.0, 1200.0, Change.WORSE),
        (RUN, "records_per_min", 400.0, 3600.0, Change.BETTER),
        # Per done record, re-asks and failed records' requests counted: a cost, as the other tokens.
        (RUN, "tokens_prompt", 5332.0, 3150.0, Change.BETTER),
        (RUN, "tokens_prompt", 1500.0, 3000.0, Change.WORSE),
        ("pay", "fill_rate", 0.6, 0.0, Change.EITHER),
        ("pay", "fill_rate", 0.6, 1.0, Change.EITHER),  # filled more often: invented values?
        ("skills", "grounded_share", 0.8, 0.5, Change.EITHER),
        ("skills", "mean_length", 2.4, 9.0, Change.EITHER),
        ("level", "share[senior]", 0.4, 0.0, Change.EITHER),
    ],
)
def test_each_number_has_a_worse_side_or_none(
    field: str, measure: str, before: float, now: float, change: Change
) -> None:
    assert change_of(field, measure, before, now) is change
    entry = Drift(6, field, measure, before, now, 0.05)
    assert entry.change is change and entry.fails is (change is not Change.BETTER)
    way = str(change) if change is not Change.EITHER else ("up" if now > before else "down")
    assert entry.describe().endswith(f"({way})")
