"""Drift: what moved in the last run beyond its usual run-to-run variation.

Every run stores a profile (:mod:`pipeline.quality.profile`, plus the run's tokens, latency, failures
and speed). Each number of the last run is compared with the same number in up to
:data:`BASELINE_RUNS` runs before it:

* ``before`` is the median of those runs (one odd run does not move it);
* the noise allowed is :data:`Z` times the combined standard error of three things: the last run's
  sampling error (a share over n records: sqrt(q(1-q)/n) with q = (k+1)/(n+2), so a run of 10 records is
  allowed far more than one of 10,000, and 10 of 10 is not taken as certainty), the earlier runs'
  typical sampling error, and their spread around the median (1.4826 x the median absolute deviation,
  from :data:`SPREAD_RUNS` earlier runs on);
* and never less than a floor: :data:`SHARE_FLOOR` for shares (fill rate, grounded share, a choice's
  share, failure rate), :data:`AMOUNT_FLOOR` of ``before`` for amounts (tokens, a list's length), so a
  huge run does not flag a change nobody would act on. Times and rates have a floor relative to their
  median too, as a ratio: a reply time drifted past ``before`` x :data:`SPEED_RATIO`, records/min past
  ``before`` / :data:`SPEED_RATIO` (and by more than :data:`START_UP_S` of the run's duration: a run of
  seconds is mostly its start-up). They have no sampling error (the machine's load moves them, not the
  records), so they are judged only from :data:`SPREAD_RUNS` earlier runs on.

A number drifted when ``|now - before|`` exceeds that. Numbers a run cannot say anything about (a
field no record was scored for, a mean of one record, a run with no earlier run) are not judged. A whole
run is not judged (:class:`NotJudged`, with its size and the usual one) when it is far smaller than
usual (under :data:`SMALL_RUN` of the earlier runs' median size: a run of 10 records at c=256 never
fills the server, and 10 answers say little of a field) or when most of its records retried earlier
failures (more than :data:`RETRY_RUN` of them: `--only-failed`, `--retry-failed` with nothing new): a
retried record is a hard one, not a sample of the usual input. Such runs are no baseline for later
runs either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import median
from typing import Any

BASELINE_RUNS = 10
Z = 4.0
SHARE_FLOOR = 0.05
AMOUNT_FLOOR = 0.2
_AMOUNT_MINIMUM = 1.0  # an amount must move by at least one unit (a token, a list item)
SPEED_RATIO = 1.5  # a reply time x 1.5, or records/min / 1.5, is a slower server, not noise
SPREAD_RUNS = 3  # earlier runs it takes to say how much a number moves from run to run
RUN = "(run)"  # the field name of run-level numbers
SMALL_RUN = 0.25  # a run under this share of the usual size is not judged
RETRY_RUN = 0.5  # a run more than this share of whose records retried earlier failures is not judged
# A run's start-up (checks, the first replies) and its last stragglers take seconds that vary with the
# machine's load: a run may take this much longer than its records need without a slower server.
START_UP_S = 2.0

RULE = (
    f"a number drifted when the last run differs from the median of up to {BASELINE_RUNS} earlier runs by "
    f"more than {Z:g} combined standard errors (its sampling error, theirs, and their run-to-run spread) "
    f"and by more than {SHARE_FLOOR:g} for a share, {AMOUNT_FLOOR:.0%} for an amount, or a factor of "
    f"{SPEED_RATIO:g} for a reply time or records/min (judged from {SPREAD_RUNS} earlier runs on); a run "
    f"under {SMALL_RUN:.0%} of the usual size, or mostly retries of earlier failures, is not judged"
)


class Scale(StrEnum):
    SHARE = "share"  # 0..1, a proportion of n
    AMOUNT = "amount"  # a mean or a level
    TIME = "time"  # seconds a reply takes: judged by factors
    RATE = "rate"  # records per minute: judged by factors and the run's start-up


@dataclass(frozen=True, slots=True)
class Measure:
    value: float
    standard_error: float
    scale: Scale
    duration_s: float | None = None  # a rate's run: how long it took


@dataclass(frozen=True, slots=True)
class Drift:
    run_id: int
    field: str  # a schema field, or RUN
    measure: str
    before: float
    now: float
    threshold: float

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "field": self.field,
            "measure": self.measure,
            "before": self.before,
            "now": self.now,
            "threshold": self.threshold,
        }

    def describe(self) -> str:
        where = "" if self.field == RUN else f"{self.field} "
        return f"{where}{self.measure} {_number(self.before)} -> {_number(self.now)}"


def _number(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:,.0f}"


def share(found: float, records: float) -> Measure | None:
    if records <= 0:
        return None
    smoothed = (found + 1) / (records + 2)
    return Measure(found / records, math.sqrt(smoothed * (1 - smoothed) / records), Scale.SHARE)


def amount(value: float | None, sd: float | None = None, records: float = 0) -> Measure | None:
    """A mean over ``records`` (with their standard deviation ``sd``), or a level (``records`` 0). A mean
    of one record is None: it has no spread to be judged by."""
    if value is None or not math.isfinite(value) or records == 1:
        return None
    error = sd / math.sqrt(records) if sd is not None and records > 0 else 0.0
    return Measure(value, error, Scale.AMOUNT)


def run_measures(profile: Mapping[str, Any]) -> dict[tuple[str, str], Measure]:
    """The run-level numbers of a stored profile."""
    found: dict[tuple[str, str], Measure | None] = {}
    attempted = profile.get("attempted") or 0
    failures = profile.get("failures") or {}
    found[RUN, "failure_rate"] = share(sum(failures.values()), attempted)
    for name, count in failures.items():
        found[RUN, f"failure_rate[{name}]"] = share(count, attempted)
    records = profile.get("records") or 0
    for name, tokens in (profile.get("tokens") or {}).items():
        found[RUN, f"tokens_{name}"] = amount(tokens.get("mean"), tokens.get("sd"), records)
    for name, seconds in (profile.get("latency_s") or {}).items():
        found[RUN, f"latency_{name}"] = _speed(seconds, Scale.TIME)
    duration = profile.get("duration_s")
    found[RUN, "records_per_min"] = _speed(profile.get("records_per_min"), Scale.RATE, duration)
    return {key: measure for key, measure in found.items() if measure is not None}


def _speed(value: float | None, scale: Scale, duration_s: float | None = None) -> Measure | None:
    """A time or a rate: no sampling error (the machine's load moves it, not the records)."""
    if value is None or not math.isfinite(value):
        return None
    return Measure(value, 0.0, scale, duration_s if duration_s and duration_s > 0 else None)


def field_measures(name: str, data: Mapping[str, Any]) -> dict[tuple[str, str], Measure]:
    """The numbers of one field's profile that drift is judged on (``distinct`` grows with the number
    of records, so it is shown, not judged)."""
    found: dict[tuple[str, str], Measure | None] = {}
    records, filled = data.get("records") or 0, data.get("filled") or 0
    found[name, "fill_rate"] = share(filled, records)
    grounded = data.get("grounded")
    if grounded:
        found[name, "grounded_share"] = share(grounded["found"], grounded["values"])
    found[name, "mean_length"] = amount(data.get("mean_length"), data.get("length_sd"), records)
    for value, portion in (data.get("shares") or {}).items():
        found[name, f"share[{value}]"] = share(portion * filled, filled)
    return {key: measure for key, measure in found.items() if measure is not None}


def measures(profile: Mapping[str, Any]) -> dict[tuple[str, str], Measure]:
    every = run_measures(profile)
    for name, data in (profile.get("fields") or {}).items():
        every |= field_measures(name, data)
    return every


def _measure_of(
    key: tuple[str, str], profile: Mapping[str, Any], found: Mapping[tuple[str, str], Measure]
) -> Measure | None:
    """A measure of a run; a choice value the run never gave had a share of 0 there."""
    measure = found.get(key)
    field, name = key
    if measure is None and name.startswith("share["):
        data = (profile.get("fields") or {}).get(field) or {}
        if data.get("shares") is not None:
            return share(0, data.get("filled") or 0)
    return measure


def judge(now: Measure, baseline: Sequence[Measure]) -> tuple[float, float, bool]:
    """(before, threshold, drifted) for one number against the same number in earlier runs."""
    if now.scale in _SPEEDS:
        return _judge_factor(now, baseline)
    values = [measure.value for measure in baseline]
    before = median(values)
    spread = 1.4826 * median(abs(value - before) for value in values) if len(values) >= SPREAD_RUNS else 0.0
    their_error = median(measure.standard_error for measure in baseline)
    noise = Z * math.sqrt(now.standard_error**2 + their_error**2 + spread**2)
    floor = SHARE_FLOOR if now.scale is Scale.SHARE else max(AMOUNT_FLOOR * abs(before), _AMOUNT_MINIMUM)
    threshold = max(noise, floor)
    return before, threshold, abs(now.value - before) > threshold


def _judge_factor(now: Measure, baseline: Sequence[Measure]) -> tuple[float, float, bool]:
    """A time or a rate, compared by factors: a loaded machine slows every reply by a share, so their
    spread is taken over logarithms, and the floor is a factor (:func:`least_factor`). The threshold
    is the distance to the bound on the side the number moved."""
    before = median(measure.value for measure in baseline)
    if now.value <= 0 or before <= 0:
        return before, 0.0, False
    centre = math.log(before)
    logs = [math.log(measure.value) for measure in baseline if measure.value > 0]
    spread = 1.4826 * median(abs(value - centre) for value in logs) if len(logs) >= SPREAD_RUNS else 0.0
    allowed = max(Z * spread, math.log(least_factor(now, before)))
    moved = math.log(now.value) - centre
    bound = before * math.exp(math.copysign(allowed, moved))
    return before, abs(bound - before), abs(moved) > allowed


def least_factor(now: Measure, before: float) -> float:
    """The factor a time or a rate must move by at least: SPEED_RATIO; for records/min also the run
    taking START_UP_S longer than its records take at ``before`` (a run of seconds is its start-up)."""
    if now.scale is not Scale.RATE or now.duration_s is None or now.value <= 0 or before <= 0:
        return SPEED_RATIO
    usual_s = now.duration_s * now.value / before  # this run's records at the usual rate
    return max(SPEED_RATIO, (usual_s + START_UP_S) / usual_s)


class Reason(StrEnum):
    TOO_SMALL = "too_small"
    RETRIED = "retried"


@dataclass(frozen=True, slots=True)
class NotJudged:
    """Why the last run was not compared with the runs before it, with its size and the usual one."""

    run_id: int
    reason: Reason
    records: int  # the records it took (done and failed)
    usual: float  # the median of the earlier runs' records
    retried: int  # of its records, how many had failed in an earlier run

    def describe(self) -> str:
        size, usual = _records(self.records), f"{self.usual:,.0f}"
        if self.reason is Reason.RETRIED:
            return (
                f"not judged: run {self.run_id} retried earlier failures ({self.retried:,} of its {size}, "
                f"against the usual {usual} new ones); a retry is not a sample of the usual input"
            )
        return (
            f"not judged: too small: run {self.run_id} has {size} against the usual {usual} "
            f"(a run under a quarter of the usual size is not compared)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "reason": str(self.reason),
            "records": self.records,
            "usual": self.usual,
            "retried": self.retried,
            "message": self.describe(),
        }


def _records(count: int) -> str:
    return f"{count:,} record{'' if count == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What drifted in the last run, or why it was not judged (an empty verdict: nothing to say)."""

    drift: tuple[Drift, ...] = ()
    not_judged: NotJudged | None = None


def run_size(profile: Mapping[str, Any]) -> int:
    """The records a run took: its results and its failures."""
    return int(profile.get("attempted") or profile.get("records") or 0)


def _retried(profile: Mapping[str, Any]) -> int:
    return int(profile.get("retried") or 0)


def _is_retry(profile: Mapping[str, Any]) -> bool:
    return _retried(profile) > RETRY_RUN * run_size(profile)


def _baseline(
    earlier: Sequence[tuple[int, Mapping[str, Any]]],
) -> tuple[list[Mapping[str, Any]], float]:
    """The earlier runs a run is compared with (up to BASELINE_RUNS, no retry run and none far smaller
    than the others), and their usual size."""
    candidates = [profile for _, profile in earlier if not _is_retry(profile)][-BASELINE_RUNS:]
    if not candidates:
        return [], 0.0
    usual = float(median(run_size(profile) for profile in candidates))
    return [profile for profile in candidates if run_size(profile) >= SMALL_RUN * usual], usual


def judge_last(profiles: Sequence[tuple[int, Mapping[str, Any]]]) -> Verdict:
    """What drifted in the last of ``profiles`` ((run id, profile), oldest first) against the runs
    before it, or why it was not judged."""
    if len(profiles) < 2:
        return Verdict()
    (run_id, last), (baseline, usual) = profiles[-1], _baseline(profiles[:-1])
    if not baseline:
        return Verdict()
    reason = Reason.RETRIED if _is_retry(last) else None
    if reason is None and run_size(last) < SMALL_RUN * usual:
        reason = Reason.TOO_SMALL
    if reason is not None:
        return Verdict(not_judged=NotJudged(run_id, reason, run_size(last), usual, _retried(last)))
    return Verdict(drift=tuple(_drifts(run_id, last, baseline)))


def find_drift(profiles: Sequence[tuple[int, Mapping[str, Any]]]) -> list[Drift]:
    """What drifted in the last of ``profiles`` (none when it was not judged: :func:`judge_last`)."""
    return list(judge_last(profiles).drift)


def _drifts(run_id: int, last: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]) -> list[Drift]:
    earlier_measures = [(profile, measures(profile)) for profile in earlier]
    last_measures = measures(last)
    # A choice value earlier runs gave and the last did not is a share that fell to 0.
    keys = dict.fromkeys([*last_measures, *(key for _, found in earlier_measures for key in found)])
    drifts = []
    for key in keys:
        now = _measure_of(key, last, last_measures)
        if now is None:
            continue
        baseline = [m for p, found in earlier_measures if (m := _measure_of(key, p, found)) is not None]
        # Times and rates have no sampling error: only their spread over runs says what is usual.
        if not baseline or (now.scale in _SPEEDS and len(baseline) < SPREAD_RUNS):
            continue
        before, threshold, drifted = judge(now, baseline)
        if drifted:
            drifts.append(Drift(run_id, key[0], key[1], before, now.value, threshold))
    return drifts


_SPEEDS = frozenset({Scale.TIME, Scale.RATE})
