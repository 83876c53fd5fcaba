"""Tests mirror the packages: pipeline/<package>/<module>.py has tests/<package>/test_<module>.py, or is
listed in TESTED_ELSEWHERE with the test files that test it. So what docs/architecture.md says stays
true as modules come and go: a new module needs its own test file or a line here saying where it is
tested. And every inline lint ignore names its rule and says why (ruff's RUF100 and mypy's
warn_unused_ignores fail one that is not needed)."""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

import pytest

from tests.support.processes import REPO

# Module (under pipeline/) -> the test files that test it, and how: mostly parts tested through the
# command or the module that uses them, or data types every test of their package builds.
TESTED_ELSEWHERE: dict[str, str] = {
    "bench/job.py": "tests/bench/test_bench.py: bench --job's requests are the job's own",
    "bench/load.py": "tests/bench/test_bench.py: one level of the sweep, through run_sweep",
    "bench/report.py": "tests/bench/test_bench.py: the sweep's table, knee, diagnostics and files",
    "bench/seed.py": "tests/bench/test_knee_memory.py: bench --job --seed-knee and the next auto run",
    "cli/load.py": "tests/cli/test_cli.py, tests/cli/test_bad_input.py: `pipeline load` as a user runs it",
    "cli/logs.py": "tests/run/test_progress.py: the JSON and the console log lines",
    "cli/results.py": (
        "tests/reports/test_failures.py, tests/reports/test_export.py, tests/reports/test_runs_report.py: "
        "the failures, export and report commands"
    ),
    "cli/servers.py": "tests/bench/test_bench.py: `pipeline bench` through the CLI",
    "extraction/outcomes.py": "tests/extraction/test_extractor.py: the outcome each record ends in",
    "job/examples.py": "tests/job/test_variants.py: few-shot examples, checked when the job loads",
    "job/judge.py": "tests/job/test_judge_section.py: the job's judge: section",
    "job/text.py": (
        "tests/job/test_spec.py, tests/job/test_variants.py, tests/cli/test_bad_input.py: a job file's "
        "interpolation and its errors in one line"
    ),
    "local/convert.py": "tests/local/test_local.py: the GGUF file turned into a vLLM folder",
    "local/model.py": "tests/local/test_local.py: the bundled model, found and converted once",
    "local/server.py": "tests/local/test_local.py: start, health and stop, with stand-in server processes",
    "quality/intervals.py": "tests/quality/test_bootstrap.py: the intervals and paired differences",
    "quality/matching.py": "tests/quality/test_agreement.py: matching, through the agreement metrics",
    "quality/normalize.py": "tests/quality/test_agreement.py, tests/quality/test_grounding.py: normalising",
    "quality/scores.py": "tests/quality/test_agreement.py: what an agreement measurement reports",
    "reports/comparison.py": "tests/reports/test_reports.py: compare",
    "reports/evaluation.py": "tests/reports/test_reports.py: eval against a gold file",
    "reports/flatten.py": "tests/reports/test_export.py: export --flatten",
    "reports/judged_report.py": "tests/reports/test_judged_evaluation.py: eval --judged",
    "reports/noise.py": "tests/cli/test_quality.py: compare with a re-run (the noise floor)",
    "reports/pages.py": "tests/reports/test_review_page.py, tests/reports/test_runs_page.py: the pages",
    "reports/paired_evaluation.py": "tests/reports/test_reports.py, tests/cli/test_quality.py: eval A,B",
    "reports/reading.py": "tests/reports/test_reports.py: reading results, failures and texts",
    "reports/review.py": "tests/reports/test_review_page.py: the review page's data",
    "reports/shared.py": "tests/cli/test_quality.py: the grounded share lines of eval and compare",
    "run/check_lines.py": "tests/run/test_check.py: the lines of pipeline check",
    "run/extractors.py": "tests/run/test_runner.py: the retry policy, through runs",
    "run/notices.py": "tests/source/test_staleness.py, tests/run/test_runner.py: stale kept, short timeout",
    "run/preflight.py": "tests/run/test_check.py: the preflight, beside pipeline check",
    "run/stats.py": "tests/run/test_progress.py, tests/run/test_prometheus.py: the live counters",
    "servers/beside_others.py": "tests/servers/test_sharing.py: a share cut, followed up, released",
    "servers/config.py": "tests/job/test_spec.py: endpoint settings, validated with the job",
    "servers/lookup.py": "tests/servers/test_client.py: a name lookup that never answers",
    "servers/replies.py": "tests/extraction/test_parse.py: reading what a server answers",
    "servers/scrape.py": "tests/sim/test_metrics.py, tests/servers/test_capacity.py: reading /metrics",
    "sim/http.py": "tests/sim/test_sim.py: the simulator's HTTP server",
    "sim/profiles.py": "tests/sim/test_engine.py: the profiles' curves",
    "sim/server.py": "tests/sim/test_sim.py: the simulator end to end",
    "source/relation.py": "tests/source/test_reader.py: the job's source and its ids",
    "store/snapshot.py": "tests/reports/test_status.py, tests/run/test_progress.py: the progress snapshot",
    "store/tables.py": "tests/store/test_migration.py: the output tables and their upgrade",
}


def modules_without_their_own_test_file() -> set[str]:
    return {
        module.relative_to(REPO / "pipeline").as_posix()
        for module in (REPO / "pipeline").glob("*/*.py")
        if module.name != "__init__.py"
        and not (REPO / "tests" / module.parent.name / f"test_{module.name}").exists()
    }


def test_every_module_has_its_test_file_or_says_where_it_is_tested() -> None:
    missing = modules_without_their_own_test_file()
    unlisted = sorted(missing - TESTED_ELSEWHERE.keys())
    stale = sorted(TESTED_ELSEWHERE.keys() - missing)
    assert not unlisted, (
        f"no tests/<package>/test_<module>.py for {unlisted}: write it, or add the module to "
        "TESTED_ELSEWHERE with the test files that test it"
    )
    assert not stale, f"{stale} have their own test file now (or are gone): take them out of TESTED_ELSEWHERE"


def test_the_test_files_named_exist() -> None:
    for module, where in TESTED_ELSEWHERE.items():
        named = re.findall(r"tests/[\w/]+\.py", where)
        assert named, f"{module}: no test file named in {where!r}"
        assert all(Path(REPO / path).is_file() for path in named), f"{module}: {where!r}"


# ---- inline lint ignores: each names its rule and says why, as structlog's do

_NOQA = re.compile(r"#\s*noqa\b(?P<after>.*)", re.IGNORECASE)
_TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<after>.*)")
_NOQA_CODES = re.compile(r":\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*(?P<why>.*)")
_TYPE_CODES = re.compile(r"\[[a-z-]+(?:\s*,\s*[a-z-]+)*\](?P<why>.*)")
_CHECKED = ("pipeline", "tests", "benchmarks", "schemas")


def ignore_problem(comment: str) -> str | None:
    """What is wrong with the inline ignore in ``comment`` (None: nothing, or no ignore there). The
    reason follows the code, in parentheses or as a comment: ``# noqa: F401  (why)``,
    ``# type: ignore[misc]  # why``."""
    for pattern, codes, form in (
        (_NOQA, _NOQA_CODES, "# noqa: CODE  (why)"),
        (_TYPE_IGNORE, _TYPE_CODES, "# type: ignore[code]  # why"),
    ):
        found = pattern.search(comment)
        if found is None:
            continue
        coded = codes.match(found["after"])
        if coded is None:
            return f"no rule code: write {form}"
        if len(re.findall(r"[A-Za-z]{2,}", coded["why"])) < 2:
            return f"no reason after the code: write {form}"
    return None


def inline_ignores() -> list[tuple[str, str]]:
    """(file:line, comment) of every comment of the checked folders that holds an inline ignore."""
    found = []
    for folder in _CHECKED:
        for path in sorted((REPO / folder).rglob("*.py")):
            with tokenize.open(path) as source:
                for token in tokenize.generate_tokens(source.readline):
                    if token.type == tokenize.COMMENT and (
                        _NOQA.search(token.string) or _TYPE_IGNORE.search(token.string)
                    ):
                        where = f"{path.relative_to(REPO).as_posix()}:{token.start[0]}"
                        found.append((where, token.string))
    return found


@pytest.mark.parametrize(
    ("comment", "problem"),
    [
        ("# noqa: F401  (importing it registers its commands)", None),
        ("# type: ignore[misc]  # curator is loaded at run time", None),
        ("# type: ignore[arg-type, misc]  # two codes, one reason", None),
        ("# the order of --help", None),
        ("# noqa", "no rule code: write # noqa: CODE  (why)"),
        ("# noqa: E501", "no reason after the code: write # noqa: CODE  (why)"),
        ("# type: ignore", "no rule code: write # type: ignore[code]  # why"),
        ("# type: ignore[index]", "no reason after the code: write # type: ignore[code]  # why"),
        ("# why first  # type: ignore[index]", "no reason after the code: write # type: ignore[code]  # why"),
    ],
)
def test_an_ignore_is_judged_by_its_code_and_reason(comment: str, problem: str | None) -> None:
    assert ignore_problem(comment) == problem


def test_every_inline_ignore_names_its_rule_and_says_why() -> None:
    ignores = inline_ignores()
    assert any(where.startswith("pipeline/cli/__init__.py:") for where, _ in ignores)  # the scan sees them
    wrong = [f"{where}: {problem}" for where, comment in ignores if (problem := ignore_problem(comment))]
    assert not wrong, "\n".join(wrong)
