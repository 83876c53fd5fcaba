"""What importing a module loads: each check in a fresh interpreter, so that nothing an earlier import
(or this test run) loaded hides a chain that pulls in a heavy dependency again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import subprocess_env

pytestmark = pytest.mark.process

HEAVY = ("duckdb", "rapidfuzz", "openai", "aiohttp", "rich", "prometheus_client", "numpy")
PRINT_LOADED = (
    "import sys; before = set(sys.modules); {code}; "
    "print(' '.join(sorted({{name.split('.')[0] for name in set(sys.modules) - before}})))"
)


def loaded_by(code: str) -> set[str]:
    """The top-level packages a fresh interpreter loads to run ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", PRINT_LOADED.format(code=code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
        check=True,
    )
    return set(done.stdout.split())


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("pipeline", ()),  # the public names are imported when first used
        ("pipeline.source.db", ("duckdb",)),  # no job spec, grounding or merging on the way
        ("pipeline.job.spec", ()),  # the merge rules' names, not the merging (rapidfuzz)
        ("pipeline.extraction.outcomes", ()),  # Reply from servers.replies; no source reader (DuckDB)
    ],
)
def test_a_module_loads_only_the_heavy_packages_it_uses(module: str, allowed: tuple[str, ...]) -> None:
    loaded = loaded_by(f"import {module}")
    assert "pipeline" in loaded  # the probe saw the import happen
    assert sorted(loaded & set(HEAVY)) == sorted(allowed)


def test_a_public_name_is_imported_on_first_use() -> None:
    assert {"duckdb", "openai", "rapidfuzz"} <= loaded_by("from pipeline import run_job")
