"""The runs page of ``pipeline report --html``: its embedded data without a browser, and what it shows
(plots, drift, the runs table) in a real headless Chromium."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.reports.runs_page import page_data, render_runs_page, write_runs_page
from tests.support.browser import Element, dump_dom, parse_dom, require_browser
from tests.support.process_guard import starts_a_process
from tests.support.report_data import (
    ENDPOINTS,
    FIELDS,
    GENERATED_AT,
    GROUNDED_FIELDS,
    RULE,
    sample_report,
)

EVIL = 'Fin & "Ops" </script><script>alert(1)</script> <!-- x \u2028 line'
DATA_SCRIPT = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.DOTALL)
RUN_PLOTS = ("fill_rate", "grounded_share", "tokens", "latency", "speed", "failure_rate")
TIME_PLOTS = ("records_per_min", "in_flight")
LAST_RUN = "8"  # sample_report(): runs 3 to 8


def embedded(document: str) -> Any:
    match = DATA_SCRIPT.search(document)
    assert match is not None
    return json.loads(match.group(1))


def open_page(tmp_path: Path, data: dict[str, Any]) -> Element:
    """The page's DOM after its scripts ran in Chromium."""
    return parse_dom(dump_dom(write_runs_page(data, tmp_path / "runs.html")))


def lines(dom: Element, plot: str) -> dict[str, int]:
    """The plot's lines: series name -> number of points drawn."""
    chart = dom.find("svg", data_plot=plot)
    return {
        line.attrs["data-series"]: int(line.attrs["data-points"])
        for line in chart.find_all("path", cls="line")
    }


def figure_names(dom: Element) -> list[str]:
    return [figure.attrs["data-figure"] for figure in dom.find_all("figure", cls="plot")]


def hostile_report() -> dict[str, Any]:
    """The sample, with hostile text as job name, a top value, a model name and a limit's endpoint."""
    data = sample_report(series_points=3, endpoints=[EVIL])
    data["job"] = f"job {EVIL}"
    data["runs"][-1]["model"] = EVIL
    data["runs"][-1]["fields"]["title"]["top"] = [[EVIL, 0.5]]
    return data


@pytest.fixture
@starts_a_process
def browser() -> str:
    return require_browser()


# One Chromium start for the sample page, shared by the tests that only read its DOM.
@pytest.fixture(scope="module")
@starts_a_process
def sample_dom(tmp_path_factory: pytest.TempPathFactory) -> Element:
    require_browser()
    return open_page(tmp_path_factory.mktemp("runs"), sample_report())


# ---- without a browser


def test_embedded_json_round_trips_to_the_report_data() -> None:
    data = sample_report()
    assert embedded(render_runs_page(data)) == data == page_data(data)


def test_non_finite_numbers_are_embedded_as_null() -> None:
    data = sample_report(runs=2, series_points=2)
    data["runs"][0]["records_per_min"] = float("nan")
    data["runs"][1]["tokens_per_record"]["prompt"] = float("inf")
    data["series"]["points"][1]["limits"] = {"a": float("-inf")}
    runs = embedded(render_runs_page(data))["runs"]
    assert runs[0]["records_per_min"] is None and runs[1]["tokens_per_record"]["prompt"] is None
    assert embedded(render_runs_page(data))["series"]["points"][1]["limits"] == {"a": None}


def test_embedding_keeps_report_text_from_ending_the_script_element() -> None:
    data = hostile_report()
    document = render_runs_page(data)
    assert document.count("</script>") == 2 and "<!--" not in document and "\u2028" not in document
    assert embedded(document) == data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"runs": None}, r"'runs' must be a list, not None"),
        ({"job": 7}, r"'job' must be a str, not 7"),
        ({"drift": {}}, r"'drift' must be a list"),
        ({"series": {"run_id": 8}}, r"'series' must be null or an object with a list of 'points'"),
        ({"series": {"run_id": 8, "points": [None]}}, r"'series' must be null or an object"),
        ({"drift": [{"run_id": 8, "field": "salary"}]}, r"every drift entry needs a 'field' and a 'measure'"),
        ({"runs": [{"started_at": "x"}]}, r"every run needs a 'run_id'"),
        ({"not_judged": {"reason": "retried"}}, r"'not_judged' must be null or an object with a 'message'"),
        ({"against": ["runs 3-7"]}, r"'against' must be null or a str"),
    ],
)
def test_malformed_report_data_is_refused_naming_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^report data: {message}"):
        render_runs_page({**sample_report(), **change})


def test_document_loads_nothing_and_allows_only_its_own_script_and_style() -> None:
    document = render_runs_page(sample_report())
    assert re.search(r"""\b(src|href|srcset|action)\s*=""", document, re.IGNORECASE) is None
    # The one URL is the SVG namespace, a name that is never fetched.
    assert re.findall(r"[a-z]+://[^\s\"'`]*", document, re.IGNORECASE) == ["http://www.w3.org/2000/svg"]
    (script,) = re.findall(r"<script>(.*?)</script>", document, re.DOTALL)
    (style,) = re.findall(r"<style>(.*?)</style>", document, re.DOTALL)
    digest = {
        name: base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        for name, text in [("script", script), ("style", style)]
    }
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', document)
    assert policy is not None and policy.group(1) == (
        f"default-src 'none'; script-src 'sha256-{digest['script']}'; style-src 'sha256-{digest['style']}'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script
    assert "@import" not in style and "url(" not in style


def test_write_replaces_the_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "runs.html"
    path.write_text("the old page")
    assert write_runs_page(sample_report(), path) == path
    assert path.read_text(encoding="utf-8") == render_runs_page(sample_report())
    assert [entry.name for entry in tmp_path.iterdir()] == ["runs.html"]


def test_a_failed_write_names_the_report_page(tmp_path: Path) -> None:
    """The writer is reports/html_page.py's (tested there); its errors name this page."""
    with pytest.raises(ConfigError, match=r"cannot write the report page \(No such file"):
        write_runs_page(sample_report(), tmp_path / "nope" / "runs.html")


# ---- in Chromium


def test_header_names_the_job_the_runs_and_the_rule(sample_dom: Element) -> None:
    assert sample_dom.find("h1").text == "Runs of linkedin / main"
    facts = {
        row.attrs["data-fact"]: row.find("dd").text for row in sample_dom.find(id="summary").find_all("div")
    }
    assert facts == {
        "job": "linkedin",
        "variant": "main",
        "runs": "6 (runs 3 to 8)",
        "generated": GENERATED_AT,
    }
    assert sample_dom.find(id="rule").text == f"Drift rule: {RULE}"


def test_the_drift_list_names_the_drifted_field_and_measure(sample_dom: Element) -> None:
    (item,) = sample_dom.find(id="drift").find_all("li")
    assert (item.attrs["data-field"], item.attrs["data-measure"], item.attrs["data-run"]) == (
        "salary",
        "fill_rate",
        LAST_RUN,
    )
    assert item.text == "salary fill_rate 0.60 → 0.00 (down; threshold ±0.08)"  # no better side: its way
    assert (
        "hidden" not in sample_dom.find(id="drift").attrs and "hidden" in sample_dom.find(id="no-drift").attrs
    )
    assert "has-drift" in sample_dom.find(id="drift-section").attrs["class"]
    assert sample_dom.find(id="against").text == (
        "Judged against runs 3-7 (2026-11-20 02:00 to 2026-11-24 02:00 UTC)."
    )


def test_each_plot_has_a_line_per_series_and_a_point_per_run_or_sample(sample_dom: Element) -> None:
    assert figure_names(sample_dom) == [*RUN_PLOTS, *TIME_PLOTS, "limits"]
    assert lines(sample_dom, "fill_rate") == dict.fromkeys(FIELDS, 6)
    assert lines(sample_dom, "grounded_share") == dict.fromkeys(GROUNDED_FIELDS, 6)
    assert lines(sample_dom, "tokens") == {"prompt": 6, "completion": 6, "reasoning": 6}
    assert lines(sample_dom, "latency") == {"p50": 6, "p90": 6}
    assert lines(sample_dom, "speed") == {"records/min": 6}
    assert lines(sample_dom, "failure_rate") == {"all classes": 6, "truncated": 6, "schema_invalid": 6}
    # The first sample has none yet.
    assert lines(sample_dom, "records_per_min") == {"since the start": 49, "since the point before": 49}
    assert lines(sample_dom, "in_flight") == {"in flight": 50}
    assert lines(sample_dom, "limits") == dict.fromkeys(ENDPOINTS, 50)
    fill_rate = sample_dom.find("svg", data_plot="fill_rate")
    assert len(fill_rate.find_all("circle", cls="point")) == 4 * 6
    assert fill_rate.find_all("title")[0].text == "Fill rate per field"  # each plot is titled, axes labelled
    assert [label.text for label in fill_rate.find_all("text", cls="axis-label")] == ["run", "fill rate"]
    assert [tick.text for tick in fill_rate.find_all("text", cls="tick")][:5] == [
        "0",
        "0.25",
        "0.5",
        "0.75",
        "1",
    ]


def test_plots_have_legends_and_exact_values_on_hover(sample_dom: Element) -> None:
    figure = sample_dom.find("figure", data_figure="tokens")
    assert [item.text for item in figure.find("ul", cls="legend").find_all("li")] == [
        "prompt",
        "completion",
        "reasoning",
    ]
    last = sample_dom.find("svg", data_plot="fill_rate").find_all("rect", cls="strip")[-1]
    assert (
        last.find("title").text
        == f"run {LAST_RUN}\ntitle: 1.00\nexplicit_skills: 0.94\nseniority: 0.74\nsalary: 0.00"
    )


def test_the_drifted_field_is_highlighted_in_its_plot(sample_dom: Element) -> None:
    chart = sample_dom.find("svg", data_plot="fill_rate")
    assert [group.attrs["data-series"] for group in chart.find_all("g", cls="drifted")] == ["salary"]
    (marked,) = chart.find_all("circle", cls="drift-point")
    assert marked.find("title").text == f"salary, run {LAST_RUN}: 0.00 (drift)"
    legend = sample_dom.find("figure", data_figure="fill_rate").find("li", cls="drifted")
    assert legend.text == "salary ⚠ drift"
    assert sample_dom.find("svg", data_plot="grounded_share").find_all("g", cls="drifted") == []


def test_the_table_puts_runs_side_by_side_and_marks_the_drifted_cell(sample_dom: Element) -> None:
    table = sample_dom.find("table", id="runs")
    assert [cell.text for cell in table.find("thead").find_all("th")] == [
        "run",
        *(f"run {run_id}" for run_id in range(3, 8)),
        f"run {LAST_RUN}latest",
    ]
    (drifted,) = table.find_all("td", cls="drifted")
    assert (drifted.attrs["data-run"], drifted.attrs["data-field"], drifted.attrs["data-measure"]) == (
        LAST_RUN,
        "salary",
        "fill_rate",
    )
    assert drifted.text == "0.00"
    assert drifted.attrs["title"].startswith(
        f"drift in fill_rate: 0.60 → 0.00 (down; threshold ±0.08)\nsalary in run {LAST_RUN}\nfill rate 0.00\n"
    )
    records = table.find("tr", data_measure="records")
    assert [cell.text for cell in records.find_all("td")] == [
        "1,200",
        "1,210",
        "1,220",
        "1,230",
        "1,240",
        "1,250",
    ]
    assert table.find("td", data_run="3", data_measure="failures").text == "truncated 2, schema_invalid 1"
    assert table.find("td", data_run="3", data_measure="duration").text == "18m 30s"
    fill_rows = table.find_all("tr", data_measure="fill_rate")
    assert [row.attrs["data-field"] for row in fill_rows] == list(FIELDS)
    grounded_rows = table.find_all("tr", data_measure="grounded_share")
    assert [row.attrs["data-field"] for row in grounded_rows] == GROUNDED_FIELDS


def test_speed_latency_and_failures_are_plotted_across_runs(sample_dom: Element) -> None:
    """Issue 22: these were only in the last run's time series, so a slower server showed no trend."""
    latency = sample_dom.find("figure", data_figure="latency")
    assert latency.find("figcaption").text == "Reply time per run (latency p50, p90)"
    assert [label.text for label in latency.find_all("text", cls="axis-label")] == ["run", "seconds"]
    last = latency.find_all("rect", cls="strip")[-1].find("title").text
    assert last == f"run {LAST_RUN}\np50: 211\np90: 291"
    assert (
        sample_dom.find("figure", data_figure="speed").find("figcaption").text == "Records per minute per run"
    )
    failures = sample_dom.find("svg", data_plot="failure_rate")
    ticks = [tick.text for tick in failures.find_all("text", cls="tick") if tick.text.endswith("%")]
    assert ticks[0] == "0%" and len(ticks) >= 3  # a rate's axis in percent, not 0 and 0
    first = failures.find_all("rect", cls="strip")[0].find("title").text
    assert first == "run 3\nall classes: 0.25%\ntruncated: 0.17%\nschema_invalid: 0.08%"


def test_a_slower_server_is_marked_on_the_latency_plot(browser: str, tmp_path: Path) -> None:
    data = sample_report(drift=False)
    for run in data["runs"]:
        run["latency_s"] = {"p50": 0.3, "p90": 0.42}
    data["runs"][-1]["latency_s"] = {"p50": 1.03, "p90": 1.44}
    data["drift"] = [
        {
            "run_id": 8,
            "field": "(run)",
            "measure": "latency_p50",
            "before": 0.3,
            "now": 1.03,
            "threshold": 0.15,
            "change": "worse",
            "fails": True,
        }
    ]
    dom = open_page(tmp_path, data)
    assert dom.find(id="drift").find("li").text == "run latency_p50 0.30 → 1.03 (worse; threshold ±0.15)"
    chart = dom.find("svg", data_plot="latency")
    assert [group.attrs["data-series"] for group in chart.find_all("g", cls="drifted")] == ["p50"]
    (marked,) = chart.find_all("circle", cls="drift-point")
    assert marked.find("title").text == f"p50, run {LAST_RUN}: 1.03 (drift)"
    (cell,) = dom.find("table", id="runs").find_all("td", cls="drifted")
    assert (cell.attrs["data-measure"], cell.text) == ("latency_p50", "1.03")


def test_a_run_not_judged_says_why_and_is_no_drift(browser: str, tmp_path: Path) -> None:
    data = sample_report(drift=False)
    message = (
        "not judged: run 8 retried earlier failures (1 of its 1 record, against the usual 1,225 new ones); "
        "a retry is not a sample of the usual input"
    )
    data["not_judged"] = {"run_id": 8, "reason": "retried", "records": 1, "usual": 1225.0, "retried": 1}
    data["not_judged"]["message"] = message
    data["runs"][-1].update(records=1, failed=0, retried=1)
    dom = open_page(tmp_path, data)
    assert dom.find(id="drift-title").text == "Run 8, the latest: not judged"
    assert dom.find(id="not-judged").text == message
    assert "hidden" in dom.find(id="no-drift").attrs and "hidden" in dom.find(id="drift").attrs
    assert [cell.text for cell in dom.find("tr", data_measure="retried").find_all("td")][-2:] == ["0", "1"]


def test_an_improvement_is_listed_as_better_and_marks_nothing(browser: str, tmp_path: Path) -> None:
    """Issue 29: records/min up 9x was shown, and mailed, as a drift."""
    data = sample_report(drift=False)
    faster = {"run_id": 8, "field": "(run)", "measure": "records_per_min", "before": 64.2, "now": 580.0}
    data["drift"] = [{**faster, "threshold": 21.4, "change": "better", "fails": False, "baseline": []}]
    data["fails"] = False
    dom = open_page(tmp_path, data)
    (item,) = dom.find(id="drift").find_all("li")
    assert (item.attrs.get("class"), item.attrs["data-change"]) == ("better", "better")
    assert item.text == "run records_per_min 64.2 → 580 (better; threshold ±21.4)"
    assert dom.find(id="drift-title").text == "Run 8, the latest: better than usual"
    assert "has-drift" not in (dom.find(id="drift-section").attrs.get("class") or "")
    assert dom.find("table", id="runs").find_all("td", cls="drifted") == []  # nothing to act on is marked


def test_a_quiet_night_is_the_latest_run_not_judged(browser: str, tmp_path: Path) -> None:
    data = sample_report(drift=False)
    message = (
        "not judged: run 9 (2026-11-26 02:00 UTC) had nothing to do; only the newest run is judged, so what "
        "the runs before it drifted is not said again"
    )
    data["not_judged"] = {"run_id": 9, "reason": "nothing_to_do", "records": 0, "usual": 1225.0, "retried": 0}
    data["not_judged"]["message"] = message
    data.update(judged=None, baseline=[], against=None)
    dom = open_page(tmp_path, data)
    assert dom.find(id="drift-title").text == "Run 9, the latest: not judged"
    assert dom.find(id="not-judged").text == message
    assert all("hidden" in dom.find(id=name).attrs for name in ("drift", "no-drift", "against"))
    head = dom.find("table", id="runs").find("thead").text
    assert "run 8" in head and "run 9" not in head  # it has no column of its own


def test_many_runs_scroll_sideways_with_the_latest_in_view(browser: str, tmp_path: Path) -> None:
    """Issue 22: the table was cut off at run 6. The page opens scrolled to the latest run and says
    which runs are to the left (the note is drawn from the table's layout in the browser)."""
    dom = open_page(tmp_path, sample_report(runs=14))
    note = dom.find(id="table-note")
    assert "hidden" not in note.attrs
    match = re.fullmatch(r"Runs 3 to (\d+) are to the left: scroll the table sideways\.", note.text)
    assert match is not None and 3 < int(match.group(1)) < 16  # some to the left, the latest (16) in view
    assert "hidden" in open_page(tmp_path, sample_report(runs=2)).find(id="table-note").attrs


def test_run_level_drift_marks_its_table_cell_and_its_plot_line(browser: str, tmp_path: Path) -> None:
    data = sample_report(drift=False)
    data["drift"] = [
        {
            "run_id": 8,
            "field": "(run)",
            "measure": "tokens_prompt",
            "before": 1510,
            "now": 2400,
            "threshold": 40,
        }
    ]
    dom = open_page(tmp_path, data)
    # Without a "change" (data of an earlier version), the way is up or down.
    assert dom.find(id="drift").find("li").text == "run tokens_prompt 1,510 → 2,400 (up; threshold ±40.0)"
    (drifted,) = dom.find("table", id="runs").find_all("td", cls="drifted")
    assert (drifted.attrs["data-run"], drifted.attrs["data-measure"]) == (LAST_RUN, "tokens_prompt")
    tokens = dom.find("svg", data_plot="tokens")
    assert [group.attrs["data-series"] for group in tokens.find_all("g", cls="drifted")] == ["prompt"]
    assert dom.find("svg", data_plot="fill_rate").find_all("g", cls="drifted") == []


def test_drift_of_a_measure_without_a_row_marks_the_nearest_cell(browser: str, tmp_path: Path) -> None:
    data = sample_report(drift=False)
    data["drift"] = [
        {
            "run_id": 8,
            "field": "(run)",
            "measure": "failure_rate[truncated]",
            "before": 0.002,
            "now": 0.03,
            "threshold": 0.004,
            "change": "worse",
            "fails": True,
        },
        {
            "run_id": 8,
            "field": "seniority",
            "measure": "share[senior]",
            "before": 0.4,
            "now": 0.1,
            "threshold": 0.05,
        },
    ]
    dom = open_page(tmp_path, data)
    assert [item.text for item in dom.find(id="drift").find_all("li")] == [
        "run failure_rate[truncated] 0.20% → 3.00% (worse; threshold ±0.40%)",
        "seniority share[senior] 0.40 → 0.10 (down; threshold ±0.05)",
    ]
    table = dom.find("table", id="runs")
    assert table.find_all("td", cls="drifted") == []
    failures, seniority = table.find_all("td", cls="drifted-other")
    assert (failures.attrs["data-run"], failures.attrs["data-measure"]) == (LAST_RUN, "failures")
    assert (
        failures.attrs["title"] == "drift in failure_rate[truncated]: 0.20% → 3.00% (worse; threshold ±0.40%)"
    )
    assert (seniority.attrs["data-field"], seniority.attrs["data-measure"]) == ("seniority", "fill_rate")
    assert "drifted" in table.find("tr", data_field="seniority", data_measure="fill_rate").find("th").classes


def test_without_a_series_the_time_plots_say_no_data(browser: str, tmp_path: Path) -> None:
    dom = open_page(tmp_path, sample_report(drift=False, series_points=None))
    assert figure_names(dom) == [*RUN_PLOTS, *TIME_PLOTS]  # no limits plot at all
    for name in TIME_PLOTS:
        figure = dom.find("figure", data_figure=name)
        assert figure.find("p", cls="no-data").text.startswith("no data") and figure.find_all("svg") == []
    assert dom.find(id="over-time-title").text == "The last run over time"
    assert "hidden" in dom.find(id="drift").attrs
    assert (
        dom.find(id="no-drift").text
        == "No drift: every measure stayed within its usual run-to-run variation."
    )


def test_without_limits_there_is_no_limits_plot(browser: str, tmp_path: Path) -> None:
    dom = open_page(tmp_path, sample_report(endpoints=()))
    assert figure_names(dom) == [*RUN_PLOTS, *TIME_PLOTS]
    assert lines(dom, "in_flight") == {"in flight": 50}
    assert dom.find(id="over-time-title").text == f"Run {LAST_RUN} over time"


def test_a_single_run_renders(browser: str, tmp_path: Path) -> None:
    dom = open_page(tmp_path, sample_report(runs=1, drift=False, series_points=1))
    assert dom.find(id="summary").find("div", data_fact="runs").find("dd").text == "1 (run 3)"
    assert lines(dom, "fill_rate") == dict.fromkeys(FIELDS, 1)
    assert len(dom.find("svg", data_plot="tokens").find_all("circle", cls="point")) == 3
    # One sample: no line to draw, so each endpoint's limit shows as a point.
    assert len(dom.find("svg", data_plot="limits").find_all("circle", cls="point")) == 2
    assert dom.find(id="no-drift").text == "No drift: one run alone has nothing to be compared with."
    assert len(dom.find("tr", data_measure="records").find_all("td")) == 1


def test_fields_missing_in_old_runs_and_null_numbers_leave_gaps(browser: str, tmp_path: Path) -> None:
    data = sample_report(drift=False)
    del data["runs"][0]["fields"]["salary"]
    data["runs"][1]["fields"]["salary"]["fill_rate"] = None
    data["runs"][2]["tokens_per_record"] = None
    dom = open_page(tmp_path, data)
    assert lines(dom, "fill_rate")["salary"] == 4 and lines(dom, "tokens")["prompt"] == 5
    assert dom.find("td", data_run="3", data_field="salary", data_measure="fill_rate").text == "—"
    assert dom.find("td", data_run="5", data_measure="tokens_prompt").text == "—"


def test_hostile_text_renders_as_text_and_injects_nothing(browser: str, tmp_path: Path) -> None:
    dom = open_page(tmp_path, hostile_report())
    scripts = dom.find_all("script")
    assert [script.attrs for script in scripts] == [{"type": "application/json", "id": "report-data"}, {}]
    assert dom.find("h1").text == f"Runs of job {EVIL} / main"
    assert dom.find("td", data_run=LAST_RUN, data_measure="model").text == EVIL
    title = dom.find("td", data_run=LAST_RUN, data_field="title", data_measure="fill_rate")
    assert f"top: {EVIL} (0.50)" in title.attrs["title"]
    assert lines(dom, "limits") == {EVIL: 3}
    assert dom.find_all("img") == [] and dom.find_all("b") == [] and dom.find_all("link") == []


def test_the_rendered_page_refers_to_no_other_resource(sample_dom: Element) -> None:
    assert [
        element.tag
        for element in sample_dom.iter()
        if {"src", "href", "srcset", "action"} & set(element.attrs)
    ] == []
    policy = sample_dom.find("meta", http_equiv="Content-Security-Policy").attrs["content"]
    assert policy.startswith("default-src 'none';")


def test_the_sample_data_is_not_changed_by_rendering() -> None:
    data = sample_report()
    before = copy.deepcopy(data)
    render_runs_page(data)
    assert data == before
