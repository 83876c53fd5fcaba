"""Every shell block of every page (README.md, docs/*.md), run as a reader runs it, so the docs cannot
drift from the code.

A page's blocks run in the page's order, through bash, in one fresh copy of the project's tracked jobs/,
schemas/, data/, Makefile and pyproject.toml with ../shared/datasets beside it, as in this checkout: each
command finds what the commands before it on the page made. The copy has a `.venv/bin` whose `pipeline`
and `python` are the interpreter running the tests, first on the PATH, as the README tells a reader to
set it up. The server is a `pipeline sim --profile gpt-oss-120b --speed 50`, reached through
PIPELINE_BASE_URL (the jobs' default endpoint); a page's own `pipeline sim` line starts another one,
which its later commands use.

What a block is, from the language of its fence and the HTML comment right before it:

* ``bash`` / ``sh`` / ``shell``: each command (continuation lines joined, comment lines left out) must
  exit 0, and each file it names with --html / --out must exist after it, in a folder git ignores.
* ``console``: each ``$ command`` runs the same way, and what it prints on stdout must be the lines
  under it, after NORMALISED (times, rates and the folders of this machine, each said why).
* ``<!-- docs-test: file PATH -->``: the block (the job file, the schema module of the README's own job)
  is written to PATH in the copy, as the page tells the reader to save it.
* ``<!-- docs-test: not run: REASON -->``: not run, and the reason says why (a GPU box, the bundled vLLM
  server, a measurement). A shell block or a block of output (``text``, or no language) with no such
  reason fails: every block that shows commands or what they print is either run or says why not.

What runs differently from the page is all in SUBSTITUTIONS and in the two commands a reader watches
rather than waits for (`pipeline judge`'s page, `make dry-run`'s port), each with its reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
import yaml

from tests.support.docs import README, pages, slug
from tests.support.processes import REPO, free_port, sim_server, subprocess_env

DATASETS = REPO.parent / "shared" / "datasets"
SHELL = {"bash", "sh", "shell"}
CONSOLE = "console"
OUTPUT = {"text", ""}
MARKER = re.compile(r"^<!-- docs-test: (.*) -->$")
SIM_LINE = re.compile(r"^pipeline sim\b")
#: `pipeline judge` with a page to serve (not --by-model, --judge-model, --import or --export-gold).
JUDGE_PAGE = re.compile(r"^pipeline judge (?!.*--(?:by-model|judge-model|import|export-gold))")
#: The server every page starts with: what the jobs ask for, fast.
DEFAULT_SIM = ("--profile", "gpt-oss-120b", "--speed", "50")

# (page text, what runs instead, why): regular expressions, applied to every command in this order.
# {sim} is the page's simulator's URL, {model} the model the jobs ask for.
SUBSTITUTIONS: list[tuple[str, str, str]] = [
    (r"http://(?:gpu-box|127\.0\.0\.1):8000/v1", "{sim}", "the simulator stands in for the GPU server"),
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
        r"^(pipeline bench\b.*--concurrency )(\d+),(\d+)[\d,]*",
        r"\1\2,\3",
        "the sweep's first two levels: each level is the same code, and a sweep to 320 or 384 takes a minute "
        "here; tests/bench/ sweeps, finds knees and seeds them",
    ),
    (
        r"^pipeline bench\b",
        "pipeline bench --rounds 1 --no-warmup",
        "one round per level, not three, and no warm-up request: seconds, not a minute",
    ),
    (
        r"^make dry-run$",
        "make dry-run DRY_RUN_PORT={port}",
        "the dry run's simulator on a free port (its default, 8765, may be taken on a shared machine)",
    ),
]

# (pattern, replacement, why): applied to a console block's expected lines and to what the command
# printed, before they are compared.
NORMALISED: list[tuple[str, str, str]] = [
    (r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?( UTC)?", "<when>", "when a run started"),
    (r"\bin \d+:\d\d(:\d\d)?\b", "in <duration>", "how long a run took"),
    (r"[\d,]+(\.\d+)? records/min", "<n> records/min", "a rate over the run's own time"),
    (r"[\d,]+(\.\d+)? output tok/s", "<n> output tok/s", "the same"),
]


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, its text and its marker (if any)."""

    page: Path
    line: int
    language: str
    body: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def reason(self) -> str | None:
        """Why the block is not run, when its marker says so."""
        if self.marker and self.marker.startswith("not run:"):
            return self.marker.removeprefix("not run:").strip()
        return None

    @property
    def file(self) -> str | None:
        """The file the page tells the reader to save the block as."""
        match = re.fullmatch(r"file (\S+)", self.marker or "")
        return match.group(1) if match else None


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, in order, each with the marker on the last non-blank line before it."""
    found = []
    lines = page.read_text().splitlines()
    at = 0
    while at < len(lines):
        fence = re.match(r"^\s*```(\w*)\s*$", lines[at])
        if fence is None:
            at += 1
            continue
        end = next(index for index in range(at + 1, len(lines)) if lines[index].strip() == "```")
        before = [line for line in lines[:at] if line.strip()][-1:]
        marker = MARKER.match(before[0].strip()) if before else None
        body = "\n".join(lines[at + 1 : end]) + "\n"
        found.append(Block(page, at + 1, fence.group(1), body, marker.group(1) if marker else None))
        at = end + 1
    return found


def commands(body: str) -> list[str]:
    """A shell block's commands: continuation lines joined, blank and comment-only lines left out."""
    joined = re.sub(r"\\\n\s*", "", body)
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def console(body: str) -> list[tuple[str, list[str]]]:
    """A console block's commands (``$ ...``), each with the lines printed under it."""
    shown: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            shown.append((line.removeprefix("$ "), []))
        else:
            assert shown, f"a console block starts with output, not a `$ ` command: {line!r}"
            shown[-1][1].append(line)
    return shown


def command_only(line: str) -> str:
    """The line without its trailing comment (` # ...`; the pages put no # inside quotes)."""
    return re.sub(r"\s+#\s.*$", "", line)


def named_outputs(command: str) -> list[str]:
    """The files a command says it writes (--html PATH, --out PATH)."""
    words = shlex.split(command, comments=True)
    return [words[at + 1] for at, word in enumerate(words[:-1]) if word in ("--html", "--out")]


def checked_blocks() -> list[Block]:
    """The blocks that show commands or what they print, and those with a marker."""
    shown = SHELL | OUTPUT | {CONSOLE}
    return [block for page in pages() for block in blocks(page) if block.marker or block.language in shown]


# --- what every page must say, read without running anything -------------------------------------


@pytest.mark.parametrize("block", checked_blocks(), ids=lambda block: block.where)
def test_every_block_of_commands_or_output_runs_or_says_why_not(block: Block) -> None:
    if block.marker is not None:
        assert block.reason or block.file, f"{block.where}: a marker that says nothing: {block.marker!r}"
        assert block.reason is None or len(block.reason) > 20, f"{block.where}: say why it is not run"
        return
    assert block.language not in OUTPUT, (
        f"{block.where}: output with nothing that prints it: a console block, or say why it is not run"
    )
    assert commands(block.body), f"{block.where}: a shell block with no command"


def test_the_readme_is_read_at_once() -> None:
    """At most 300 lines: the reference lives in docs/."""
    length = len(README.read_text().splitlines())
    assert length <= 300, f"README.md is {length} lines"


def test_the_readmes_links_reach_a_page_and_a_heading_on_it() -> None:
    """MkDocs checks the links between docs/ pages (`make check`); the README is outside docs/."""
    for target in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", README.read_text()):
        path, anchor = target
        if re.match(r"^\w+://", path):
            continue
        page = REPO / path
        assert page.is_file(), f"README.md links to {path}, which is not there"
        headings = re.findall(r"^#{1,6} (.*)$", page.read_text(), re.MULTILINE) if anchor else []
        assert not anchor or anchor in {slug(heading) for heading in headings}, f"{path}#{anchor}"


# --- every page, run --------------------------------------------------------------------------------


@dataclass
class Reader:
    """A reader working through one page: their folder, their environment and the server they use."""

    folder: Path
    env: dict[str, str]
    model: str
    servers: ExitStack
    sim: str = ""
    done: list[str] = field(default_factory=list)

    def use(self, sim_url: str) -> None:
        self.sim = sim_url
        self.env["PIPELINE_BASE_URL"] = sim_url  # the jobs' endpoint (subprocess_env drops the caller's)

    def take(self, block: Block) -> None:
        if block.reason is not None or (block.language not in SHELL | {CONSOLE} and block.file is None):
            return
        if block.file is not None:
            target = self.folder / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body)
        elif block.language == CONSOLE:
            for command, printed in console(block.body):
                outcome = self.run(block, command)
                assert normalised(outcome.stdout, self.folder) == normalised(
                    "\n".join(printed), self.folder
                ), f"{block.where}: `{command}` printed\n{outcome.stdout}"
        else:
            for command in commands(block.body):
                self.run(block, command)

    def run(self, block: Block, line: str) -> subprocess.CompletedProcess[str]:
        command = substituted(command_only(line), self.sim, self.model)
        self.done.append(command)
        if SIM_LINE.match(command):
            # On a free port, not the page's 8000: sim_server gives it --port 0.
            options = re.sub(r"\s--port[ =]\d+", "", command).split()[2:]
            self.use(self.servers.enter_context(sim_server(*options)))
            return subprocess.CompletedProcess(command, 0, "", "")
        outcome = judged(command, self) if JUDGE_PAGE.match(command) else self.shell(command)
        assert outcome.returncode == 0, (
            f"{block.where}: {line}\nran: {command}\nexit {outcome.returncode}\n{outcome.stderr[-3000:]}"
        )
        for output in named_outputs(command):
            assert (self.folder / output).exists(), f"{block.where}: {line}\ndid not write {output}"
            written = output + "/" if (self.folder / output).is_dir() else output  # as git tells folders
            assert ignored(written), f"{block.where}: {line}\nwrites {output}, which git does not ignore"
        return outcome

    def shell(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )


def substituted(line: str, sim_url: str, model: str) -> str:
    command = line
    for pattern, replacement, _ in SUBSTITUTIONS:
        if re.search(pattern, command):
            fill = {"sim": sim_url, "model": model, "port": str(free_port())}
            command = re.sub(pattern, replacement.format(**fill), command)
    return command


def judged(command: str, reader: Reader) -> subprocess.CompletedProcess[str]:
    """The judging page serves until Ctrl-C: started on a free port and read until it prints its URL (its
    sample read); then the values of its first JUDGED_RECORDS records are judged through the page's own
    API, as a reader pressing `a` (and `x` for every fourth) would, so that the `eval --judged` after it
    has judgments to count; then Ctrl-C, which must end it with exit 0 (tests/judging/test_page.py drives
    the page itself in a browser)."""
    process = subprocess.Popen(
        ["bash", "-c", f"exec {command} --port 0"],
        cwd=reader.folder,
        env=reader.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    if " at http://127.0.0.1:" in first:
        judge_values(first.split(" at ", 1)[1].split()[0])
        process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(command, process.returncode, first + stdout, stderr)


JUDGED_RECORDS = 3


def judge_values(page: str) -> None:
    for index in range(JUDGED_RECORDS):
        items = httpx2.get(f"{page}api/records/{index}", timeout=30).raise_for_status().json()["items"]
        for item in range(len(items)):
            verdict = "wrong" if item % 4 == 3 else "correct"
            answer = httpx2.post(f"{page}api/judge", json={"record": index, "item": item, "verdict": verdict})
            answer.raise_for_status()


def normalised(text: str, folder: Path) -> str:
    text = text.replace(str(Path(sys.executable).parent), "/…/.venv/bin").replace(str(folder), "/…")
    for pattern, replacement, _ in NORMALISED:
        text = re.sub(pattern, replacement, text)
    return text.strip("\n")


def ignored(path: str) -> bool:
    """Whether git ignores a file at ``path`` in the checkout (what a command writes must not show up
    in `git status`)."""
    check = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False)
    return check.returncode == 0


def fresh_copy(root: Path) -> Path:
    """The project's tracked jobs/, schemas/, data/, out/, Makefile and pyproject.toml (nothing a local run
    left), ../shared beside it, and a .venv/bin of the interpreter running the tests, installed as far
    as `make dry-run` needs (its .installed-core newer than pyproject.toml, so make installs nothing)."""
    folder = root / "main"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", "jobs", "schemas", "data", "out", "Makefile", "pyproject.toml"],
        cwd=REPO,
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, tracked):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, folder / name)
    (root / "shared").mkdir()
    (root / "shared" / "datasets").symlink_to(DATASETS)
    bin_folder = folder / ".venv" / "bin"
    bin_folder.mkdir(parents=True)
    for name, run in (("pipeline", "-m pipeline "), ("python", "")):  # scripts: a symlink leaves the venv
        (bin_folder / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {run}"$@"\n')
        (bin_folder / name).chmod(0o755)
    (folder / ".venv" / ".installed-core").touch()
    return folder


def jobs_model(folder: Path) -> str:
    """The model jobs/linkedin.yaml asks for by default (``${PIPELINE_MODEL:-NAME}``)."""
    model: str = yaml.safe_load((folder / "jobs" / "linkedin.yaml").read_text())["model"]
    return re.sub(r"^\$\{PIPELINE_MODEL:-(.*)\}$", r"\1", model)


@pytest.fixture(scope="module")
def default_sim() -> Iterator[str]:
    with sim_server(*DEFAULT_SIM) as url:
        yield url


def runs_something(page: Path) -> bool:
    return any(
        block.reason is None and (block.language in SHELL | {CONSOLE} or block.file) for block in blocks(page)
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "page", [page for page in pages() if runs_something(page)], ids=lambda page: page.name
)
def test_every_shell_block_of_the_page_runs_as_written(
    page: Path, default_sim: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if not DATASETS.is_dir():
        pytest.skip(f"the pages read {DATASETS}, which is not here")
    folder = fresh_copy(tmp_path_factory.mktemp(page.stem))
    env = subprocess_env(PATH=f"{folder / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with ExitStack() as servers:
        reader = Reader(folder, env, jobs_model(folder), servers)
        reader.use(default_sim)
        for block in blocks(page):
            reader.take(block)
    assert reader.done, f"{page.name}: nothing ran"
