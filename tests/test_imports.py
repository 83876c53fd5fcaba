"""What importing a module loads: each check in a fresh interpreter, so that nothing an earlier import
(or this test run) loaded hides a chain that pulls in a heavy dependency again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import subprocess_env

pytestmark = pytest.mark.process

HEAVY = (
    "duckdb",
    "rapidfuzz",
    "openai",
    "aiohttp",
    "httpx2",
    "pydantic",
    "rich",
    "prometheus_client",
    "numpy",
)
PRINT_LOADED = (
    "import sys\nbefore = set(sys.modules)\n{code}\n"
    "print(' '.join(sorted({{name.split('.')[0] for name in set(sys.modules) - before}})))"
)
#: ``pipeline ARGS`` run in this interpreter, its output on stderr (stdout is the probe's).
RUN_CLI = (
    "import contextlib\n"
    "sys.argv = ['pipeline', *{args!r}]\n"
    "from pipeline.cli import main\n"
    "with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):\n"
    "    main()"
)


def probe(code: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter that runs ``code`` and prints the top-level packages it loaded."""
    return subprocess.run(
        [sys.executable, "-c", PRINT_LOADED.format(code=code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
        check=True,
    )


def loaded_by(code: str) -> set[str]:
    """The top-level packages a fresh interpreter loads to run ``code``."""
    return set(probe(code).stdout.split())


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("pipeline", ()),  # the public names are imported when first used
        ("pipeline.errors", ()),  # every module imports it: pydantic only for a type
        ("pipeline.defaults", ()),  # what --help shows, without what takes it
        ("pipeline.source.db", ("duckdb",)),  # no job spec, grounding or merging on the way
        ("pipeline.job.spec", ("pydantic",)),  # the merge rules' names, not the merging (rapidfuzz)
        ("pipeline.extraction.outcomes", ()),  # Reply from servers.replies; no source reader (DuckDB)
        ("pipeline.cli", ()),  # each command imports what it needs when it runs
    ],
)
def test_a_module_loads_only_the_heavy_packages_it_uses(module: str, allowed: tuple[str, ...]) -> None:
    loaded = loaded_by(f"import {module}")
    assert "pipeline" in loaded  # the probe saw the import happen
    assert sorted(loaded & set(HEAVY)) == sorted(allowed)


@pytest.mark.parametrize(
    ("args", "usage", "allowed"),
    [
        # typer's own: rich draws the help; to parse a command's options it coerces them with pydantic
        (["--help"], "Usage: pipeline [OPTIONS] COMMAND", ("rich",)),
        (["status", "--help"], "Usage: pipeline status [OPTIONS]", ("pydantic", "rich")),
        (["run", "--help"], "Usage: pipeline run [OPTIONS]", ("pydantic", "rich")),
    ],
)
def test_help_loads_no_http_client_database_or_matching(
    args: list[str], usage: str, allowed: tuple[str, ...]
) -> None:
    done = probe(RUN_CLI.format(args=args))
    assert usage in done.stderr  # the help was printed
    assert sorted(set(done.stdout.split()) & set(HEAVY)) == sorted(allowed)


def test_a_public_name_is_imported_on_first_use() -> None:
    assert {"duckdb", "openai", "rapidfuzz"} <= loaded_by("from pipeline import run_job")
