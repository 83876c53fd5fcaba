"""A simulator on this machine as the bench's server: its process, found by the port it listens on, and
the CPU it and the machine spend over a level, beside the bench's own.

A simulator's times are the model's only while it keeps up: on a machine whose CPUs are busy (other
tests, other jobs) or when its own event loop fills a core, its replies come late by the machine's
load, and a sweep's curve bends where the model's would not. So when the server is ``pipeline sim`` on
127.0.0.1, the bench reads its CPU time and the machine's (Linux's ``/proc``; elsewhere nothing is read
and the rows say ``-``), as it reads its own with :func:`time.process_time`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

PROC = Path("/proc")
#: The hosts that are this machine.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_LISTEN = "0A"  # a socket's state in /proc/net/tcp: listening


@dataclass(frozen=True, slots=True)
class LocalSimulator:
    """``pipeline sim`` running on this machine, by its process id."""

    pid: int

    def cpu_s(self) -> float | None:
        """Its CPU seconds so far (user and system); None once it is gone."""
        try:
            fields = (PROC / str(self.pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        # After the command's closing parenthesis, utime and stime are the 12th and 13th fields.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def local_simulator(base_url: str) -> LocalSimulator | None:
    """The ``pipeline sim`` process serving ``base_url`` on this machine, or None: another host, a
    port no process here listens on, a server that is not the simulator (vLLM, a proxy), or no /proc."""
    parts = urlsplit(base_url)
    if parts.hostname not in LOCAL_HOSTS:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    pid = listening_process(port)
    return LocalSimulator(pid) if pid is not None and _is_simulator(pid) else None


def listening_process(port: int) -> int | None:
    """The process holding the socket that listens on ``port`` of this machine (None: none seen)."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not sockets:
        return None
    for process in PROC.iterdir():
        if process.name.isdigit() and not sockets.isdisjoint(_links(process / "fd")):
            return int(process.name)
    return None


def _links(folder: Path) -> set[str]:
    """What a process's open files are (``socket:[inode]`` for a socket): those still open as read."""
    try:
        fds = list(folder.iterdir())
    except OSError:  # the process is gone, or another user's
        return set()
    links = set()
    for fd in fds:
        try:
            links.add(os.readlink(fd))
        except OSError:  # closed since the listing (the listing's own, in this process)
            continue
    return links


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _is_simulator(pid: int) -> bool:
    """Whether the process runs ``pipeline sim`` (the script, or ``python -m pipeline sim``)."""
    try:
        args = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(Path(arg).name == "pipeline" and args[index + 1 : index + 2] == ["sim"]
               for index, arg in enumerate(args))  # fmt: skip


def machine_cpu() -> tuple[float, float] | None:
    """This machine's CPU time so far, busy and in all (every core's, in clock ticks); None without /proc."""
    try:
        first = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [float(value) for value in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


@dataclass(slots=True)
class CpuWatch:
    """The CPU a level took: the simulator's, in cores (CPU seconds per wall second), and the share of
    the machine's cores busy, each from when the watch was made."""

    simulator: LocalSimulator
    _server_s: float | None = None
    _machine: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self._server_s, self._machine = self.simulator.cpu_s(), machine_cpu()

    def shares(self, wall_s: float) -> tuple[float | None, float | None]:
        """(the simulator's cores, the machine's busy share) since the watch began."""
        server_s, machine = self.simulator.cpu_s(), machine_cpu()
        server = None
        if server_s is not None and self._server_s is not None and wall_s > 0:
            server = (server_s - self._server_s) / wall_s
        busy = None
        if machine is not None and self._machine is not None and machine[1] > self._machine[1]:
            busy = (machine[0] - self._machine[0]) / (machine[1] - self._machine[1])
        return server, busy
