"""The numbers drift judges (:mod:`pipeline.quality.drift`): what they are in a stored profile, how much
each may move from run to run, and which side of each is the worse one.

Each number of the judged run is compared with the same number in the earlier runs:

* ``before`` is the median of those runs (one odd run does not move it);
* the noise allowed is :data:`Z` times the combined standard error of three things: the judged run's
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

A number drifted when ``|now - before|`` exceeds that. Which way it moved is :func:`change_of`'s: the
run's costs have a worse side (a higher failure rate, more tokens per done record, slower replies,
fewer records/min) and a better one; the output's profile (a field's fill rate, grounded share, a
list's length, a choice's share) and the prompt's length have none: they measure the input and the
model as much as the pipeline (a field filled twice as often may be invented values, a prompt half as
long may be records that lost their text), so a move either way may be a drift. The tokens per done
record count every request of the run, re-asks, retries and the records that failed included
(``RunNumbers.tokens_per_done``): a cost, so a server whose bad answers were fixed costs fewer prompt
tokens per record, which is better. The prompt's length (``prompt_length``) is the input's: the prompt
tokens of the records answered on their first request, so neither re-asks nor a fixed server move it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import median
from typing import Any

Z = 4.0
SHARE_FLOOR = 0.05
AMOUNT_FLOOR = 0.2
_AMOUNT_MINIMUM = 1.0  # an amount must move by at least one unit (a token, a list item)
SPEED_RATIO = 1.5  # a reply time x 1.5, or records/min / 1.5, is a slower server, not noise
SPREAD_RUNS = 3  # earlier runs it takes to say how much a number moves from run to run
RUN = "(run)"  # the field name of run-level numbers
# A run's start-up (checks, the first replies) and its last stragglers take seconds that vary with the
# machine's load: a run may take this much longer than its records need without a slower server.
START_UP_S = 2.0


class Scale(StrEnum):
    SHARE = "share"  # 0..1, a proportion of n
    AMOUNT = "amount"  # a mean or a level
    TIME = "time"  # seconds a reply takes: judged by factors
    RATE = "rate"  # records per minute: judged by factors and the run's start-up


SPEEDS = frozenset({Scale.TIME, Scale.RATE})


@dataclass(frozen=True, slots=True)
class Measure:
    value: float
    standard_error: float
    scale: Scale
    duration_s: float | None = None  # a rate's run: how long it took


class Change(StrEnum):
    """Which way a drifted number moved, for the run."""

    WORSE = "worse"
    BETTER = "better"
    EITHER = "either"  # a number with no better side: a move either way may be a drift


# Run-level numbers with a worse side: +1 when a rise is for the worse, -1 when a fall is.
_WORSE_SIDE = {"tokens_prompt": 1, "tokens_completion": 1, "tokens_reasoning": 1, "records_per_min": -1}
_WORSE_UP = ("failure_rate", "latency_")  # every failure class's rate, every reply time


def change_of(field: str, measure: str, before: float, now: float) -> Change:
    """Whether ``before -> now`` of ``measure`` (of ``field``, or of the run: :data:`RUN`) is for the
    worse, for the better, or of a number with no better side (the output's profile:
    :data:`Change.EITHER`)."""
    side = _WORSE_SIDE.get(measure, 1 if measure.startswith(_WORSE_UP) else 0) if field == RUN else 0
    if side == 0:
        return Change.EITHER
    return Change.WORSE if (now - before) * side > 0 else Change.BETTER


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
    length = profile.get("prompt_length") or {}
    found[RUN, "prompt_length"] = amount(length.get("mean"), length.get("sd"), length.get("records") or 0)
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


def measure_of(
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
    if now.scale in SPEEDS:
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
