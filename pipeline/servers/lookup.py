"""Looking a server's host name up so that giving up on it costs nothing.

asyncio looks host names up in its default executor's threads, and both the event loop's end and the
process's exit wait for those threads: a DNS server that does not answer holds a command that gave up
on the server for the resolver's whole timeout (20 s and more), whatever timeout it said. A lookup in
a daemon thread of its own can be abandoned: the caller stops waiting, the process exits.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import urllib.parse

import anyio
import anyio.from_thread
import anyio.lowlevel


async def look_up_host(url: str) -> None:
    """Wait until the host name of ``url`` is looked up (found or not: the request that follows says
    what failed); cancelling the wait abandons the lookup. An IP address needs no lookup."""
    host = urllib.parse.urlsplit(url).hostname
    if host is None or _is_address(host):
        return
    token = anyio.lowlevel.current_token()
    answered = anyio.Event()

    def look_up() -> None:
        with contextlib.suppress(OSError):  # not found: the request that follows says so
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        with contextlib.suppress(RuntimeError):  # the event loop has ended: nobody waits any more
            anyio.from_thread.run_sync(answered.set, token=token)

    threading.Thread(target=look_up, name=f"look up {host}", daemon=True).start()
    await answered.wait()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
