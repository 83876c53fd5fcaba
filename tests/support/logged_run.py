"""`pipeline run` in a child process whose JSON log lines a thread reads: to wait for a line, then kill
it (kill -9 tests) or let it finish; and waiting for what a run's progress snapshot says."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.store.snapshot import read_snapshot
from tests.support.processes import REPO, pipeline_command, subprocess_env


def json_log_lines(stderr: str) -> list[dict[str, Any]]:
    """The JSON objects among a finished run's stderr lines, in order (other lines are skipped)."""
    found = []
    for line in stderr.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found


WAIT_S = 60.0  # the longest wait for any line or exit of a run that is meant to be killed
FINISH_S = 240.0  # an uninterrupted run of a test job on a busy 2-core machine stays far below


def running(snapshot: dict[str, Any]) -> bool:
    """The run holds the database and has sent requests."""
    return snapshot.get("status") == "running" and bool(snapshot.get("attempts"))


def some_done(snapshot: dict[str, Any]) -> bool:
    """The run is going on and has finished records (an interrupted run keeps them)."""
    return running(snapshot) and int(snapshot.get("done") or 0) > 0


def wait_for_snapshot(
    database: Path,
    process: subprocess.Popen[Any] | None,
    holds: Callable[[dict[str, Any]], bool] = running,
    *,
    timeout_s: float = WAIT_S,
) -> dict[str, Any]:
    """The run's progress snapshot (rewritten every 2 s) once ``holds`` is true of it: the state a signal or
    a reader needs, where a fixed sleep is too short on a loaded machine or outlasts a quick run. Fails
    when the run's process (None: a run in this one) ends first, or after ``timeout_s``, with what the
    snapshot said last."""
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = read_snapshot(database)
        if snapshot is not None and holds(snapshot):
            return snapshot
        if process is not None and (code := process.poll()) is not None:
            _, stderr = process.communicate()
            raise AssertionError(
                f"the run ended ({code}) before its snapshot said so; last: {snapshot}\n{stderr or ''}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"the run's snapshot did not say so in {timeout_s:.0f} s; last: {snapshot}")
        time.sleep(0.1)


class Run:
    """`pipeline run JOB --log-format json` whose stderr lines are read, as JSON, by a thread."""

    def __init__(self, job: Path, *args: str, **env: str) -> None:
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            pipeline_command("run", str(job), "--log-format", "json", *args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(**env),
            cwd=REPO,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.lines: list[str] = []
        self.run_id: int | None = None  # from its "run started" line
        self.start_up_s: float | None = None  # from the spawn to that line
        self.elapsed_s: float | None = None  # from the spawn to the end of its output
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": line.rstrip()}
            if not isinstance(event, dict):
                continue
            if event.get("event") == "run started":
                self.run_id = int(event["run_id"])
                self.start_up_s = time.perf_counter() - self.started
            self.events.put(event)
        self.elapsed_s = time.perf_counter() - self.started
        self.events.put(None)

    def next_event(self, deadline: float) -> dict[str, Any]:
        try:
            event = self.events.get(timeout=max(0.0, deadline - time.perf_counter()))
        except queue.Empty:
            raise AssertionError(f"no log line in time; stderr:\n{self.tail()}") from None
        if event is None:
            code = self.process.wait(timeout=WAIT_S)
            raise AssertionError(f"the run ended ({code}) before it could be killed; stderr:\n{self.tail()}")
        return event

    def wait_for(self, name: str) -> dict[str, Any]:
        deadline = time.perf_counter() + WAIT_S
        while (event := self.next_event(deadline)).get("event") != name:
            pass
        return event

    def kill(self) -> float:
        after_s = time.perf_counter() - self.started
        os.kill(self.process.pid, signal.SIGKILL)
        code = self.process.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        assert code == -signal.SIGKILL, f"the run ended ({code}) before the kill; stderr:\n{self.tail()}"
        return after_s

    def finish(self) -> int:
        code = self.process.wait(timeout=FINISH_S)
        self._reader.join(timeout=WAIT_S)
        return code

    def tail(self, lines: int = 30) -> str:
        return "".join(self.lines[-lines:])
