"""The HTML pages of a job's database, each one call that reads, builds and writes the page atomically:

* :func:`review_page`: ``pipeline review --html``: one or two variants' records, to check by eye;
* :func:`compare_page`: ``pipeline compare --html``: compare's numbers, then both variants' records
  side by side;
* :func:`runs_page`: ``pipeline report --html``: the last runs side by side, their trends and drift.

Each returns what it read, so that a caller (the CLI) prints from the same reading the page shows.
The pages themselves are :mod:`pipeline.reports.review_page`'s and :mod:`pipeline.reports.runs_page`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from pipeline.defaults import DEFAULT_REVIEW_SAMPLE, DEFAULT_RUNS
from pipeline.job.spec import JobSpec
from pipeline.reports.comparison import CompareReport, CompareSettings, compare_variants
from pipeline.reports.reading import Sample
from pipeline.reports.review import read_review
from pipeline.reports.review_page import ReviewPage, write_review
from pipeline.reports.runs_page import write_runs_page
from pipeline.reports.runs_report import RunsReport, runs_report

# Defaults as module values: dataclass instances, frozen, built once.
DEFAULT_SAMPLE = Sample(DEFAULT_REVIEW_SAMPLE)  # the review's sample: 100 records, seed 0
_COMPARE_SETTINGS = CompareSettings()


def review_page(
    spec: JobSpec,
    path: str | Path,
    variants: Sequence[str] | None = None,
    sample: Sample = DEFAULT_SAMPLE,
) -> ReviewPage:
    """Write the review page of ``variants`` (one or two; default: the spec's own) over the records of
    ``sample`` they have a result or a failure for, to ``path``; return the page. Raises
    :class:`ConfigError` for a variant with neither, or a path it cannot write."""
    page = read_review(spec, tuple(variants or (spec.variant,)), sample)
    write_review(page, Path(path))
    return page


def compare_page(
    spec: JobSpec,
    path: str | Path,
    reference: str,
    candidate: str,
    settings: CompareSettings = _COMPARE_SETTINGS,
) -> CompareReport:
    """Compare ``candidate`` with ``reference`` (:func:`compare_variants`) and write the page to
    ``path``: the comparison's numbers, then both variants' records side by side; return the report
    (its ``review`` is the page)."""
    report = compare_variants(spec, reference, candidate, dataclasses.replace(settings, review=True))
    if report.review is None:  # review=True always builds it
        raise RuntimeError("compare_variants built no page with review=True")
    write_review(report.review, Path(path))
    return report


def runs_page(spec: JobSpec, path: str | Path, runs: int = DEFAULT_RUNS) -> RunsReport:
    """Write the report page of the last ``runs`` runs (:func:`runs_report`) to ``path``; return the
    report."""
    report = runs_report(spec, runs)
    write_runs_page(report.to_json(), Path(path))
    return report
