from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from pipeline.errors import AlreadyRunningError, DatabaseLockedError
from pipeline.source.db import open_database
from pipeline.source.lock import RunLock, lock_holder, lock_path
from tests.support.processes import REPO, subprocess_env

pytestmark = pytest.mark.process  # each lock is held by another process

HOLDER = """
import sys, time, duckdb
from pathlib import Path
from pipeline.source.lock import RunLock
database = Path(sys.argv[1])
RunLock(database).acquire()
connection = duckdb.connect(str(database)) if sys.argv[2] == "db" else None
print("held", flush=True)
time.sleep(60)
"""


@contextmanager
def held_by_another_process(database: Path, *, with_database: bool = False) -> Iterator[int]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(database), "db" if with_database else "lock"],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=REPO,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        yield process.pid
    finally:
        process.send_signal(signal.SIGKILL)  # the kernel drops the lock: no stale lock after kill -9
        process.wait(timeout=10)


def test_a_second_run_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    database = tmp_path / "job.duckdb"
    with held_by_another_process(database) as pid:
        assert lock_holder(database) == pid
        with pytest.raises(AlreadyRunningError) as caught:
            RunLock(database).acquire()
    assert caught.value.pid == pid
    assert str(caught.value) == (
        f"{database}: this job is already running (pid {pid}); wait for it to end, "
        "or stop it with `kill -TERM` and run again to resume"
    )
    assert lock_holder(database) is None  # killed with -9: the lock went with the process
    with RunLock(database):
        assert lock_holder(database) == os.getpid()
        assert lock_path(database).read_text() == str(os.getpid())


def test_the_lock_is_reentrant_within_a_process_and_released_by_the_outer_holder(tmp_path: Path) -> None:
    database = tmp_path / "job.duckdb"
    with RunLock(database):
        with RunLock(database):  # run_job_locally holds it, then run_job takes it again
            pass
        with pytest.raises(AlreadyRunningError):
            _acquire_in_subprocess(database)
    _acquire_in_subprocess(database)


def _acquire_in_subprocess(database: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from pipeline.source.lock import RunLock\n"
        "from pipeline.errors import AlreadyRunningError\n"
        "try:\n    RunLock(Path(sys.argv[1])).acquire()\nexcept AlreadyRunningError:\n    sys.exit(4)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(database)], env=subprocess_env(), cwd=REPO, timeout=30, check=False
    )
    if result.returncode == 4:
        raise AlreadyRunningError("held", pid=None)
    assert result.returncode == 0


def test_opening_a_database_a_run_holds_names_that_run(tmp_path: Path) -> None:
    database = tmp_path / "job.duckdb"
    duckdb.connect(str(database)).close()
    with held_by_another_process(database, with_database=True) as pid:
        with pytest.raises(AlreadyRunningError) as caught:
            open_database(database, read_only=True)
        assert f"already running (pid {pid})" in str(caught.value)


def test_a_database_held_by_something_else_is_still_a_clear_error(tmp_path: Path) -> None:
    database = tmp_path / "job.duckdb"
    script = (
        "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(database)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        with pytest.raises(DatabaseLockedError, match="database is in use by another process") as caught:
            open_database(database)
        assert not isinstance(caught.value, AlreadyRunningError)
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_run_that_ends_before_its_database_exists_leaves_no_lock_nor_the_folders_made(
    tmp_path: Path,
) -> None:
    database = tmp_path / "new" / "folders" / "job.duckdb"
    with RunLock(database):
        assert lock_holder(database) == os.getpid()
    assert list(tmp_path.iterdir()) == []  # it failed on its input: nothing is left behind


def test_the_lock_of_a_database_that_exists_stays_beside_it(tmp_path: Path) -> None:
    database = tmp_path / "new" / "job.duckdb"
    with RunLock(database):
        open_database(database).close()  # the run created it
    assert lock_path(database).exists() and lock_holder(database) is None
