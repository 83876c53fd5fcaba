"""Drift: what moved in the last run beyond its usual run-to-run variation.

Every run stores a profile (:mod:`pipeline.quality.profile`, plus the run's tokens, latency, failures
and speed). Each number of the last run is compared with the same number in up to
:data:`BASELINE_RUNS` runs before it:

* ``before`` is the median of those runs (one odd run does not move it);
* the noise allowed is :data:`Z` times the combined standard error of three things: the last run's
  sampling error (a share over n records: sqrt(q(1-q)/n) with q = (k+1)/(n+2), so a run of 10 records is
  allowed far more than one of 10,000, and 10 of 10 is not taken as certainty), the earlier runs'
  typical sampling error, and their spread around the median (1.4826 x the median absolute deviation,
  from three earlier runs on);
* and never less than a floor: :data:`SHARE_FLOOR` for shares (fill rate, grounded share, a choice's
  share, failure rate), :data:`AMOUNT_FLOOR` of ``before`` for amounts (tokens, latency, records/min),
  so a huge run does not flag a change nobody would act on.

A number drifted when ``|now - before|`` exceeds that. Numbers a run cannot say anything about (a
field no record was scored for, a run with no earlier run) are not judged, and neither are speed and
latency of a run far smaller than usual (under :data:`SMALL_RUN` of the earlier runs' median records):
a run of 10 records at c=256 never fills the server, and that is not a slower server. Records/min
has a standard error of :data:`START_UP_S` over the run's duration: a run of seconds says little
about the server's speed, a run of hours a lot.
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
_AMOUNT_MINIMUM = 1.0  # an amount must move by at least one unit (token, second, record/min)
RUN = "(run)"  # the field name of run-level numbers
SMALL_RUN = 0.25
_SPEED = frozenset({"records_per_min", "latency_p50", "latency_p90"})
# A run's start-up (imports, checks, the first replies) and its last stragglers take seconds that
# vary with the machine's load: records/min is uncertain by about this much of the run's duration.
START_UP_S = 2.0

RULE = (
    f"a number drifted when the last run differs from the median of up to {BASELINE_RUNS} earlier runs by "
    f"more than {Z:g} combined standard errors (its sampling error, theirs, and their run-to-run spread) "
    f"and by more than {SHARE_FLOOR:g} for a share or {AMOUNT_FLOOR:.0%} for an amount"
)


class Scale(StrEnum):
    SHARE = "share"  # 0..1, a proportion of n
    AMOUNT = "amount"  # a mean or a level


@dataclass(frozen=True, slots=True)
class Measure:
    value: float
    standard_error: float
    scale: Scale


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
    if value is None or not math.isfinite(value):
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
        found[RUN, f"latency_{name}"] = amount(seconds)
    found[RUN, "records_per_min"] = _speed(profile)
    return {key: measure for key, measure in found.items() if measure is not None}


def _speed(profile: Mapping[str, Any]) -> Measure | None:
    """Records per minute, uncertain by :data:`START_UP_S` of its duration (none known: exact)."""
    measure, duration = amount(profile.get("records_per_min")), profile.get("duration_s")
    if measure is None or not duration or duration <= 0:
        return measure
    return Measure(measure.value, abs(measure.value) * START_UP_S / duration, Scale.AMOUNT)


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
    values = [measure.value for measure in baseline]
    before = median(values)
    spread = 1.4826 * median(abs(value - before) for value in values) if len(values) >= 3 else 0.0
    their_error = median(measure.standard_error for measure in baseline)
    noise = Z * math.sqrt(now.standard_error**2 + their_error**2 + spread**2)
    floor = SHARE_FLOOR if now.scale is Scale.SHARE else max(AMOUNT_FLOOR * abs(before), _AMOUNT_MINIMUM)
    threshold = max(noise, floor)
    return before, threshold, abs(now.value - before) > threshold


def find_drift(profiles: Sequence[tuple[int, Mapping[str, Any]]]) -> list[Drift]:
    """What drifted in the last of ``profiles`` ((run id, profile), oldest first) against up to
    :data:`BASELINE_RUNS` runs before it."""
    if len(profiles) < 2:
        return []
    (run_id, last), earlier = profiles[-1], profiles[-1 - BASELINE_RUNS : -1]
    earlier_measures = [(profile, measures(profile)) for _, profile in earlier]
    usual = median(profile.get("records") or 0 for _, profile in earlier)
    small = (last.get("records") or 0) < SMALL_RUN * usual
    last_measures = measures(last)
    # A choice value earlier runs gave and the last did not is a share that fell to 0.
    keys = dict.fromkeys([*last_measures, *(key for _, found in earlier_measures for key in found)])
    drifts = []
    for key in keys:
        now = _measure_of(key, last, last_measures)
        if now is None or (small and key[0] == RUN and key[1] in _SPEED):
            continue
        baseline = [m for p, found in earlier_measures if (m := _measure_of(key, p, found)) is not None]
        if not baseline:
            continue
        before, threshold, drifted = judge(now, baseline)
        if drifted:
            drifts.append(Drift(run_id, key[0], key[1], before, now.value, threshold))
    return drifts
