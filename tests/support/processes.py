"""Real server processes on 127.0.0.1 for CLI and integration tests; they always stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parents[2]


def pipeline_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def run_pipeline(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The ``pipeline`` command in a child process, from the repository, its output captured."""
    return subprocess.run(
        pipeline_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(),
        cwd=REPO,
    )


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("PIPELINE_BASE_URL", None)
    env.pop("PIPELINE_MODEL", None)
    return env


@contextmanager
def sim_server(*args: str) -> Iterator[str]:
    """Start `pipeline sim --port 0 ARGS` and yield its base URL (…/v1)."""
    process = subprocess.Popen(
        pipeline_command("sim", "--port", "0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if " at http://" not in line:
            raise RuntimeError(f"the simulator did not start: {line}{process.stdout.read()}")
        yield line.rsplit(" at ", 1)[1].strip()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def sim_metric(url: str, name: str) -> float:
    """One value from the simulator's /metrics (Prometheus text), e.g. ``pipeline_sim:requests_total``."""
    values = sim_metrics(url)
    assert name in values, f"{name} not in /metrics"
    return values[name]


def sim_metrics(url: str) -> dict[str, float]:
    """Every value of the simulator's /metrics, keyed by name; labels other than the model's are kept,
    e.g. ``pipeline_sim:faults_total{fault="reset"}``."""
    text = httpx2.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        match = re.match(r"^([^{\s]+)\{([^}]*)\} (\S+)$", line)
        if match is None:
            continue
        name, labels, value = match.groups()
        extra = ",".join(label for label in labels.split(",") if not label.startswith("model_name="))
        values[f"{name}{{{extra}}}" if extra else name] = float(value)
    return values


def wait_until(condition: Callable[[], bool], *, timeout_s: float = 60.0, every_s: float = 0.1) -> None:
    """Poll ``condition`` until it holds: a real process on a loaded machine starts in 1 s or in 10, so
    a test waits for what it needs to see instead of sleeping a fixed time."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not so after {timeout_s:.0f} s")
        time.sleep(every_s)


def free_port() -> int:
    """A port nothing listens on now (the caller binds it soon after: a small race, fine on CI)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class SimProcess:
    """`pipeline sim --port PORT ARGS` that can be killed and started again on the same port and seed,
    as a model server restarts under a running job. Its output goes to ``log``."""

    def __init__(self, *args: str, port: int | None = None, log: Path | None = None) -> None:
        self.args = args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        if log is None:
            handle, name = tempfile.mkstemp(prefix="sim-", suffix=".log")
            os.close(handle)
            log = Path(name)
        self.log = log
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        """Start and wait until it serves; retried while the port is still held (bounded)."""
        assert self._process is None, "already running"
        deadline = time.monotonic() + timeout_s
        while True:
            with self.log.open("ab") as output:
                output.write(f"--- start {self.starts + 1} on port {self.port}\n".encode())
                output.flush()
                offset = output.tell()
                process = subprocess.Popen(
                    pipeline_command("sim", "--port", str(self.port), *self.args),
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=subprocess_env(),
                    start_new_session=True,
                )
            while process.poll() is None and time.monotonic() < deadline:
                with self.log.open("rb") as output:
                    output.seek(offset)
                    if b" at http://" in output.read():
                        self._process = process
                        self.starts += 1
                        return
                time.sleep(0.05)
            if process.poll() is None:  # no ready line in time
                _stop(process, signal.SIGKILL)
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the simulator did not start on port {self.port}: {self.tail()}")
            time.sleep(0.2)  # it exited (e.g. the port is still held): try again

    def kill(self) -> None:
        """SIGKILL, like a crashed or restarted server: in-flight requests are dropped."""
        if self._process is not None:
            _stop(self._process, signal.SIGKILL)
            self._process = None

    def stop(self) -> None:
        if self._process is not None:
            _stop(self._process, signal.SIGTERM)
            self._process = None

    def restart(self, down_s: float) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stopped (SIGSTOP) for the block, then going on (SIGCONT): a server that holds every request
        and answers none, without going away (connections are still accepted)."""
        assert self._process is not None, "not running"
        os.killpg(self._process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(self._process.pid, signal.SIGCONT)

    def metrics(self) -> dict[str, float]:
        return sim_metrics(self.url)

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _stop(process: subprocess.Popen[bytes], signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextmanager
def sim_process(*args: str, port: int | None = None, log: Path | None = None) -> Iterator[SimProcess]:
    """A started :class:`SimProcess` that is always stopped at the end."""
    sim = SimProcess(*args, port=port, log=log)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()
