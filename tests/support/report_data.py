"""Sample data of ``pipeline report JOB``: the JSON-ready dict its ``--json`` prints and ``--html`` draws.

``sample_report`` builds runs of a nightly job whose numbers wobble a little from run to run (a fixed
pattern, no randomness), optionally with a planted drift in the last run (the salary field stops being
filled) and a time series of the last run with the concurrency limits of some endpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.quality.drift import RunDate, describe_runs

JOB = "linkedin"
VARIANT = "main"
GENERATED_AT = "2026-11-25T05:00:00+00:00"
MODEL = "openai/gpt-oss-120b"
RULE = (
    "A measure drifted when the last run moved it further from the median of the runs before than "
    "three times their usual run-to-run variation (at least 0.02 for shares)."
)
# field -> (kind, usual fill rate, usual grounded share or None: not a grounded field)
FIELDS: dict[str, tuple[str, float, float | None]] = {
    "title": ("text", 1.0, 0.97),
    "explicit_skills": ("list", 0.93, 0.81),
    "seniority": ("text", 0.74, None),
    "salary": ("object", 0.6, None),
}
GROUNDED_FIELDS = [name for name, (_, _, grounded) in FIELDS.items() if grounded is not None]
ENDPOINTS = ("127.0.0.1:8000", "gpu-b:8000")
FIRST_RUN_ID = 3
SALARY_DRIFT = {
    "field": "salary",
    "measure": "fill_rate",
    "before": 0.6,
    "now": 0.0,
    "threshold": 0.08,
    "change": "either",  # a fill rate has no better side: a move either way is a drift
    "fails": True,
}
_WOBBLE = (0.0, 0.01, -0.01, 0.02, -0.02, 0.005)  # the usual run-to-run variation, repeated


def sample_report(
    runs: int = 6,
    *,
    drift: bool = True,
    series_points: int | None = 50,
    endpoints: Sequence[str] = ENDPOINTS,
) -> dict[str, Any]:
    """``runs`` runs (ids from 3 up), the last with salary unfilled when ``drift``; a series of the last
    run with ``series_points`` points (None: no series) and a limit per endpoint (none: ``limits`` {})."""
    run_ids = list(range(FIRST_RUN_ID, FIRST_RUN_ID + runs))
    last = run_ids[-1]
    earlier = [RunDate(run_id, _started(index)) for index, run_id in enumerate(run_ids[:-1])]
    baseline = [run.to_json() for run in earlier]
    return {
        "job": JOB,
        "variant": VARIANT,
        "generated_at": GENERATED_AT,
        "rule": RULE,
        "runs": [
            sample_run(run_id, index, drifted=drift and run_id == last)
            for index, run_id in enumerate(run_ids)
        ],
        "drift": [{"run_id": last, **SALARY_DRIFT, "baseline": baseline}] if drift else [],
        "fails": drift,
        "judged": {"run_id": last, "started_at": _started(len(run_ids) - 1)},
        "baseline": baseline,
        "against": describe_runs(earlier) if earlier else None,
        "not_judged": None,
        "series": None if series_points is None else sample_series(last, series_points, endpoints),
    }


def sample_run(run_id: int, index: int, *, drifted: bool = False) -> dict[str, Any]:
    """One run's row: ``index`` picks its wobble; ``drifted``: salary was never filled."""
    wobble = _WOBBLE[index % len(_WOBBLE)]
    records, failed = 1200 + 10 * index, 3 + index % 2
    return {
        "run_id": run_id,
        "started_at": _started(index),
        "ended_at": f"2026-11-{20 + index % 9:02d}T02:{18 + index % 3:02d}:30",
        "status": "completed",
        "model": MODEL,
        "records": records,
        "failed": failed,
        "retried": 0,
        "records_per_min": round(64.2 + 40 * wobble, 1),
        "failure_rate": round(failed / records, 4),
        "failures": {"truncated": failed - 1, "schema_invalid": 1},
        "tokens_per_record": {
            "prompt": round(1510.2 + 100 * wobble, 1),
            "completion": round(640.1 + 80 * wobble, 1),
            "reasoning": round(210.4 - 60 * wobble, 1),
        },
        "latency_s": {"p50": round(210.0 + 100 * wobble, 1), "p90": round(290.5 + 150 * wobble, 1)},
        "fields": {
            name: sample_field(kind, 0.0 if drifted and name == "salary" else fill + wobble, grounded, wobble)
            for name, (kind, fill, grounded) in FIELDS.items()
        },
    }


def _started(index: int) -> str:
    return f"2026-11-{20 + index % 9:02d}T02:00:00"


def sample_field(kind: str, fill_rate: float, grounded: float | None, wobble: float) -> dict[str, Any]:
    """One field's statistics in one run."""
    return {
        "kind": kind,
        "fill_rate": round(min(max(fill_rate, 0.0), 1.0), 4),
        "distinct": 700 if fill_rate else 0,
        "mean_length": 5.2 if kind == "list" else None,
        "top": [["Data Engineer", 0.05]] if kind == "text" else [],
        "grounded_share": None if grounded is None else round(grounded + wobble, 4),
    }


def sample_series(run_id: int, points: int, endpoints: Sequence[str] = ENDPOINTS) -> dict[str, Any]:
    """The run over time, a point every 6 s: a ramp up to ~64 records/min, each endpoint's limit
    halved once a third of the way in (a backoff) and grown back by one per point after that."""
    samples = []
    for number in range(points):
        t = 6.0 * number
        limits = {
            endpoint: _limit(32 // (position + 1), number, points)
            for position, endpoint in enumerate(endpoints)
        }
        samples.append(
            {
                "t": t,
                "done": int(t * 64 / 60),
                "failed": number // 20,
                "records_per_min": None if number == 0 else 60.0 * int(t * 64 / 60) / t,
                "records_per_min_since_previous": None if number == 0 else round(min(64.0, 8.0 * number), 1),
                "in_flight": min(sum(limits.values()), 4 * number) if limits else min(48, 4 * number),
                "limits": limits,
            }
        )
    return {"run_id": run_id, "points": samples}


def _limit(start: int, number: int, points: int) -> int:
    backoff_at = points // 3
    return start if number < backoff_at else min(start, start // 2 + (number - backoff_at))
