"""The README's "## Commands" block, run as a new user runs it, so the docs cannot drift from the code.

Every command of the block runs, in the block's order, through bash (brace expansion, `&&` and comments
as a user's shell has them) in one fresh copy of the project's tracked jobs/, schemas/ and data/, with
../shared/datasets beside it as in this checkout: each line finds what the lines before it made. PATH
starts with a folder holding `pipeline` and `python` of the interpreter running the tests, as with the
environment activated. A line fails its test, with the line and its stderr, when its exit code is not
0 (or the one EXPECTED_EXIT gives it), or a file it names with --html / --out is not there after it.

The server is the block's own `pipeline sim --profile gpt-oss-120b` line, started first and up for the
whole block, as a user's server is up while they type the rest: its test checks that it serves the model
the jobs ask for. The jobs' default endpoint (127.0.0.1:8000) reaches it through PIPELINE_BASE_URL, the
override the README documents. What the test runs differently from the README is all in SUBSTITUTIONS.
Each test runs the lines before its own first if they have not run, so one line can be run alone (-k).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from tests.support.processes import REPO, sim_server, subprocess_env

pytestmark = pytest.mark.integration

DATASETS = REPO.parent / "shared" / "datasets"
SIM_LINE = re.compile(r"^pipeline sim\b")

# (README text, what runs instead, why): regular expressions, applied to every command in this order.
# {sim} is the simulator's URL, {model} the model the jobs ask for.
SUBSTITUTIONS: list[tuple[str, str, str]] = [
    (r" --port 8000\b", "", "the simulator on a free port (8000 may be taken): its URL is {sim}"),
    (r"http://gpu-box:8000/v1", "{sim}", "the simulator stands in for the GPU server"),
    (
        r"^pipeline run (.*) --local\b",
        r"pipeline run \1 --endpoint {sim}",
        "the bundled vLLM server takes minutes on 2 cores (tests/integration/test_local_vllm.py starts it "
        "for real, marker local_vllm): the simulator stands in",
    ),
    (
        r"^pipeline bench --local\b",
        "pipeline bench --endpoint {sim} --model {model}",
        "the same: the simulator stands in for the bundled vLLM server",
    ),
    (
        r"^pipeline serve-local\b.*",
        "pipeline serve-local --help",
        "it only starts the bundled vLLM server (minutes) and waits for Ctrl-C: the command is checked "
        "to exist, no more",
    ),
    (
        r"^pipeline judge (?!.*--(?:by-|judge-)?model)([^#]*?)(\s*#.*)?$",
        r"timeout --preserve-status --signal INT 20 pipeline judge \1 --port 0\2",
        "the judging page serves until Ctrl-C: it is started (its sample read, its URL printed) and "
        "stopped with Ctrl-C, which must end it with exit 0 (tests/judging/test_page.py drives it in a "
        "browser)",
    ),
    (
        r"^pipeline bench\b",
        "pipeline bench --rounds 1 --no-warmup",
        "one round per level, not three, and no warm-up request: seconds, not a minute",
    ),
]

# A line that fails for a reason another part of an open issue is fixing: pytest.mark.xfail(strict=True)
# naming the point, lifted (strict: it fails once the line works) when the fix lands. None today.
EXPECTED_FAILURES: dict[str, str] = {}

# A line whose documented exit code is not 0.
EXPECTED_EXIT: dict[str, int] = {}


def commands_block(readme: str) -> list[str]:
    """The commands of the first bash block under "## Commands": continuation lines joined, blank and
    comment-only lines left out (a comment after a command stays: bash ignores it)."""
    section = readme.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```bash\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert match is not None, 'no ```bash block under "## Commands" in README.md'
    joined = re.sub(r"\\\n\s*", "", match.group(1))
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def command_only(line: str) -> str:
    """The line without its trailing comment (` # ...`; the block has no # inside quotes)."""
    return re.sub(r"\s+#\s.*$", "", line)


def substituted(line: str, sim_url: str, model: str) -> str:
    command = line
    for pattern, replacement, _ in SUBSTITUTIONS:
        command = re.sub(pattern, replacement.format(sim=sim_url, model=model), command)
    return command


def named_outputs(line: str) -> list[str]:
    """The files a line says it writes (--html PATH, --out PATH)."""
    words = shlex.split(line, comments=True)
    return [words[at + 1] for at, word in enumerate(words[:-1]) if word in ("--html", "--out")]


LINES = commands_block((REPO / "README.md").read_text())


def _case(index: int, line: str) -> Any:
    name = f"{index:02d}-" + re.sub(r"[^\w.,=/-]+", "_", command_only(line).removeprefix("pipeline "))[:60]
    reason = EXPECTED_FAILURES.get(command_only(line))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(index, id=name, marks=marks)


@dataclass
class Block:
    """The block being run: its folder, the server and what each line did so far."""

    folder: Path
    sim_url: str
    env: dict[str, str]
    model: str
    ran: dict[int, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def through(self, index: int) -> subprocess.CompletedProcess[str]:
        """Line ``index``'s outcome, running it (and every earlier line not run yet) first."""
        for earlier in range(index + 1):
            if earlier not in self.ran:
                self.ran[earlier] = self._run(LINES[earlier])
        return self.ran[index]

    def _run(self, line: str) -> subprocess.CompletedProcess[str]:
        if SIM_LINE.match(line):  # started before every line, by the fixture
            return subprocess.CompletedProcess(line, 0, "", "")
        command = substituted(command_only(line), self.sim_url, self.model)
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture(scope="module")
def block(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Block]:
    if not DATASETS.is_dir():
        pytest.skip(f"the block reads {DATASETS}, which is not here")
    (sim_line,) = [line for line in LINES if SIM_LINE.match(line)]
    root = tmp_path_factory.mktemp("readme")
    folder = fresh_copy(root)
    bin_folder = root / "bin"
    bin_folder.mkdir()
    for name, run in (("pipeline", "-m pipeline "), ("python", "")):  # scripts: a symlink leaves the venv
        (bin_folder / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {run}"$@"\n')
        (bin_folder / name).chmod(0o755)
    model = jobs_model(folder)
    with sim_server(*shlex.split(substituted(command_only(sim_line), "", model))[2:]) as sim_url:
        env = subprocess_env(PATH=f"{bin_folder}{os.pathsep}{os.environ['PATH']}")
        env["PIPELINE_BASE_URL"] = sim_url  # the jobs' endpoint (subprocess_env drops the caller's)
        yield Block(folder, sim_url, env, model)


def fresh_copy(root: Path) -> Path:
    """The project's tracked jobs/, schemas/ and data/ (nothing a local run left), ../shared beside."""
    folder = root / "main"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", "jobs", "schemas", "data"],
        cwd=REPO,
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, tracked):
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPO / name).read_bytes())
    (root / "shared").mkdir()
    (root / "shared" / "datasets").symlink_to(DATASETS)
    return folder


def jobs_model(folder: Path) -> str:
    """The model jobs/linkedin.yaml asks for by default (``${PIPELINE_MODEL:-NAME}``)."""
    model: str = yaml.safe_load((folder / "jobs" / "linkedin.yaml").read_text())["model"]
    return re.sub(r"^\$\{PIPELINE_MODEL:-(.*)\}$", r"\1", model)


@pytest.mark.parametrize("index", [_case(index, line) for index, line in enumerate(LINES)])
def test_each_line_of_the_commands_block_works_as_written(block: Block, index: int) -> None:
    line = LINES[index]
    outcome = block.through(index)
    expected = EXPECTED_EXIT.get(command_only(line), 0)
    ran = substituted(command_only(line), block.sim_url, block.model)
    assert outcome.returncode == expected, (
        f"{line}\nran: {ran}\nexit {outcome.returncode}, expected {expected}\n{outcome.stderr[-3000:]}"
    )
    for output in named_outputs(ran):
        assert (block.folder / output).exists(), f"{line}\ndid not write {output}"
    if SIM_LINE.match(line):  # what the jobs ask for is what it serves: `run` finds the model
        served = httpx2.get(f"{block.sim_url}/models", timeout=10).json()["data"]
        assert [entry["id"] for entry in served] == [block.model], line
