"""``pipeline report``'s text and JSON from stored runs: the trends, what drifted in the newest run
and which way, the runs it was judged against, and the runs not judged (a quiet night after a drift
among them); and, in the CLI, ``--fail-on-drift`` failing on a drift for the worse only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.job.commands import command
from pipeline.quality.drift import NewestRun
from pipeline.reports.runs_report import format_runs_report, judged_runs, runs_report, sparkline
from pipeline.reports.status import job_status
from tests.support.cli import cli_run
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.jobs import make_job
from tests.support.runs import run_served
from tests.support.variants import main_answer, run_variant, variants_job


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
        "started_at": f"2026-11-{run_id:02d}T02:00:00",
        "ended_at": f"2026-11-{run_id:02d}T02:01:00",
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
    lines = format_runs_report(report).splitlines()
    assert lines[0] == "linkedin, variant main: the last 3 runs with a profile, oldest first"
    heading = (
        "drift in run 12 (2026-11-12 02:00 UTC) against runs 2-11 (2026-11-02 02:00 to 2026-11-11 02:00 UTC):"
    )
    assert lines[lines.index(heading) + 1] == "  skills mean_length 2.40 -> 9.00 (up; allowed ±1.00)"
    data = report.to_json()
    assert data["fails"] is True and data["judged"] == {"run_id": 12, "started_at": "2026-11-12T02:00:00"}
    assert [run["run_id"] for run in data["baseline"]] == list(range(2, 12))
    assert data["against"] == "runs 2-11 (2026-11-02 02:00 to 2026-11-11 02:00 UTC)"


def test_the_first_run_has_nothing_to_compare_with() -> None:
    report = judged_runs("linkedin", "main", [stored_run(1, 400, skills=9.0)], 10)
    assert report.drift == () and not report.fails
    assert format_runs_report(report).splitlines()[0] == (
        "linkedin, variant main: the last run with a profile, oldest first"  # not "the last 1 runs"
    )
    assert format_runs_report(report).splitlines()[-1] == (
        "drift: run 1 (2026-11-01 02:00 UTC) is the first with a profile; nothing to compare it with yet"
    )


def test_one_earlier_run_is_named_as_the_baseline() -> None:
    report = judged_runs("linkedin", "main", [stored_run(1, 400), stored_run(2, 400, skills=9.0)], 10)
    assert "drift in run 2 (2026-11-02 02:00 UTC) against run 1 (2026-11-01 02:00 UTC):" in (
        format_runs_report(report).splitlines()
    )


def faster(run_id: int) -> dict[str, Any]:
    """A run of the usual 400 records at 9 times the usual records/min, with no failure."""
    run = stored_run(run_id, 400)
    run["profile"]["records_per_min"] = 9 * 3500.0
    return run


def failing(run_id: int) -> dict[str, Any]:
    """A run of 400 records of which 44 failed (truncated): a failure rate of 0.11."""
    run = stored_run(run_id, 400)
    run["profile"].update(failed=44, attempted=444, failures={"truncated": 44})
    return run


def test_an_improvement_is_reported_as_one_and_fails_nothing() -> None:
    """Issue 29: `failure_rate 0.11 -> 0.00` and records/min up 9x were mailed as drift."""
    report = judged_runs("linkedin", "main", [*(failing(run_id) for run_id in range(1, 6)), faster(6)], 10)
    assert {entry.measure: entry.way for entry in report.drift} == {
        "failure_rate": "better",
        "records_per_min": "better",
    }
    assert not report.fails and report.to_json()["fails"] is False
    lines = format_runs_report(report).splitlines()
    assert lines[0] == "linkedin, variant main: the last 6 runs with a profile, oldest first"
    heading = (
        "no drift for the worse in run 6 (2026-11-06 02:00 UTC) against runs 1-5 "
        "(2026-11-01 02:00 to 2026-11-05 02:00 UTC); better than usual:"
    )
    following = lines[lines.index(heading) + 1 : lines.index(heading) + 3]
    assert following[0] == "  failure_rate 0.10 -> 0.00 (better; allowed ±0.06)"  # 4 standard errors
    assert following[1].startswith("  records_per_min 3,503 -> 31,500 (better; allowed ±")


def test_a_degradation_beside_an_improvement_fails_and_comes_first() -> None:
    quicker_but_failing = failing(6)
    quicker_but_failing["profile"]["records_per_min"] = 9 * 3500.0
    runs = [*(stored_run(run_id, 400) for run_id in range(1, 6)), quicker_but_failing]
    report = judged_runs("linkedin", "main", runs, 10)
    assert [(entry.measure, entry.way) for entry in report.drift] == [
        ("failure_rate", "worse"),
        ("records_per_min", "better"),
    ]
    assert report.fails and report.to_json()["drift"][0]["fails"] is True
    assert any(line.startswith("drift in run 6 ") for line in format_runs_report(report).splitlines())


def test_a_quiet_night_after_a_drift_is_not_judged_and_fails_nothing() -> None:
    """Issue 29: after a drift, every quiet night's `report --fail-on-drift` mailed the same drift again."""
    runs = [*(stored_run(run_id, 400) for run_id in range(1, 6)), stored_run(6, 400, skills=9.0)]
    assert judged_runs("linkedin", "main", runs, 10).fails  # the night of the drift: said once
    newest = NewestRun(7, "nothing_to_do", "2026-11-07T02:00:00", 0, quiet=True)
    report = judged_runs("linkedin", "main", runs, 10, newest=newest)
    assert report.drift == () and not report.fails
    message = (
        "not judged: run 7 (2026-11-07 02:00 UTC) had nothing to do; only the newest run is judged, so what "
        "the runs before it drifted is not said again"
    )
    lines = format_runs_report(report).splitlines()
    assert message in lines and not any(line.startswith("drift in") for line in lines)
    assert lines[2].split() == ["run", "1", "2", "3", "4", "5", "6", "trend"]  # a quiet night has no column
    data = report.to_json()
    assert data["not_judged"]["reason"] == "nothing_to_do" and data["not_judged"]["message"] == message
    assert (data["drift"], data["fails"], data["judged"]) == ([], False, None)


def test_only_quiet_nights_make_a_report_with_no_column() -> None:
    newest = NewestRun(1, "nothing_to_do", "2026-11-01T02:00:00", 0, quiet=True)
    report = judged_runs("linkedin", "main", [], 10, newest=newest)
    assert format_runs_report(report).splitlines()[:3] == [
        "linkedin, variant main: no run with a profile yet",
        "",
        "not judged: run 1 (2026-11-01 02:00 UTC) had nothing to do; only the newest run is judged, so what "
        "the runs before it drifted is not said again",
    ]
    assert report.to_json()["runs"] == [] and report.to_json()["series"] is None


@pytest.mark.anyio
async def test_a_variant_without_a_run_names_the_run_that_makes_one(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2, variants={"short": {"max_tokens": 64}})
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    with pytest.raises(ConfigError) as none:
        runs_report(spec.for_variant("short"))
    run = command("run", str(spec.source_file), "--variant", "short")  # pasted outside the virtualenv too
    assert str(none.value) == (
        f"{spec.database}: no run of variant 'short' has a profile yet (every run keeps one from this "
        f"version on: `{run}`)"
    )


def test_records_set_aside_blank_are_a_row_only_when_a_run_had_some() -> None:
    """Records whose prompt fields were all empty: not sent, and counted in the run's numbers."""
    quiet = judged_runs("linkedin", "main", [stored_run(1, 400), stored_run(2, 400)], 10)
    assert "blank (not sent)" not in format_runs_report(quiet)
    runs = [stored_run(1, 400), stored_run(2, 400) | {"blank": 3}]
    report = judged_runs("linkedin", "main", runs, 10)
    (row,) = [line for line in format_runs_report(report).splitlines() if line.startswith("blank")]
    assert row.split() == ["blank", "(not", "sent)", "0", "3", "▁█"]
    assert [run["numbers"]["blank"] for run in report.to_json()["runs"]] == [0, 3]


def test_records_failed_too_long_unsent_are_a_row_beside_the_blank_ones() -> None:
    """The other number of records a run never sent: said the way the blank ones are, and only when a
    run had some."""
    quiet = judged_runs("linkedin", "main", [stored_run(1, 400), stored_run(2, 400)], 10)
    assert "too long (not sent)" not in format_runs_report(quiet)
    runs = [stored_run(1, 400) | {"too_long_unsent": 4}, stored_run(2, 400) | {"blank": 3}]
    report = judged_runs("linkedin", "main", runs, 10)
    lines = format_runs_report(report).splitlines()
    (blank,) = [index for index, line in enumerate(lines) if line.startswith("blank")]
    assert lines[blank + 1].split() == ["too", "long", "(not", "sent)", "4", "0", "█▁"]
    assert [run["numbers"]["too_long_unsent"] for run in report.to_json()["runs"]] == [4, 0]


def test_tokens_per_done_record_are_one_number_in_status_and_report(tmp_path: Path) -> None:
    """One definition, every request's tokens over the records done (re-asks and the failed record's
    requests counted): status said 122 prompt tokens per done record and report 100 (its results'
    own) for the same run, as status said 6,440 and report 5,153 for a run against a faulty server."""
    spec = variants_job(tmp_path)  # 9 done, 1 failed after 2 requests; 100, 40, 10 tokens a reply
    run_variant(spec, "main", main_answer)
    expected = {"prompt": 1100 / 9, "completion": 440 / 9, "reasoning": 110 / 9}
    assert job_status(spec).tokens_per_done == expected
    (run,) = runs_report(spec).to_json()["runs"]
    assert run["tokens_per_record"] == expected == run["numbers"]["tokens_per_done"]
    (profiled,) = runs_report(spec).runs
    assert {name: tokens["mean"] for name, tokens in profiled["profile"]["tokens"].items()} == expected
    status = cli_run("status", str(spec.source_file)).stdout
    assert "tokens:   122 prompt + 49 output (12 reasoning) per done record, every attempt counted" in status
    report = cli_run("report", str(spec.source_file)).stdout.splitlines()
    said = {line.split()[0]: line.split()[2] for line in report if " tok/record " in line}
    assert said == {"prompt": "122.22", "completion": "48.89", "reasoning": "12.22"}
