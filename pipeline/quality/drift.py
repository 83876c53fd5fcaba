"""Drift: what moved in the newest run beyond its usual run-to-run variation, and which way.

Every run that took records stores a profile (:mod:`pipeline.quality.profile`, plus the run's tokens,
latency, failures and speed). The newest run is judged, number by number, against up to
:data:`BASELINE_RUNS` profiled runs before it (:mod:`pipeline.quality.drift_numbers`: the median, the
noise allowed, the floors, and which side of each number is the worse one). Each drift names the runs it
was judged against, with their dates.

Only the newest run is judged, so a drift is said once: when the newest run kept no profile (a quiet
night, ``nothing to do``, or a run that ended before finishing a record) there is nothing to judge, and
the run that drifted before it is not judged again. Nor is a run judged (:class:`NotJudged`, with its size
and the usual one) when it is far smaller than usual (under :data:`SMALL_RUN` of the earlier runs'
median size: a run of 10 records at c=256 never fills the server, and 10 answers say little of a field)
or when most of its records retried earlier failures (more than :data:`RETRY_RUN` of them:
`--only-failed`, `--retry-failed` with nothing new): a retried record is a hard one, not a sample of the
usual input. Such runs are no baseline for later runs either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import median
from typing import Any

from pipeline.quality.drift_numbers import (
    AMOUNT_FLOOR,
    RUN,
    SHARE_FLOOR,
    SPEED_RATIO,
    SPEEDS,
    SPREAD_RUNS,
    Change,
    Z,
    change_of,
    judge,
    measure_of,
    measures,
)
from pipeline.wording import counted

BASELINE_RUNS = 10
SMALL_RUN = 0.25  # a run under this share of the usual size is not judged
RETRY_RUN = 0.5  # a run more than this share of whose records retried earlier failures is not judged

RULE = (
    f"a number drifted when the newest run differs from the median of up to {BASELINE_RUNS} earlier runs "
    f"by more than {Z:g} combined standard errors (its sampling error, theirs, and their run-to-run spread) "
    f"and by more than {SHARE_FLOOR:g} for a share, {AMOUNT_FLOOR:.0%} for an amount, or a factor of "
    f"{SPEED_RATIO:g} for a reply time or records/min (judged from {SPREAD_RUNS} earlier runs on); the "
    "run's costs have a better side (a lower failure rate, fewer tokens per done record, every request "
    "counted, faster replies, more records/min), which is reported and fails nothing, while a field's "
    "fill rate, grounded share, length or choices and the prompt's length (of the records answered on "
    "their first request) have none: a move either way is a drift; a run "
    f"under {SMALL_RUN:.0%} of the usual size, mostly retries of earlier failures, or with nothing to do "
    "is not judged"
)


@dataclass(frozen=True, slots=True)
class RunDate:
    """A run named in a verdict: its id and when it started (ISO 8601, UTC; None if not known)."""

    run_id: int
    started_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "started_at": self.started_at}


@dataclass(frozen=True, slots=True)
class ProfiledRun:
    """A run that kept a profile, as drift reads it."""

    run_id: int
    profile: Mapping[str, Any]
    started_at: str | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> ProfiledRun:
        """From a stored run's row (``run_id``, ``profile``, ``started_at``)."""
        return cls(int(row["run_id"]), row["profile"], row.get("started_at"))

    @property
    def date(self) -> RunDate:
        return RunDate(self.run_id, self.started_at)


@dataclass(frozen=True, slots=True)
class NewestRun:
    """The newest run of a variant that ended, profiled or not, as the runs table has it."""

    run_id: int
    status: str
    started_at: str | None
    records: int  # finished: done and failed
    quiet: bool  # it had nothing to do


@dataclass(frozen=True, slots=True)
class Drift:
    run_id: int
    field: str  # a schema field, or RUN
    measure: str
    before: float
    now: float
    threshold: float
    baseline: tuple[RunDate, ...] = ()  # the earlier runs ``before`` is the median of

    @property
    def change(self) -> Change:
        return change_of(self.field, self.measure, self.before, self.now)

    @property
    def fails(self) -> bool:
        """Whether it is a drift to act on (``--fail-on-drift``): anything but an improvement."""
        return self.change is not Change.BETTER

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "field": self.field,
            "measure": self.measure,
            "before": self.before,
            "now": self.now,
            "threshold": self.threshold,
            "change": str(self.change),
            "fails": self.fails,
            "baseline": [run.to_json() for run in self.baseline],
        }

    @property
    def way(self) -> str:
        """``worse`` or ``better``; ``up`` or ``down`` for a number with no better side."""
        change = self.change
        return ("up" if self.now > self.before else "down") if change is Change.EITHER else str(change)

    def describe(self, *, allowed: bool = False) -> str:
        """``salary fill_rate 1.00 -> 0.00 (down)``, ``records_per_min 400 -> 3,600 (better)``;
        ``allowed``: with the threshold, ``(down; allowed ±0.05)``."""
        where = "" if self.field == RUN else f"{self.field} "
        threshold = f"; allowed ±{_number(self.threshold)}" if allowed else ""
        return f"{where}{self.measure} {_number(self.before)} -> {_number(self.now)} ({self.way}{threshold})"


def _number(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:,.0f}"


def describe_runs(runs: Sequence[RunDate]) -> str:
    """``run 5 (2026-11-19 02:00 UTC)``, ``runs 1-3, 5 (2026-11-15 02:00 to 2026-11-19 02:00 UTC)``."""
    ordered = sorted(set(runs), key=lambda run: run.run_id)
    if not ordered:
        return "no earlier run"
    first, last = _when(ordered[0].started_at), _when(ordered[-1].started_at)
    dates = f" ({first} UTC)" if first == last else f" ({first} to {last} UTC)"
    noun = "run" if len(ordered) == 1 else "runs"
    return f"{noun} {_id_ranges([run.run_id for run in ordered])}{dates if first and last else ''}"


def against(entries: Sequence[Drift]) -> str:
    """The runs ``entries`` were judged against, named with their dates (:func:`describe_runs`)."""
    return describe_runs([run for entry in entries for run in entry.baseline])


def _when(started_at: str | None) -> str | None:
    """An ISO 8601 time to the minute: ``2026-11-19 02:00``."""
    return started_at[:16].replace("T", " ") if started_at else None


def _id_ranges(ids: Sequence[int]) -> str:
    """``1-3, 5, 7-8`` for 1, 2, 3, 5, 7, 8 (sorted, distinct)."""
    spans: list[list[int]] = []
    for run_id in ids:
        if spans and run_id == spans[-1][-1] + 1:
            spans[-1].append(run_id)
        else:
            spans.append([run_id])
    return ", ".join(str(span[0]) if len(span) == 1 else f"{span[0]}-{span[-1]}" for span in spans)


class Reason(StrEnum):
    TOO_SMALL = "too_small"
    RETRIED = "retried"
    NOTHING_TO_DO = "nothing_to_do"  # a quiet night: the newest run had no record to take
    NO_PROFILE = "no_profile"  # the newest run ended before it finished a record, or was killed


@dataclass(frozen=True, slots=True)
class NotJudged:
    """Why the newest run was not compared with the runs before it, with its size and the usual one."""

    run_id: int
    reason: Reason
    records: int  # the records it took (done and failed)
    usual: float  # the median of the earlier runs' records
    retried: int  # of its records, how many had failed in an earlier run
    started_at: str | None = None
    status: str | None = None  # the run's status in the runs table, when it kept no profile

    def describe(self) -> str:
        size, usual = counted(self.records, "record"), f"{self.usual:,.0f}"
        when = _when(self.started_at)
        if self.reason is Reason.NOTHING_TO_DO:
            return (
                f"not judged: run {self.run_id}{f' ({when} UTC)' if when else ''} had nothing to do; only "
                "the newest run is judged, so what the runs before it drifted is not said again"
            )
        if self.reason is Reason.NO_PROFILE:
            said = ", ".join(text for text in (self.status, when and f"{when} UTC") if text)
            what = "it finished no record"
            if self.records:
                what = f"it ended before keeping one ({size} done or failed)"
            return f"not judged: run {self.run_id}{f' ({said})' if said else ''} kept no profile: {what}"
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
            "started_at": self.started_at,
            "status": self.status,
            "message": self.describe(),
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """What drifted in the newest run and which way, or why it was not judged; ``judged``: the run
    judged, ``baseline``: the earlier runs it was compared with (none: the first, or no usual one)."""

    drift: tuple[Drift, ...] = ()
    not_judged: NotJudged | None = None
    judged: RunDate | None = None
    baseline: tuple[RunDate, ...] = ()

    @property
    def fails(self) -> bool:
        """A drift to act on (``--fail-on-drift``): some number moved for the worse, or one with no
        better side moved; improvements alone do not fail."""
        return any(entry.fails for entry in self.drift)


def run_size(profile: Mapping[str, Any]) -> int:
    """The records a run took: its results and its failures."""
    return int(profile.get("attempted") or profile.get("records") or 0)


def _retried(profile: Mapping[str, Any]) -> int:
    return int(profile.get("retried") or 0)


def _is_retry(profile: Mapping[str, Any]) -> bool:
    return _retried(profile) > RETRY_RUN * run_size(profile)


def _baseline(earlier: Sequence[ProfiledRun]) -> tuple[list[ProfiledRun], float]:
    """The earlier runs a run is compared with (up to BASELINE_RUNS, no retry run, none that took no
    record and none far smaller than the others), and their usual size."""
    candidates = [run for run in earlier if run_size(run.profile) and not _is_retry(run.profile)]
    candidates = candidates[-BASELINE_RUNS:]
    if not candidates:
        return [], 0.0
    usual = float(median(run_size(run.profile) for run in candidates))
    return [run for run in candidates if run_size(run.profile) >= SMALL_RUN * usual], usual


def judge_last(runs: Sequence[ProfiledRun], newest: NewestRun | None = None) -> Verdict:
    """What drifted in the last of ``runs`` (oldest first) against the runs before it, or why it was not
    judged. ``newest``: the newest run that ended, when it may have kept no profile; when it is newer
    than the last of ``runs`` it is the one judged, and there is nothing to judge in it."""
    if newest is not None and (not runs or newest.run_id > runs[-1].run_id):
        return Verdict(not_judged=_not_profiled(newest, runs))
    if not runs:
        return Verdict()
    last, (baseline, usual) = runs[-1], _baseline(runs[:-1])
    if not baseline:
        return Verdict(judged=last.date)
    reason = Reason.RETRIED if _is_retry(last.profile) else None
    if reason is None and run_size(last.profile) < SMALL_RUN * usual:
        reason = Reason.TOO_SMALL
    if reason is not None:
        size, retried = run_size(last.profile), _retried(last.profile)
        return Verdict(not_judged=NotJudged(last.run_id, reason, size, usual, retried, last.started_at))
    dates = tuple(run.date for run in baseline)
    return Verdict(drift=tuple(_drifts(last, baseline)), judged=last.date, baseline=dates)


def _not_profiled(newest: NewestRun, runs: Sequence[ProfiledRun]) -> NotJudged:
    reason = Reason.NOTHING_TO_DO if newest.quiet else Reason.NO_PROFILE
    usual = _baseline(runs)[1]
    return NotJudged(newest.run_id, reason, newest.records, usual, 0, newest.started_at, newest.status)


def find_drift(runs: Sequence[ProfiledRun]) -> list[Drift]:
    """What drifted in the last of ``runs`` (none when it was not judged: :func:`judge_last`)."""
    return list(judge_last(runs).drift)


def _drifts(last: ProfiledRun, earlier: Sequence[ProfiledRun]) -> list[Drift]:
    """Every number of ``last`` that drifted, worse first, then those with no better side, then the
    improvements, each with the runs it was judged against (those that have the number)."""
    earlier_measures = [(run, measures(run.profile)) for run in earlier]
    last_measures = measures(last.profile)
    # A choice value earlier runs gave and the last did not is a share that fell to 0.
    keys = dict.fromkeys([*last_measures, *(key for _, found in earlier_measures for key in found)])
    drifts = []
    for key in keys:
        now = measure_of(key, last.profile, last_measures)
        if now is None:
            continue
        baseline = [
            (run, measure)
            for run, found in earlier_measures
            if (measure := measure_of(key, run.profile, found)) is not None
        ]
        # Times and rates have no sampling error: only their spread over runs says what is usual.
        if not baseline or (now.scale in SPEEDS and len(baseline) < SPREAD_RUNS):
            continue
        before, threshold, drifted = judge(now, [measure for _, measure in baseline])
        if drifted:
            dates = tuple(run.date for run, _ in baseline)
            drifts.append(Drift(last.run_id, key[0], key[1], before, now.value, threshold, dates))
    order = (Change.WORSE, Change.EITHER, Change.BETTER)
    return sorted(drifts, key=lambda entry: order.index(entry.change))
