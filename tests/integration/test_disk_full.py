"""The disk filling up during a run and during `load`, on a real small filesystem (a 48 MB tmpfs, as a
nightly job's volume with 3 MB left): one line naming the database and the full disk, never a
traceback; what was written is kept, and once space is freed the next run does the rest, none twice."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.errors import EXIT_ABORTED
from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.processes import REPO, pipeline_command, run_pipeline, sim_server, subprocess_env

pytestmark = pytest.mark.integration

VOLUME_MB = 48
RECORDS = 4314


@contextmanager
def small_volume() -> Iterator[Path]:
    """A fresh tmpfs of ``VOLUME_MB``; the test skips where it cannot be mounted (it needs root)."""
    folder = Path(tempfile.mkdtemp(prefix="pipeline-small-disk-"))
    mount = ["mount", "-t", "tmpfs", "-o", f"size={VOLUME_MB}m", "tmpfs", str(folder)]
    try:
        mounted = subprocess.run(mount, capture_output=True, text=True, check=False)
    except OSError as error:  # no mount command at all
        mounted = subprocess.CompletedProcess(mount, 1, "", str(error))
    if mounted.returncode != 0:
        folder.rmdir()
        reason = mounted.stderr.strip() or "mount failed"
        pytest.skip(f"cannot mount a {VOLUME_MB} MB tmpfs to fill up (needs root): {reason}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
        folder.rmdir()


def fill(volume: Path, leave_bytes: int) -> Path:
    """Take all of ``volume``'s free space but ``leave_bytes``, with one file (blocks really taken)."""
    filler = volume / "filler"
    descriptor = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(descriptor, 0, shutil.disk_usage(volume).free - leave_bytes)
    finally:
        os.close(descriptor)
    return filler


def run(job: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pipeline_command("run", str(job), "--log-format", "json"),
        capture_output=True,
        text=True,
        timeout=600,
        env=subprocess_env(),
        cwd=REPO,
    )


def test_a_disk_that_fills_up_mid_run_stops_it_in_one_line_and_the_next_run_does_the_rest(
    tmp_path: Path,
) -> None:
    with small_volume() as volume, sim_server("--model", "test-model") as url:
        database = volume / "postings.duckdb"
        build_postings(database, RECORDS)
        job = write_job(
            tmp_path,
            database=str(database),
            endpoint={"base_url": url},
            concurrency=32,
            max_tokens=2048,
            schema="schemas.linkedin:JobPosting",
        )
        filler = fill(volume, 3 * 1024 * 1024)
        full = run(job)
        assert full.returncode == EXIT_ABORTED, full.stderr[-3000:]
        assert "Traceback" not in full.stderr and "ExceptionGroup" not in full.stderr
        said = full.stderr.strip().splitlines()[-1]
        assert said.startswith(f"error: {database}: cannot write results: the disk is full ("), said
        assert "No space left on device" in said and "free space and run again" in said
        kept = table_rows(database, "SELECT count(*) FROM results")[0][0]
        assert 0 < kept < RECORDS

        filler.unlink()  # space freed
        rest = run(job)
        assert rest.returncode == 0, rest.stderr[-3000:]
        results = table_rows(database, "SELECT count(*), count(DISTINCT record_id) FROM results")
        assert results == [(RECORDS, RECORDS)]
        assert table_rows(database, "SELECT done FROM runs ORDER BY run_id DESC LIMIT 1") == [
            (RECORDS - kept,)
        ]


def test_load_onto_a_full_disk_says_the_disk_is_full(tmp_path: Path) -> None:
    rng = random.Random(5)
    words = ["data", "engineer", "python", "london", "salary", "remote", "team", "sql", "cloud", "senior"]
    postings = tmp_path / "postings.csv"
    with postings.open("w") as out:
        out.write("id,title,description\n")
        for number in range(5000):
            text = " ".join(rng.choice(words) + str(rng.randrange(10_000)) for _ in range(100))
            out.write(f"{number},Engineer {number},{text}\n")
    with small_volume() as volume:
        database = volume / "load.duckdb"
        job = write_job(tmp_path, database=str(database))
        fill(volume, 1024 * 1024)
        loaded = run_pipeline("load", str(postings), "--job", str(job))
    assert loaded.returncode != 0
    assert "Traceback" not in loaded.stderr
    said = loaded.stderr.strip()
    assert "\n" not in said and str(postings) in said
    assert "the disk is full (" in said and "cannot rollback" not in said
