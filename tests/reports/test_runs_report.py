from __future__ import annotations

from typing import Any

from pipeline.reports.runs_report import format_runs_report, judged_runs, sparkline


def test_a_sparkline_draws_lowest_to_highest_with_gaps_for_missing_values() -> None:
    assert sparkline([0.0, 0.5, None, 1.0], share=True) == "▁▅ █"
    assert sparkline([100.0, 200.0, 150.0]) == "▅█▆"
    assert sparkline([None, None]) == ""
    assert sparkline([3.0, 3.0, 3.0]) == "███"
    assert sparkline([0.0, 0.0]) == "▁▁"


def test_a_sparkline_draws_from_zero_so_a_small_change_is_a_small_step() -> None:
    """Issue 22: 3,116 against 3,321 prompt tokens (6%) was drawn from the lowest bar to the highest."""
    assert sparkline([3321.0, 3239.0, 3147.0, 3116.0, 3163.0, 3262.0]) == "██████"  # 6%: under a step
    assert sparkline([3948.0, 3814.0, 1166.0]) == "██▃"  # records/min a third: a third of the height
    assert sparkline([0.0, 0.0, 0.003, 0.0], share=True) == "▁▁▁▁"  # shares on 0..1
    assert sparkline([1.0, 1.0, 0.0], share=True) == "██▁"  # a field emptied: the whole height


def stored_run(run_id: int, records: int, *, retried: int = 0, skills: float = 2.4) -> dict[str, Any]:
    """A row of stored_runs: a run of ``records`` ads, ``retried`` of them retries of earlier failures."""
    return {
        "run_id": run_id,
        "started_at": "2026-11-20T02:00:00",
        "ended_at": "2026-11-20T02:01:00",
        "status": "completed",
        "model": "test-model",
        "concurrency": 24,
        "series": None,
        "profile": {
            "records": records,
            "failed": 0,
            "attempted": records,
            "retried": retried,
            "failures": {},
            "tokens": {"completion": {"mean": 300.0 + run_id, "sd": 20.0}},
            "latency_s": {"p50": 0.3, "p90": 0.4},
            "records_per_min": 3500.0 + run_id,
            "duration_s": records * 60 / 3500,
            "fields": {
                "skills": {
                    "kind": "list",
                    "records": records,
                    "filled": records,
                    "fill_rate": 1.0,
                    "mean_length": skills,
                    "length_sd": 1.0,
                },
            },
        },
    }


def test_a_one_record_retry_is_reported_not_judged_with_its_size() -> None:
    """Issue 22: `--only-failed` of one record flagged `mean_length 2.42 -> 4.00` and the cron mailed."""
    runs = [*(stored_run(run_id, 120) for run_id in range(1, 6)), stored_run(6, 1, retried=1, skills=4.0)]
    report = judged_runs("linkedin", "main", runs, 10)
    assert report.drift == ()
    text = format_runs_report(report)
    assert (
        "not judged: run 6 retried earlier failures (1 of its 1 record, against the usual 120 new ones); "
        "a retry is not a sample of the usual input"
    ) in text.splitlines()
    assert "drift in run 6:" not in text and "no drift" not in text
    data = report.to_json()
    assert data["drift"] == [] and data["not_judged"]["reason"] == "retried"
    assert [run["retried"] for run in data["runs"]] == [0, 0, 0, 0, 0, 1]


def test_a_run_far_smaller_than_usual_is_reported_too_small() -> None:
    runs = [*(stored_run(run_id, 400) for run_id in range(1, 5)), stored_run(5, 20, skills=9.0)]
    report = judged_runs("linkedin", "main", runs, 10)
    assert report.drift == () and report.not_judged is not None
    assert report.to_json()["not_judged"]["message"] == (
        "not judged: too small: run 5 has 20 records against the usual 400 "
        "(a run under a quarter of the usual size is not compared)"
    )


def test_a_run_of_the_usual_size_is_judged_and_only_the_last_runs_are_shown() -> None:
    runs = [*(stored_run(run_id, 400) for run_id in range(1, 12)), stored_run(12, 400, skills=9.0)]
    report = judged_runs("linkedin", "main", runs, 3)
    assert [run["run_id"] for run in report.runs] == [10, 11, 12]
    assert [(entry.field, entry.measure) for entry in report.drift] == [("skills", "mean_length")]
    assert report.not_judged is None and report.to_json()["not_judged"] is None
    assert "  skills mean_length 2.40 -> 9.00 (allowed ±1.00)" in format_runs_report(report).splitlines()
