"""Start a local OpenAI-compatible server process, wait until it is healthy, and always stop it.

The server runs in its own process group, so stopping it stops every process it spawned; and each
of its Python processes asks the kernel for SIGTERM when its parent dies (``pdeathsig/``), so nothing
is left behind when the pipeline is killed, even with ``kill -9``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import anyio
import structlog
from anyio.abc import Process

from pipeline.errors import LocalServerError
from pipeline.servers.http import SMALL_REQUEST_TIMEOUT_S, http_client, text_if_ok

log = structlog.get_logger("pipeline.local")

PDEATHSIG_DIR = Path(__file__).resolve().parent / "pdeathsig"
STOP_GRACE_S = 20.0
_ERROR_LINE = re.compile(r"\b(\w*Error|Exception):")


@dataclass(frozen=True, slots=True)
class ServerLaunch:
    """How to start one server process and where it will answer."""

    argv: list[str]
    model: str
    port: int
    log_path: Path
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def require_free_port(host: str, port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise LocalServerError(
                f"port {port} on {host} is busy ({exc.strerror}); choose another with --port, "
                "or leave it out to use a free one"
            ) from exc


def log_tail(path: Path, lines: int = 20) -> str:
    """The last lines of a server log, with the last error line (the root cause) first."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    errors = [line for line in text if _ERROR_LINE.search(line)]
    root_cause = f"{errors[-1].strip()}\n" if errors else ""
    return root_cause + "\n".join(f"    {line}" for line in text[-lines:])


class LocalServer:
    """``async with LocalServer(launch) as server:``, then the server answers at ``server.base_url``."""

    def __init__(self, launch: ServerLaunch) -> None:
        self.launch = launch
        self._process: Process | None = None

    @property
    def base_url(self) -> str:
        return self.launch.base_url

    @property
    def model(self) -> str:
        return self.launch.model

    async def __aenter__(self) -> LocalServer:
        require_free_port(self.launch.host, self.launch.port)
        await self._start()
        try:
            await self._wait_until_healthy()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()

    async def _start(self) -> None:
        self.launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.launch.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PDEATHSIG_DIR), env.get("PYTHONPATH")]))
        env["PIPELINE_PDEATHSIG_PARENT"] = str(os.getpid())
        with self.launch.log_path.open("wb") as log_file:
            self._process = await anyio.open_process(
                self.launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        log.info(
            "starting local server", url=self.base_url, log=str(self.launch.log_path), pid=self._process.pid
        )

    async def _wait_until_healthy(self) -> None:
        started = anyio.current_time()
        health = self.base_url.removesuffix("/v1") + "/health"
        async with http_client(timeout_s=SMALL_REQUEST_TIMEOUT_S) as client:
            with anyio.move_on_after(self.launch.startup_timeout_s):
                while True:
                    self._raise_if_exited()
                    if await text_if_ok(client, health) is not None:
                        elapsed = anyio.current_time() - started
                        log.info("local server ready", url=self.base_url, seconds=round(elapsed, 1))
                        return
                    await anyio.sleep(0.5)
        raise LocalServerError(
            f"the local server did not become healthy within {self.launch.startup_timeout_s:.0f} s "
            f"(log {self.launch.log_path}):\n{log_tail(self.launch.log_path)}"
        )

    def _raise_if_exited(self) -> None:
        if self._process is not None and self._process.returncode is not None:
            raise LocalServerError(
                f"the local server exited with code {self._process.returncode} while starting "
                f"(log {self.launch.log_path}):\n{log_tail(self.launch.log_path)}"
            )

    async def stop(self) -> None:
        """SIGTERM to the whole process group, then SIGKILL after a grace period. Never cancelled."""
        process, self._process = self._process, None
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            _signal_group(process.pid, signal.SIGTERM)
            with anyio.move_on_after(STOP_GRACE_S):
                await process.wait()
            _signal_group(process.pid, signal.SIGKILL)  # and whatever outlived the leader
            await process.wait()
        log.info("local server stopped", url=self.base_url)


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)
