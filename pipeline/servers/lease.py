"""How the `auto` jobs on one machine reach their server's pool of slots (:mod:`~pipeline.servers.slot_pool`):
each job holds a :class:`Lease`; the first to come hosts the pool in its own process, the others connect
to it and report to it at every router tick.

The meeting place is a Unix socket in Linux's abstract namespace, named for the user and the server
(:func:`pool_address`): no file to leave behind or clean up, gone the moment the process that bound it
ends (killed or not), and bound by one process only, which settles two jobs starting together. The host
serves only its own user's jobs, and a job joins only its own user's host (the other end's credentials,
``SO_PEERCRED``). Each report and its grant is a line of JSON.

When the host's job ends or dies, the others see the connection close: one of them binds the address
and hosts a new pool, which starts from the limit and what the search learned as they last heard them,
and the others connect to it; meanwhile their requests in flight go on and each holds its last
allowance, so nothing is lost and the level stays. Elsewhere than Linux (no abstract namespace), each
job keeps its own limit and sees the others in the server's counts alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import urlsplit

import anyio
import orjson
import structlog

from pipeline.servers.client_load import ClientLoad
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.limits import AdaptiveLimit, LimitChange
from pipeline.servers.slot_pool import Grant, Member, Report, SlotPool
from pipeline.servers.window import ServerLoad

log = structlog.get_logger("pipeline.servers.lease")

#: The longest line a job or the host sends: a report of a tick's replies is far shorter.
MOST_BYTES = 4 << 20
#: Whether this system has Unix sockets in an abstract namespace (Linux's).
SHARED = sys.platform.startswith("linux")
#: What goes wrong with a connection to the pool: it closed, broke, or said something that is no report
#: or grant.
LOST = (
    OSError,
    EOFError,
    anyio.ClosedResourceError,
    orjson.JSONDecodeError,
    KeyError,
    TypeError,
    ValueError,
    IndexError,
)
#: How long a job waits for the host's first answer (it answers once its own run starts), and how many
#: times it tries to join or host.
OPEN_WAIT_S = 10.0
TRIES = 3


def server_key(base_url: str) -> str:
    """One name per server however its URL is written (``localhost`` or ``127.0.0.1``, with or without
    ``/v1`` and a trailing slash)."""
    parts = urlsplit(base_url.strip())
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host in {"localhost", "::1", "0.0.0.0"} else host
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return hashlib.sha256(f"{host}:{port}{path}".encode()).hexdigest()[:16]


def pool_address(base_url: str) -> str:
    """The abstract socket of the pool of this user's jobs on this machine for the server."""
    user = os.getuid() if hasattr(os, "getuid") else 0
    return f"\0pipeline-pool-{user}-{server_key(base_url)}"


class Line:
    """A connection of newline-delimited JSON over a non-blocking Unix socket (anyio's waits on it are
    safe to cancel: its stream classes lose a wake-up that races a cancel, and the loop reports it)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock, self._buffer = sock, b""

    async def send(self, value: object) -> None:
        data = memoryview(orjson.dumps(value) + b"\n")
        while data:
            try:
                data = data[self.sock.send(data) :]
            except BlockingIOError:
                await anyio.wait_writable(self.sock)

    async def receive(self) -> dict[str, object]:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MOST_BYTES:
                raise ValueError("a line longer than any report")
            try:
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                await anyio.wait_readable(self.sock)
                continue
            if not chunk:
                raise EOFError("the other end closed")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        said = orjson.loads(line)
        if not isinstance(said, dict):
            raise ValueError("not a JSON object")
        return said

    def same_user(self) -> bool:
        """Whether the process at the other end runs as this one's user (the socket's credentials)."""
        credentials = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", credentials)
        return bool(uid == os.getuid())

    def close(self) -> None:
        closing(self.sock)


class Lease:
    """One job's lease of slots in the pool for one server: it hosts the pool, or reports to its host;
    the module docstring says how. :attr:`member` is what the job's endpoint uses as its controller."""

    def __init__(
        self,
        address: str,
        new_controller: Callable[[KneeMemory | None], AdaptiveLimit],
        *,
        clock: Callable[[], float],
        scrape_every_s: float,
    ) -> None:
        self.address, self.job = address, f"{os.getpid()}-{secrets.token_hex(4)}"
        self._new_controller, self._clock, self._scrape_every_s = new_controller, clock, scrape_every_s
        self.member = Member(self.job)
        self._line: Line | None = None  # to the host
        self._listener: socket.socket | None = None  # hosting
        self._serving = anyio.CancelScope()  # the host's connections: cancelled as it leaves
        self._closed = False

    @property
    def hosting(self) -> bool:
        return self._listener is not None

    async def open(self, controller: AdaptiveLimit) -> Member:
        """Join the pool before the first request: its host's (the job starts at its allowance), or a new
        one this job hosts with ``controller`` (started as this job would start alone). Raises OSError
        when neither works."""
        for _ in range(TRIES):
            if not self._connect():
                with contextlib.suppress(OSError):  # another job bound it a moment ago: join it
                    self._host(controller)
                    return self.member
                continue
            try:
                with anyio.fail_after(OPEN_WAIT_S):  # a host answers once its run starts
                    await self._exchange()
                return self.member
            except (*LOST, TimeoutError):  # its job ended as this one came
                self._drop()
        raise OSError(f"no pool of this machine's jobs after {TRIES} tries")

    async def run(self, tick_s: float) -> None:
        """Until cancelled: host the pool, or report to its host every ``tick_s``, taking over when it
        is gone."""
        try:
            while not self._closed:
                if self._listener is not None:
                    with self._serving:
                        await self._serve(self._listener)
                    return
                try:
                    await self._exchange()
                except LOST:
                    with contextlib.suppress(OSError):  # another user's process holds the name
                        await self._rejoin()
                await anyio.sleep(tick_s)
        finally:
            self.close()

    def close(self) -> None:
        """Leave the pool (a host's leaving ends its pool: the others take over)."""
        self._closed = True
        self._serving.cancel()
        self._drop()
        if self._listener is not None:
            closing(self._listener)
            self._listener = None

    def _drop(self) -> None:
        if self._line is not None:
            self._line.close()
            self._line = None

    def _connect(self) -> bool:
        """Connect to the pool's host; False when nobody hosts it."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(1.0)  # a local socket: at once, unless its backlog is full
        try:
            sock.connect(self.address)
        except OSError:  # nobody hosts it (ECONNREFUSED)
            sock.close()
            return False
        line = Line(sock)
        if not line.same_user():  # another user's process holds the name: no pool of this user's
            line.close()
            raise OSError("the pool's address is held by another user's process")
        self._line, self.member.pool = line, None
        return True

    def _host(self, controller: AdaptiveLimit, words: str = "this job hosts it") -> None:
        """Bind the address and keep the pool here; OSError when another job just did."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.address)
            listener.listen(64)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener
        pool = SlotPool(controller, self._clock, self._scrape_every_s)
        self.member.pool = pool
        pool.join(self.job)
        log.info(f"concurrency auto: the pool of this machine's jobs on the server: {words}")

    async def _rejoin(self) -> None:
        """The host is gone: connect to whoever hosts it now, or host it here from the level and what the
        search learned as last heard. With neither (another job is binding it), the next tick tries."""
        self._drop()
        if self._connect():
            return
        said = self.member.last_grant
        known = said.learned or KneeMemory(said.limit, bracketed=True)
        known = replace(known, level=max(1, said.limit), bracketed=True)  # the level stays
        with contextlib.suppress(OSError):
            words = f"its host is gone, this job hosts it now at the level it held, {known.level}"
            self._host(self._new_controller(known), words)
            in_flight, waiting = self.member.reported
            self.member.update(in_flight=in_flight, waiting=waiting)

    async def _exchange(self) -> None:
        line = self._line
        if line is None:
            raise EOFError("not connected")
        await line.send(report_json(self.job, self.member.take_report()))
        self.member.granted(grant_of(await line.receive()))

    async def _serve(self, listener: socket.socket) -> None:
        async with anyio.create_task_group() as tasks:
            while True:
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    await anyio.wait_readable(listener)
                    continue
                tasks.start_soon(self._serve_job, Line(sock))

    async def _serve_job(self, line: Line) -> None:
        """One other job's connection, while it lasts: each report answered with its grant."""
        pool, job = self.member.pool, None
        try:
            if pool is None or not line.same_user():
                return
            while True:
                said = await line.receive()
                job = str(said["job"])
                await line.send(grant_json(pool.report(job, report_of(said))))
        except LOST:
            pass
        finally:
            if pool is not None and job is not None:
                pool.leave(job)
            line.close()


def closing(sock: socket.socket) -> None:
    """Close a socket a task may wait on: the wait ends (ClosedResourceError), then the socket closes."""
    if sock.fileno() >= 0:
        anyio.notify_closing(sock)
        sock.close()


def report_json(job: str, report: Report) -> dict[str, object]:
    load, client = report.load, report.client
    return {
        "job": job,
        "in_flight": report.in_flight,
        "waiting": report.waiting,
        "replies": report.replies,
        "load": None if load is None else [load.running, load.waiting, load.kv_usage, load.preemptions_total],
        "client": None if client is None else [client.lag_s, client.cpu_share],
    }


def report_of(said: dict[str, object]) -> Report:
    load, client, replies = said.get("load"), said.get("client"), said.get("replies") or []
    assert isinstance(replies, list)
    return Report(
        int(str(said["in_flight"])),
        int(str(said["waiting"])),
        [(None if r[0] is None else float(r[0]), int(r[1]), int(r[2]), bool(r[3])) for r in replies],
        None if not isinstance(load, list) else ServerLoad(*load),
        None if not isinstance(client, list) else ClientLoad(float(client[0]), float(client[1])),
    )


def grant_json(grant: Grant) -> dict[str, object]:
    bound = grant.client_bound
    return {
        "allowance": grant.allowance,
        "limit": grant.limit,
        "jobs": grant.jobs,
        "changes": [[change.old, change.new, change.reason] for change in grant.changes],
        "learned": None if grant.learned is None else grant.learned.as_json(),
        "client_bound": None if bound is None else [bound.lag_s, bound.cpu_share],
        "at_knee": grant.at_knee,
    }


def grant_of(said: dict[str, object]) -> Grant:
    changes, bound = said.get("changes") or [], said.get("client_bound")
    assert isinstance(changes, list)
    return Grant(
        int(str(said["allowance"])),
        int(str(said["limit"])),
        int(str(said["jobs"])),
        tuple(LimitChange(int(old), int(new), str(reason)) for old, new, reason in changes),
        KneeMemory.from_json(said.get("learned")),
        None if not isinstance(bound, list) else ClientLoad(float(bound[0]), float(bound[1])),
        said.get("at_knee") is True,
    )
