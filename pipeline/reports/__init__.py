"""Reading a job's database: ``pipeline status``, ``failures`` and ``export``, and for the quality
commands ``pipeline eval`` (a variant against a gold file), ``pipeline compare`` (two variants) and
``pipeline review`` (the HTML review page), and the self-contained HTML pages. The measuring is
:mod:`pipeline.quality`'s; this package reads the database for it, read-only and filtered in SQL,
through the DuckDB boundary.

* :mod:`~pipeline.reports.status`, :mod:`~pipeline.reports.failures`, :mod:`~pipeline.reports.export`:
  the operational reads;
* :mod:`~pipeline.reports.reading`: the queries (results, failures, record texts) and their scopes;
* :mod:`~pipeline.reports.variants`: which variants a job has (a reader's ``--variant`` is checked against
  them) and the command-line options a variant's last run was given;
* :mod:`~pipeline.reports.evaluation`: ``eval``; :mod:`~pipeline.reports.paired_evaluation`: ``eval
  --variants A,B`` (the paired difference and its verdict);
* :mod:`~pipeline.reports.judged_evaluation`: ``eval --judged`` (precision and recall from judged values,
  a model judge calibrated by people); :mod:`~pipeline.reports.judged_report`: what it reports;
* :mod:`~pipeline.reports.comparison`: ``compare``; :mod:`~pipeline.reports.noise`: its noise floor;
* :mod:`~pipeline.reports.review`: the review page of one or two variants, read;
  :mod:`~pipeline.reports.review_page`: the page itself (its data, the HTML, ``review_page.html``);
* :mod:`~pipeline.reports.html_page`: what every self-contained page shares (embedded data, the
  Content-Security-Policy, the atomic write; the judging page's server uses it too);
* :mod:`~pipeline.reports.pages`: each page (review, compare, report) read, built and written in one call;
* :mod:`~pipeline.reports.runs_report`, :mod:`~pipeline.reports.runs_page`: ``pipeline report``, a
  job's runs side by side with their drift, and its HTML page;
* :mod:`~pipeline.reports.shared`: grounded shares and how values are shown;
* :mod:`~pipeline.reports.flatten`: the columns of ``export --flatten``, one per schema field.

May import: :mod:`pipeline.store`, :mod:`pipeline.extraction` (what a prompt carries),
:mod:`pipeline.source`, :mod:`pipeline.job`, :mod:`pipeline.servers` (a server's cache counters, for
status), :mod:`pipeline.quality`, :mod:`pipeline.errors`.
"""

from __future__ import annotations

from pipeline.defaults import DEFAULT_REVIEW_SAMPLE, DEFAULT_SHOWN
from pipeline.reports.comparison import (
    CompareReport,
    CompareSettings,
    VariantSummary,
    compare_variants,
    format_compare,
    parse_variants,
)
from pipeline.reports.evaluation import EvalReport, EvalSettings, evaluate, format_eval, parse_fields
from pipeline.reports.judged_evaluation import JudgedSettings, evaluate_judged, evaluate_judged_pair
from pipeline.reports.judged_report import (
    JudgedEvalReport,
    PairedJudgedReport,
    format_judged_eval,
    format_paired_judged,
)
from pipeline.reports.noise import NoiseReport, noise_floor_hint
from pipeline.reports.pages import compare_page, review_page, runs_page
from pipeline.reports.paired_evaluation import PairedEvalReport, evaluate_pair, format_paired_eval
from pipeline.reports.reading import JobOutput, Sample, Scope, StoredFailure, StoredResult, open_output
from pipeline.reports.review import read_review
from pipeline.reports.shared import GroundingShare, GroundingSummary

__all__ = [
    "DEFAULT_REVIEW_SAMPLE",
    "DEFAULT_SHOWN",
    "CompareReport",
    "CompareSettings",
    "EvalReport",
    "EvalSettings",
    "GroundingShare",
    "GroundingSummary",
    "JobOutput",
    "JudgedEvalReport",
    "JudgedSettings",
    "NoiseReport",
    "PairedEvalReport",
    "PairedJudgedReport",
    "Sample",
    "Scope",
    "StoredFailure",
    "StoredResult",
    "VariantSummary",
    "compare_page",
    "compare_variants",
    "evaluate",
    "evaluate_judged",
    "evaluate_judged_pair",
    "evaluate_pair",
    "format_compare",
    "format_eval",
    "format_judged_eval",
    "format_paired_eval",
    "format_paired_judged",
    "noise_floor_hint",
    "open_output",
    "parse_fields",
    "parse_variants",
    "read_review",
    "review_page",
    "runs_page",
]
