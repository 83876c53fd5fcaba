"""The Makefile's targets, as a fresh checkout would run them (`make -n`: printed, not run)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.processes import REPO

pytestmark = pytest.mark.process  # `make -n` in a child process


def planned_commands(target: str, folder: Path) -> list[str]:
    """What `make TARGET` would run in a checkout without a .venv."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, folder / name)
    plan = subprocess.run(
        ["make", "-n", target], cwd=folder, capture_output=True, text=True, timeout=60, check=True
    )
    # Under `make test` (CI) this make is a sub-make: it adds "make[1]: Entering/Leaving directory" lines.
    return [line for line in plan.stdout.splitlines() if not line.startswith("make[")]


def installed_extras(commands: list[str]) -> set[str]:
    """The extras of every `pip install -e '.[A,B]'` (nothing for a plain `-e .`)."""
    installs = [command for command in commands if " pip install " in command]
    assert installs, "no install step: a fresh checkout would have no pipeline"
    return {
        extra
        for command in installs
        for extras in re.findall(r"\.\[([^\]]*)\]", command)
        for extra in extras.split(",")
    }


def test_dry_run_installs_the_package_without_the_local_server(tmp_path: Path) -> None:
    """`make dry-run` needs the package and the simulator, not vLLM and CPU PyTorch (minutes, GBs)."""
    commands = planned_commands("dry-run", tmp_path)
    assert "local" not in installed_extras(commands)
    assert not [command for command in commands if "torch" in command or "vllm" in command]


@pytest.mark.parametrize("target", ["run", "test", "check"])
def test_run_and_test_install_the_local_server(tmp_path: Path, target: str) -> None:
    assert {"dev", "local"} <= installed_extras(planned_commands(target, tmp_path))


def test_check_is_the_lint_then_the_tests_that_start_no_process(tmp_path: Path) -> None:
    """The inner loop: everything `make lint` runs, then pytest without the tests marked `process` (a
    marker pytest knows: `-m` with an unknown one would quietly select every test)."""
    commands = planned_commands("check", tmp_path)
    lint = planned_commands("lint", tmp_path)
    (tests,) = [at for at, command in enumerate(commands) if "/pytest " in command]
    assert set(lint) <= set(commands[:tests])
    assert shlex.split(commands[tests])[1:] == ["-m", "not process"]
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("process:") for marker in markers)


@pytest.mark.parametrize(
    ("pythons", "said"),
    [
        ("", "error: PYTHONS is empty: name at least one Python"),
        ("/nonexistent/python3", "error: PYTHONS: /nonexistent/python3 is not a Python that runs here"),
    ],
)
def test_check_pythons_refuses_a_python_it_cannot_run_in_one_line(
    tmp_path: Path, pythons: str, said: str
) -> None:
    """No Python to check is a mistake in the command, not a pass: one line and exit 2, nothing made."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    done = subprocess.run(
        ["make", "--no-print-directory", "check-pythons", f"PYTHONS={pythons}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == said
    assert not (tmp_path / ".venvs").exists()


def test_soak_runs_the_property_tests_from_random_seeds_until_its_time_is_up(tmp_path: Path) -> None:
    """`make soak`: round after round of tests/properties with the soak profile, each from a seed of its
    own that a failure prints, no per-test timeout, and the figures of what ran at the end."""
    planned = " ".join(planned_commands("soak", tmp_path))
    assert "SOAK_S" not in planned and "end=$(( $(date +%s) + 3600 ))" in planned
    assert "HYPOTHESIS_PROFILE=soak .venv/bin/pytest tests/properties" in planned
    assert "--timeout 0" in planned and "--hypothesis-seed=$seed" in planned
    assert "PIPELINE_PROPERTY_LOG=build/soak.jsonl" in planned
    assert ".venv/bin/python -m tests.support.properties build/soak.jsonl" in planned
