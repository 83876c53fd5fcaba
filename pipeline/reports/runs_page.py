"""The runs page of ``pipeline report JOB --html PATH``: a nightly job's runs side by side, with plots.

``render_runs_page`` turns the report's data (the same JSON-ready dict ``pipeline report --json``
prints) into one self-contained HTML document; ``write_runs_page`` writes it atomically. The page is
the template ``runs_page.html`` (markup, one style, one script) plus the data as JSON in
``<script type="application/json" id="report-data">``; the page's script draws everything in the
browser, with DOM calls and ``textContent`` only: the drift list, each entry with the way it moved
(improvements listed apart and not marked on the plots), the runs it was judged against (or why the
newest run was not judged),
inline SVG plots (over runs: fill rate and grounded share per field, tokens per record, latency p50 and
p90, records per minute, the failure rate overall and per class, the servers' prefix-cache hit rate;
over the last run: records per minute, requests in flight, the prefix-cache hit rate and endpoint
limits; the hit rate only where a server's /metrics said it) and the runs as table columns, in a box
that scrolls sideways, opened on the latest run, with a note naming the runs out of view.

Embedding, the Content-Security-Policy and the atomic write are :mod:`pipeline.reports.html_page`'s,
shared with the review page: no data can end its script element, and the page loads nothing.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.reports.html_page import finite_numbers, render_page, write_page

TEMPLATE = importlib.resources.files("pipeline.reports").joinpath("runs_page.html")
_DATA_MARKER = "__REPORT_DATA__"
# What the page's script cannot do without; anything else it reads may be missing or null.
_REQUIRED = {"job": str, "variant": str, "generated_at": str, "rule": str, "runs": list, "drift": list}


def render_runs_page(data: Mapping[str, Any]) -> str:
    """The whole HTML document for the report ``data``: no external resource, drawn by the page itself."""
    return render_page(_template(), page_data(data), _DATA_MARKER, name=TEMPLATE.name)


def write_runs_page(data: Mapping[str, Any], path: Path) -> Path:
    """Write the page to ``path`` atomically (a temporary file beside it, then a rename); return ``path``."""
    return write_page(render_runs_page(data), path, "the report page")


def page_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as the page's script reads it: checked for the keys it needs, non-finite numbers null.

    A malformed report fails here, with the key named, rather than as a blank page in the browser.
    """
    for key, kind in _REQUIRED.items():
        if not isinstance(data.get(key), kind):
            raise ValueError(f"report data: {key!r} must be a {kind.__name__}, not {data.get(key)!r:.60}")
    for run in data["runs"]:
        if not isinstance(run, Mapping) or "run_id" not in run:
            raise ValueError(f"report data: every run needs a 'run_id', not {run!r:.60}")
    for entry in data["drift"]:
        if not (
            isinstance(entry, Mapping)
            and all(isinstance(entry.get(key), str) for key in ("field", "measure"))
        ):
            raise ValueError(
                f"report data: every drift entry needs a 'field' and a 'measure', not {entry!r:.60}"
            )
    against = data.get("against")
    if against is not None and not isinstance(against, str):
        raise ValueError(f"report data: 'against' must be null or a str, not {against!r:.60}")
    not_judged = data.get("not_judged")
    if not_judged is not None and not (
        isinstance(not_judged, Mapping) and isinstance(not_judged.get("message"), str)
    ):
        raise ValueError(
            f"report data: 'not_judged' must be null or an object with a 'message', not {not_judged!r:.60}"
        )
    series = data.get("series")
    if series is not None and not (
        isinstance(series, Mapping)
        and isinstance(series.get("points"), list)
        and all(isinstance(point, Mapping) for point in series["points"])
    ):
        raise ValueError("report data: 'series' must be null or an object with a list of 'points' (objects)")
    return dict(finite_numbers(data))


@functools.cache
def _template() -> str:
    return TEMPLATE.read_text(encoding="utf-8")
