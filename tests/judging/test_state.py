"""One judge's state: actions, the verdict that counts, undo in order, missing values."""

from __future__ import annotations

import datetime as dt

import pytest

from pipeline.judging.state import Action, JudgeState, group_actions, without
from pipeline.quality.judgments import Judgment, JudgmentVerdict

CORRECT, WRONG, MISSING = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING
T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def judgment(
    record: str,
    value: str,
    verdict: JudgmentVerdict,
    seconds: int,
    variant: str = "main",
    field: str = "skills",
) -> Judgment:
    return Judgment(
        record,
        variant,
        field,
        value,
        verdict,
        "ann",
        judged_at=T0 + dt.timedelta(seconds=seconds),
        judgment_id=f"{record}-{value}-{variant}-{seconds}",
    )


def test_judgments_of_one_record_and_one_time_are_one_action() -> None:
    both = [judgment("1", "SQL", CORRECT, 0, "main"), judgment("1", "SQL", CORRECT, 0, "big")]
    later = judgment("1", "Go", WRONG, 1)
    other_record = judgment("2", "Go", WRONG, 1)
    actions = group_actions([*both, later, other_record])
    assert [len(action.judgments) for action in actions] == [2, 1, 1]
    untimed = Judgment("1", "main", "skills", "SQL", CORRECT, "ann")
    assert len(group_actions([untimed, untimed])) == 2  # without a time, each its own


def test_the_latest_verdict_counts_and_taking_back_restores_the_one_before() -> None:
    state = JudgeState([judgment("1", "SQL", CORRECT, 0), judgment("1", "SQL", WRONG, 1)])
    key = ("main", "1", "skills", "SQL")
    assert state.verdict(key) is WRONG and len(state) == 2
    last = state.last()
    assert last is not None
    state.take_back(last)
    assert state.verdict(key) is CORRECT
    first = state.last()
    assert first is not None
    state.take_back(first)
    assert state.verdict(key) is None and state.last() is None


def test_only_the_last_action_can_be_taken_back() -> None:
    state = JudgeState([judgment("1", "SQL", CORRECT, 0), judgment("1", "Go", WRONG, 1)])
    with pytest.raises(ValueError, match="only the last action"):
        state.take_back(Action((judgment("1", "SQL", CORRECT, 0),)))


def test_missing_values_are_those_whose_latest_judgment_is_missing() -> None:
    state = JudgeState(
        [judgment("1", "Excel", MISSING, 0), judgment("1", "Go", MISSING, 1), judgment("2", "R", MISSING, 2)]
    )
    assert sorted(j.value for j in state.missing("1")) == ["Excel", "Go"]
    assert [j.value for j in state.missing("2")] == ["R"]
    assert without([judgment("1", "Go", MISSING, 1)], ["1-Go-main-1"]) == []
