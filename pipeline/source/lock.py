"""One ``pipeline run`` per job at a time: an exclusive lock file beside the database.

``flock`` locks belong to the open file, so the kernel drops them when the process dies, kill -9
included: a crashed run never leaves a stale lock behind. The file holds the owner's pid, so the
second run can say who is running instead of surfacing DuckDB's lock error. A run that ends before its
database exists (it failed on its input) takes its lock file, and any folder made for it, along.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import suppress
from pathlib import Path
from types import TracebackType

from pipeline.errors import AlreadyRunningError, ConfigError

# Locks this process holds, by path: run_job_locally takes the lock before starting the server and
# run_job takes it again for the run itself.
_held: set[Path] = set()


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist, deepest first: what making it makes."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def remove_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) that are empty: what a failed command made for nothing."""
    for folder in folders:
        with suppress(OSError):  # not empty: something else put a file there meanwhile
            folder.rmdir()


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


def lock_holder(database: Path) -> int | None:
    """The pid of the ``pipeline run`` holding the job's lock, if one does."""
    path = lock_path(database)
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_pid(descriptor)
    finally:
        os.close(descriptor)  # closing drops a shared lock we may have taken
    return None


def _read_pid(descriptor: int) -> int | None:
    text = os.pread(descriptor, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def already_running(database: Path, pid: int | None) -> AlreadyRunningError:
    who = f"pid {pid}" if pid is not None else "pid unknown"
    return AlreadyRunningError(
        f"{database}: this job is already running ({who}); wait for it to end, "
        "or stop it with `kill -TERM` and run again to resume",
        pid=pid,
    )


class RunLock:
    """``with RunLock(database):`` — raises :class:`AlreadyRunningError` if another run holds it."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = lock_path(database)
        self._descriptor: int | None = None
        self._made: list[Path] = []

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> None:
        if self.path in _held:
            return  # this process already holds it (an outer caller releases it)
        made = missing_folders(self.path.parent)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot create the run lock ({exc.strerror or exc})") from exc
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(descriptor)
            os.close(descriptor)
            raise already_running(self.database, pid) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, str(os.getpid()).encode(), 0)
        self._descriptor, self._made = descriptor, made
        _held.add(self.path)

    def release(self) -> None:
        if self._descriptor is None:
            return
        _held.discard(self.path)
        if not self.database.exists():  # the run failed before creating it: it leaves nothing behind
            with suppress(OSError):  # gone already: nothing is left either way
                self.path.unlink()  # while still held: a run starting now makes a lock of its own
            remove_folders(self._made)
        os.close(self._descriptor)  # drops the lock; the file stays, empty locks are harmless
        self._descriptor = None
