"""``pipeline report``: a job's runs side by side, their trends, and what drifted in the newest one.

Each run keeps a profile of what it produced and a small time series (:mod:`pipeline.store.run_profiles`,
:mod:`pipeline.run.series`). This reads the last runs of a variant, read-only, and judges the newest
against the runs before it (:mod:`pipeline.quality.drift`), naming them with their dates and saying
which way each number moved, or says why it was not judged (nothing to do, far smaller than usual, or
a retry of earlier failures). ``--fail-on-drift`` turns a drift for the worse (or of a number with no
better side) into exit 1 for a nightly cron line; an improvement, or a run not judged, is no drift.
Only the newest run is judged, so a drift is said once: a quiet night after it has nothing to judge.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.defaults import DEFAULT_RUNS
from pipeline.errors import ConfigError
from pipeline.job.commands import Asked
from pipeline.job.spec import JobSpec
from pipeline.quality.drift import (
    BASELINE_RUNS,
    RULE,
    Drift,
    NewestRun,
    NotJudged,
    ProfiledRun,
    Verdict,
    describe_runs,
    judge_last,
)
from pipeline.reports.status import server_cache_of
from pipeline.reports.variants import check_variant
from pipeline.store.numbers import RunNumbers
from pipeline.store.opening import open_job_output
from pipeline.store.read_copy import ReadCopy, read_copy_of
from pipeline.store.run_profiles import newest_run, stored_runs
from pipeline.wording import counted, number

# Runs read to judge the last: enough for BASELINE_RUNS earlier ones when retries are among them.
_JUDGED_RUNS = 2 * BASELINE_RUNS + 1
_SPARKS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True, slots=True)
class RunsReport:
    job: str
    variant: str
    runs: tuple[Mapping[str, Any], ...]  # stored_runs' rows, oldest first
    verdict: Verdict  # of the newest run
    read_copy: ReadCopy | None = None  # a run holds the database: read from its copy
    profiled: int = 0  # the profiled runs read (to judge the newest: more than are shown)

    @property
    def drift(self) -> tuple[Drift, ...]:
        return self.verdict.drift

    @property
    def not_judged(self) -> NotJudged | None:
        """Why the newest run was not compared with the runs before it."""
        return self.verdict.not_judged

    @property
    def fails(self) -> bool:
        """What ``--fail-on-drift`` exits 1 on: a drift that is not an improvement."""
        return self.verdict.fails

    def to_json(self) -> dict[str, Any]:
        last = self.runs[-1] if self.runs else None
        series = last.get("series") if last else None
        verdict = self.verdict
        return {
            "job": self.job,
            "variant": self.variant,
            "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "rule": RULE,
            "runs": [_run_json(run) for run in self.runs],
            "drift": [entry.to_json() for entry in self.drift],
            "fails": self.fails,
            "judged": verdict.judged.to_json() if verdict.judged else None,
            "baseline": [run.to_json() for run in verdict.baseline],
            "against": describe_runs(verdict.baseline) if verdict.baseline else None,
            "not_judged": self.not_judged.to_json() if self.not_judged else None,
            "series": {"run_id": last["run_id"], "points": series} if last and series else None,
            "read_copy": self.read_copy.to_json() if self.read_copy else None,
        }


def _run_json(run: Mapping[str, Any]) -> dict[str, Any]:
    profile = run["profile"]
    attempted = profile.get("attempted") or 0
    cache = server_cache_of(run)  # what the servers' /metrics said (None behind a proxy)
    numbers = RunNumbers.of(run)
    return {
        "run_id": run["run_id"],
        "started_at": run["started_at"],
        "ended_at": run["ended_at"],
        "status": run["status"],
        "model": run["model"],
        "records": profile.get("records"),
        "failed": profile.get("failed"),
        "retried": profile.get("retried"),
        "records_per_min": profile.get("records_per_min"),
        "failure_rate": (profile.get("failed") or 0) / attempted if attempted else None,
        "failures": profile.get("failures") or {},
        "tokens_per_record": numbers.tokens_per_done or {},  # status's figure, of this run
        "latency_s": profile.get("latency_s") or {},
        "prefix_cache_hit_rate": cache.prefix_cache_hit_rate,
        "preemptions": cache.preemptions,
        "fields": {name: _field_json(data) for name, data in (profile.get("fields") or {}).items()},
        "numbers": numbers.to_json(),  # its row's: attempts, tokens, time... (records/min: the profile's)
    }


def _field_json(data: Mapping[str, Any]) -> dict[str, Any]:
    grounded = data.get("grounded")
    return {
        "kind": data.get("kind"),
        "fill_rate": data.get("fill_rate"),
        "distinct": data.get("distinct"),
        "mean_length": data.get("mean_length"),
        "top": data.get("top") or [],
        "grounded_share": grounded.get("share") if grounded else None,
    }


def runs_report(spec: JobSpec, runs: int = DEFAULT_RUNS) -> RunsReport:
    """The last ``runs`` profiled runs of ``spec.variant`` and what drifted in the newest run. Raises
    :class:`ConfigError` when the variant has no run; ``DatabaseLockedError`` while a run holds the
    database and has written no read copy yet."""
    if runs < 1:
        raise ConfigError(f"--runs {runs}: give 1 or more")
    tables = [spec.output.runs_table, spec.output.results_table]
    connection = open_job_output(spec, tables)
    try:
        check_variant(connection, spec)  # a typo is not a variant without runs
        # The newest run is judged against as many earlier runs as drift uses, however many are shown.
        found = stored_runs(connection, spec, max(runs, _JUDGED_RUNS))
        read_copy = read_copy_of(connection)
        newest = newest_run(connection, spec, read_copy.run_id if read_copy else None)
    finally:
        connection.close()
    if not found and newest is None:
        raise ConfigError(
            f"{spec.database}: no run of variant {spec.variant!r} has a profile yet "
            f"(every run keeps one from this version on: `{Asked.of(spec).command('run')}`)"
        )
    return judged_runs(spec.name, spec.variant, found, runs, read_copy, newest)


def judged_runs(
    job: str,
    variant: str,
    found: Sequence[Mapping[str, Any]],
    shown: int,
    read_copy: ReadCopy | None = None,
    newest: NewestRun | None = None,
) -> RunsReport:
    """The report of ``found`` (stored_runs' rows, oldest first): the last ``shown`` of them, and the
    newest run judged against the runs before it; ``newest``: the newest run that ended, which may have
    kept no profile (nothing to do): then there is nothing to judge."""
    verdict = judge_last([ProfiledRun.of(run) for run in found], newest)
    return RunsReport(job, variant, tuple(found[-shown:]), verdict, read_copy, len(found))


def _cell(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) < 1000 else f"{value:,.0f}"
    return number(value) if isinstance(value, int) else str(value)


def sparkline(values: Sequence[float | None], *, share: bool = False) -> str:
    """The values as a row of block characters (a gap for a missing one) on an axis from 0, as the
    page's plots: to 1 for a share, to the highest value for an amount. A 6% change moves a bar by
    half a step at most, and 0.000 against 0.003 (a share) is drawn flat."""
    known = [value for value in values if value is not None]
    if not known:
        return ""
    low, high = min(0.0, *known), max(1.0 if share else 0.0, *known)
    span = high - low
    return "".join(
        " "
        if value is None
        else _SPARKS[0 if span == 0 else round((value - low) / span * (len(_SPARKS) - 1))]
        for value in values
    )


def _rows(report: RunsReport) -> list[tuple[str, list[Any]]]:
    """(label, one value per run) for the run numbers, then each field's fill rate and grounded share."""
    runs = [_run_json(run) for run in report.runs]
    rows: list[tuple[str, list[Any]]] = [
        ("status", [run["status"] for run in runs]),
        ("records", [run["records"] for run in runs]),
        ("retried", [run["retried"] for run in runs]),
        ("failure rate", [run["failure_rate"] for run in runs]),
        ("records/min", [run["records_per_min"] for run in runs]),
    ]
    # Records never sent, each a row only when a run had some: blank ones (every prompt field empty,
    # set aside) and too_long ones (failed unsent: a count of the prompt said it cannot fit).
    for label, name in (("too long (not sent)", "too_long_unsent"), ("blank (not sent)", "blank")):
        unsent = [run["numbers"][name] for run in runs]
        if any(unsent):
            rows.insert(3, (label, unsent))
    for name in ("prompt", "completion", "reasoning"):
        rows.append((f"{name} tok/record", [run["tokens_per_record"].get(name) for run in runs]))
    for name in ("p50", "p90"):
        rows.append((f"latency {name} s", [run["latency_s"].get(name) for run in runs]))
    if any(run["prefix_cache_hit_rate"] is not None or run["preemptions"] is not None for run in runs):
        rows.append(("prefix-cache hit rate", [run["prefix_cache_hit_rate"] for run in runs]))
        rows.append(("preemptions", [run["preemptions"] for run in runs]))
    fields = list(runs[-1]["fields"])
    for name in fields:
        rows.append((f"{name}: fill", [run["fields"].get(name, {}).get("fill_rate") for run in runs]))
    for name in fields:
        shares = [run["fields"].get(name, {}).get("grounded_share") for run in runs]
        if any(share is not None for share in shares):
            rows.append((f"{name}: grounded", shares))
    return rows


def format_runs_report(report: RunsReport) -> str:
    """The runs as columns (oldest first), each number's trend, and the drift of the newest run."""
    if not report.runs:
        return "\n".join(
            [f"{report.job}, variant {report.variant}: no run with a profile yet", "", *drift_lines(report)]
        )
    header = ["run", *(str(run["run_id"]) for run in report.runs), "trend"]
    table = [header]
    for label, values in _rows(report):
        numbers = [value if isinstance(value, int | float) else None for value in values]
        share = label.endswith((": fill", ": grounded")) or label in ("failure rate", "prefix-cache hit rate")
        table.append([label, *(_cell(value) for value in values), sparkline(numbers, share=share)])
    widths = [max(len(row[column]) for row in table) for column in range(len(header))]
    runs = "run" if len(report.runs) == 1 else counted(len(report.runs), "run")
    lines = [
        f"{report.job}, variant {report.variant}: the last {runs} with a profile, oldest first",
        "",
        *(
            "  ".join(
                cell.ljust(width) if column in (0, len(header) - 1) else cell.rjust(width)
                for column, (cell, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in table
        ),
        "",
        *drift_lines(report),
    ]
    return "\n".join(lines)


def drift_lines(report: RunsReport) -> list[str]:
    """What drifted in the newest run, worse first and improvements last, each with the way it moved
    and what was allowed; the runs it was judged against, with their dates; or why it was not judged."""
    verdict, rule = report.verdict, f"({RULE})"
    if verdict.not_judged is not None:
        return [verdict.not_judged.describe(), rule]
    if verdict.judged is None:
        return []
    run = describe_runs([verdict.judged])
    if not verdict.baseline:
        if report.profiled <= 1:
            return [f"drift: {run} is the first with a profile; nothing to compare it with yet"]
        return [
            f"drift: nothing to compare {run} with: the runs before it were retries of earlier failures",
            rule,
        ]
    against = describe_runs(verdict.baseline)
    if not verdict.drift:
        return [f"no drift in {run} against {against}: every number is within its usual variation", rule]
    heading = f"drift in {run} against {against}:"
    if not verdict.fails:
        heading = f"no drift for the worse in {run} against {against}; better than usual:"
    lines = [heading]
    for entry in verdict.drift:
        # A number some earlier runs lack (a field new in the schema) was judged against fewer runs.
        fewer = set(entry.baseline) != set(verdict.baseline)
        own = f", against {describe_runs(entry.baseline)}" if fewer else ""
        lines.append(f"  {entry.describe(allowed=True)}{own}")
    return [*lines, rule]
