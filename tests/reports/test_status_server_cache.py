"""What ``status`` and ``report`` say of the servers' prefix cache and preemptions: from the numbers of a
run going on (its snapshot), else from the last run's row (its series, for a row kept before the row
had them); the warning of that same rate; nothing for a run whose servers had no /metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.reports.runs_report import format_runs_report, judged_runs
from pipeline.reports.status import JobStatus, ServerCache, server_cache_of
from pipeline.servers.cache_counters import WARN_AFTER_QUERIES, low_hit_rate_warning
from tests.reports.test_runs_page import figure_names, lines, open_page
from tests.reports.test_runs_report import stored_run
from tests.support.browser import require_browser
from tests.support.report_data import sample_report

#: A low rate for a job whose prompts are 88% shared prefix, past the prompt tokens that tell.
LOW_40 = low_hit_rate_warning(0.4, 0.88, "http://gpu1:8000/v1", WARN_AFTER_QUERIES) or ""


def run_with(points: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"run_id": 3, "base_url": "http://gpu1:8000/v1", "series": points}


def test_the_last_run_says_its_hit_rate_and_preemptions_from_its_last_point() -> None:
    points = [
        {"t": 5.0, "prefix_cache_hits": 100, "prefix_cache_queries": 1000, "preemptions": 0},
        {"t": 10.0, "prefix_cache_hits": 9700, "prefix_cache_queries": 10_000, "preemptions": 2},
    ]
    status = JobStatus(database="x.duckdb", last_run=run_with(points))
    assert status.server_cache == ServerCache(0.97, 2, ())


def test_a_row_kept_before_what_the_job_can_reach_was_kept_is_not_judged() -> None:
    points = [{"prefix_cache_hits": 0.31 * WARN_AFTER_QUERIES, "prefix_cache_queries": WARN_AFTER_QUERIES}]
    cache = server_cache_of(run_with(points))
    assert (cache.prefix_cache_hit_rate, cache.warnings) == (0.31, ())


def test_a_run_without_counters_or_series_says_nothing() -> None:
    assert server_cache_of(run_with(None)) == ServerCache()
    assert server_cache_of(run_with([{"t": 5.0, "done": 3}])) == ServerCache()
    assert JobStatus(database="x.duckdb").server_cache == ServerCache()


def test_a_run_going_on_says_its_snapshots_rate_and_the_warning_of_that_same_rate() -> None:
    """One number: the warning the run logged earlier (46% then) is not shown under today's 40%."""
    live = {
        "prefix_cache_hit_rate": 0.4,
        "prefix_cache_reachable": 0.88,
        "prefix_cache_queries": WARN_AFTER_QUERIES,
        "preemptions": 7,
        "prefix_cache_warnings": ["prefix-cache hit rate 46%: said an hour ago"],
        "endpoints": {"gpu1:8000": {"base_url": "http://gpu1:8000/v1"}},
    }
    status = JobStatus(database="x.duckdb", last_run=run_with(None), live=live)
    assert LOW_40.startswith("prefix-cache hit rate 40%")
    assert status.server_cache == ServerCache(0.4, 7, (LOW_40,))


def test_the_last_run_says_the_hit_rate_its_row_keeps_and_the_warning_of_it() -> None:
    """The row's number, which the summary and Prometheus said too, over what its series would say."""
    points = [{"prefix_cache_hits": 9700, "prefix_cache_queries": 10_000, "preemptions": 2}]
    row = {**run_with(points), "prefix_cache_hit_rate": 0.4, "prefix_cache_queries": WARN_AFTER_QUERIES}
    row["prefix_cache_reachable"] = 0.88
    assert server_cache_of({**row, "preemptions": 0}) == ServerCache(0.4, 0, (LOW_40,))


def test_the_runs_report_has_a_row_for_the_hit_rate_and_preemptions_when_a_server_said() -> None:
    runs = [stored_run(run_id, 120) for run_id in range(1, 4)]
    plain = format_runs_report(judged_runs("job", "main", runs, 10))
    assert "prefix-cache hit rate" not in plain and "preemptions" not in plain
    runs[-1]["series"] = [{"prefix_cache_hits": 9000, "prefix_cache_queries": 10_000, "preemptions": 4}]
    report = judged_runs("job", "main", runs, 10)
    lines = format_runs_report(report).splitlines()
    rows = [line.split()[-5:] for line in lines if line.startswith(("prefix-cache", "preemptions"))]
    assert rows == [["rate", "-", "-", "0.90", "▇"], ["preemptions", "-", "-", "4", "█"]]
    last = report.to_json()["runs"][-1]
    assert (last["prefix_cache_hit_rate"], last["preemptions"]) == (0.9, 4)


@pytest.mark.process
def test_the_page_plots_the_hit_rate_over_runs_and_time_and_has_its_rows(tmp_path: Path) -> None:
    require_browser()
    data = sample_report(series_points=4)
    rates = [None, 0.97, 0.96, 0.95, 0.31, 0.3]  # the first run's servers said nothing (a proxy)
    for run, rate in zip(data["runs"], rates, strict=True):
        run["prefix_cache_hit_rate"], run["preemptions"] = rate, None if rate is None else 2
    for point, rate, since in zip(
        data["series"]["points"], (None, 0.3, 0.31, 0.3), (None, 0.3, 0.32, 0.29), strict=True
    ):
        point["prefix_cache_hit_rate"], point["prefix_cache_hit_rate_since_previous"] = rate, since
    dom = open_page(tmp_path, data)
    assert lines(dom, "prefix_cache") == {"prefix-cache hit rate": 5}
    assert lines(dom, "prefix_cache_over_time") == {"since the start": 3, "since the point before": 3}
    cells = dom.find("tr", data_measure="prefix_cache_hit_rate").find_all("td")
    assert [cell.text for cell in cells] == ["—", "97.00%", "96.00%", "95.00%", "31.00%", "30.00%"]
    assert len(dom.find("tr", data_measure="preemptions").find_all("td")) == 6
    plain = open_page(tmp_path, sample_report(series_points=4))  # no server said: no plot, no row
    assert "prefix_cache" not in figure_names(plain) and "prefix_cache_over_time" not in figure_names(plain)
    assert plain.find_all("tr", data_measure="prefix_cache_hit_rate") == []
