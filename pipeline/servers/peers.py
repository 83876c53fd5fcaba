"""Jobs on one machine that use one server, seen by each other: how many there are and what each holds.

A server's ``/metrics`` say how many requests run there, not whose: two other jobs holding 100 each and
one holding 200 look alike, and a job cannot tell whether it holds more than its part of three. So each
job with `concurrency: auto` leaves a small file per server it uses (:class:`FileBoard`): its requests
in flight and its limit (what it holds; in flight well under it: it has nothing more to send),
rewritten at every scrape (once a second), removed when the run ends. Each reads the others' at the
same time. A file not rewritten for :data:`STALE_S`, or whose process is gone, is a job that died, and
counts for nothing.

Jobs on several machines see each other the same way when ``$PIPELINE_PEERS_DIR`` is a directory all of
them share (NFS, say; their clocks kept by NTP): another machine's job is alive while it says.

The files split what the server's counts say among jobs (:mod:`~pipeline.servers.sharing`): a job on
another machine that says nothing here is still seen in the server's counts, as one job holding what no
file claims. They also say who came to the server first: that job's search finds the level for them
all, and the jobs that came after hold what it holds (:func:`~pipeline.servers.beside_others.follow`):
one search, not one per job, each reading the others' probes as the server's answer to its own. A file
that does not say when its job came (an earlier version's) is a job in no order: it follows no one and
no one follows it.
:class:`TableBoard` is the same board in memory, for jobs in one process on one clock (the closed loop).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

import orjson

from pipeline.servers.window import DEFAULT_TUNING

#: A job's file older than this (its run rewrites it every scrape, once a second) is a job gone.
STALE_S = 15.0
#: Files this old are removed by whoever sees them: a run killed before it could remove its own.
FORGOTTEN_S = 3600.0
#: This machine: a job's process is asked whether it runs only here (a directory the machines share,
#: such as NFS, holds other machines' jobs too: theirs live while they say, within STALE_S).
HOST = socket.gethostname()


class Peer(NamedTuple):
    """Another job on this machine using the same server, as it last said."""

    in_flight: int  # its requests in flight (0: just starting)
    limit: int | None = None  # its concurrency limit (None: not said, as if it were its in flight)
    earlier: bool | None = None  # it came to the server before this job (None: not known)

    @property
    def holds(self) -> int:
        """What it holds of the server: its requests in flight, or its limit when more (one just raised
        is sending them); a limit just lowered holds what it still has in flight until they drain."""
        return max(self.in_flight, self.limit or 0)

    @property
    def sending(self) -> bool:
        """It still has records to send (:func:`still_sending`); False: its last requests drain."""
        return self.limit is None or still_sending(self.in_flight, self.limit)


class PeerBoard(Protocol):
    """Where the jobs that use one server say what they hold."""

    def exchange(self, in_flight: int, limit: int) -> tuple[Peer, ...]:
        """Say this job's requests in flight and its limit; the others' as they last said them, the one
        that came to the server first first."""
        ...

    def leave(self) -> None:
        """This job is done with the server."""
        ...


def still_sending(in_flight: int, limit: int) -> bool:
    """Whether a job with ``in_flight`` requests under ``limit`` still has records to send: it keeps its
    limit full (as a window counts it, :class:`~pipeline.servers.window.Tuning`'s ``full_share``); one
    that does not is done sending, or short of records, and takes no more of the server."""
    return in_flight >= DEFAULT_TUNING.full_share * limit


def in_order(found: list[tuple[tuple[float, str], Peer]], mine: tuple[float, str]) -> tuple[Peer, ...]:
    """The other jobs, each with (when it came, its name), the one that came first first, each told
    whether it came before this job (``mine``); one that did not say when it came (an earlier version's,
    at infinity) is in no order."""
    return tuple(
        Peer(peer.in_flight, peer.limit, order < mine if order[0] < math.inf else None)
        for order, peer in sorted(found, key=lambda said: said[0])
    )


def peers_dir() -> Path:
    """``$PIPELINE_PEERS_DIR``, else ``$XDG_RUNTIME_DIR/pipeline/peers``, else a per-user directory under
    the system's temporary one: a place every run of this user on this machine finds."""
    if configured := os.environ.get("PIPELINE_PEERS_DIR"):
        return Path(configured)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "pipeline" / "peers"
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"pipeline-{user}" / "peers"


def server_key(base_url: str) -> str:
    """One name per server however its URL is written (``localhost`` or ``127.0.0.1``, with or without
    ``/v1`` and a trailing slash); this machine's own loopback is not another's."""
    parts = urlsplit(base_url.strip())
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host in {"localhost", "::1", "0.0.0.0"} else host
    host = f"{host}@{HOST}" if host == "127.0.0.1" else host  # each machine's own, in a shared directory
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return hashlib.sha256(f"{host}:{port}{path}".encode()).hexdigest()[:16]


class FileBoard:
    """One file per job under ``directory/<server key>/``; see the module docstring."""

    def __init__(self, base_url: str, directory: Path | None = None, clock: Callable[[], float] = time.time):
        self.folder = (directory or peers_dir()) / server_key(base_url)
        self.job = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._clock = clock
        self.since = clock()  # when this job came to the server: the one that came first leads

    @property
    def path(self) -> Path:
        return self.folder / f"{self.job}.json"

    def exchange(self, in_flight: int, limit: int) -> tuple[Peer, ...]:
        """Raises OSError when the directory cannot be written or read (the caller stops using it)."""
        now = self._clock()
        written = self.folder / f".{self.job}.tmp"
        said = orjson.dumps(
            {"in_flight": in_flight, "limit": limit, "at": now, "since": self.since, "host": HOST}
        )
        try:
            written.write_bytes(said)
        except FileNotFoundError:  # the first time, or a cleaner of the temporary directory removed it
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            written.write_bytes(said)
        os.replace(written, self.path)
        return in_order(self._others(now), (self.since, self.job))

    def _others(self, now: float) -> list[tuple[tuple[float, str], Peer]]:
        """The live jobs' files: each with when it came and its name (in which order they lead)."""
        found = []
        for path in self.folder.glob("*.json"):
            if path.name == self.path.name:
                continue
            said = _said(path)
            if said is None:  # being written, or not a job's: removed only when long forgotten
                if now - _mtime(path, now) > FORGOTTEN_S:
                    path.unlink(missing_ok=True)
                continue
            peer, at, since, host = said
            if (host == HOST and not _alive(path)) or now - at > FORGOTTEN_S:
                path.unlink(missing_ok=True)
            elif now - at < STALE_S:
                found.append(((since, path.stem), peer))
        return found

    def leave(self) -> None:
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the last job on this server leaves no empty directory
            self.folder.rmdir()


def _alive(path: Path) -> bool:
    """Whether the process that wrote a job's file runs (its name starts with its pid): a run killed
    a moment ago is no job (a resumed one would give way to itself). Not asked where a signal 0 is no
    question (Windows)."""
    pid = path.name.split("-", 1)[0]
    if os.name != "posix" or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: it runs
        return True
    return True


def _said(path: Path) -> tuple[Peer, float, float, str] | None:
    """A job's file: what it said, when, when it came to the server, and on which machine; None when it
    is gone or is not one."""
    try:
        data = orjson.loads(path.read_bytes())
        limit, at = data.get("limit"), float(data["at"])
        peer = Peer(int(data["in_flight"]), None if limit is None else int(limit))
        return peer, at, float(data.get("since", math.inf)), str(data.get("host", HOST))
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return default


@dataclass(slots=True)
class PeerTable:
    """Jobs in one process sharing one server (the closed loop): job -> (what it said, when)."""

    said: dict[int, tuple[Peer, float]] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)  # when each came to the server


@dataclass(slots=True)
class TableBoard:
    """A job's place on a :class:`PeerTable`; it says and reads as :class:`FileBoard` does."""

    table: PeerTable
    job: int
    clock: Callable[[], float]
    stale_s: float = STALE_S

    def exchange(self, in_flight: int, limit: int) -> tuple[Peer, ...]:
        now = self.clock()
        self.table.since.setdefault(self.job, now)
        self.table.said[self.job] = (Peer(in_flight, limit), now)
        found = [
            ((self.table.since[job], f"{job:09d}"), peer)
            for job, (peer, at) in self.table.said.items()
            if job != self.job and now - at < self.stale_s
        ]
        return in_order(found, (self.table.since[self.job], f"{self.job:09d}"))  # in number order

    def leave(self) -> None:
        self.table.said.pop(self.job, None)
        self.table.since.pop(self.job, None)
