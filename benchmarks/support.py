"""What the benchmarks share: the checkout, a `pipeline sim` process, the benchmarks' job file and their
Markdown tables. A benchmark is a script (`python benchmarks/NAME.py`): Python puts this folder on
sys.path, so each imports this module as ``support``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
# `python -m pipeline` from REPO: the checkout these scripts are in, whichever one the venv installed.
PIPELINE = [sys.executable, "-m", "pipeline"]
MODEL = "bench-model"  # what the simulators serve and the job asks for


def child_env(**more: str) -> dict[str, str]:
    """The environment of a `pipeline` child process: this one's, with REPO importable."""
    return {**os.environ, "PYTHONPATH": str(REPO), **more}


def start_simulator(*args: str) -> tuple[subprocess.Popen[str], str]:
    """`pipeline sim --port 0 ARGS` in its own session, and its base URL once it serves (its log goes to
    this process's stderr). :func:`stop` ends it."""
    process = subprocess.Popen(
        [*PIPELINE, "sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=REPO,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # "serving MODEL at URL"
    if " at http://" not in line:
        stop(process)
        raise RuntimeError(f"the simulator did not start: {line!r}")
    return process, line.rsplit(" at ", 1)[1].strip()


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM to a process started in its own session, and its children; wait for it."""
    os.killpg(process.pid, signal.SIGTERM)
    process.wait()


@contextmanager
def simulator(*args: str) -> Iterator[str]:
    """:func:`start_simulator` for the block: its base URL; stopped at the end."""
    process, url = start_simulator(*args)
    try:
        yield url
    finally:
        stop(process)


def write_job(
    folder: Path, url: str | list[str], concurrency: int | str, *, stem: str = "bench", **more: Any
) -> Path:
    """``folder/STEM.yaml``, the benchmarks' job: the title and description of each of the postings in
    ``STEM.duckdb`` (pipeline.bench.datasets, benchmarks/clients/proc.py) into the LinkedIn schema, from
    :data:`MODEL` at ``url`` (a list: one ``endpoints:`` entry each, at ``concurrency`` each). ``more``:
    other keys of the job (``name``, ``operations``, ``max_concurrency``...)."""
    servers: dict[str, Any] = (
        {"endpoint": {"base_url": url}, "concurrency": concurrency}
        if isinstance(url, str)
        else {"endpoints": [{"base_url": each, "concurrency": concurrency} for each in url]}
    )
    job = {
        "name": stem,
        "database": f"{stem}.duckdb",
        "source": {"table": "postings", "fields": ["title", "description"]},
        "prompt": {"system": "Extract the posting.", "user": "{title}\n\n{description}"},
        "schema": "schemas.linkedin:JobPosting",
        "model": MODEL,
        **servers,
        "max_tokens": 2048,
        **more,
    }
    path = folder / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def print_rows(header: tuple[str, ...], rows: Iterable[tuple[object, ...]]) -> None:
    """A Markdown table: pastes into an issue or the README as it is."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(value) for value in row) + " |")
