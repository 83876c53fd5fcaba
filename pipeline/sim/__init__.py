"""A vLLM-like OpenAI-compatible server for tests, benchmarks and dry runs (``pipeline sim``).

May import nothing else of :mod:`pipeline`: a fake server shares no code with the client it fakes for.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from pipeline.sim.http import serve
from pipeline.sim.server import Faults, SimConfig, SimServer

__all__ = ["Faults", "ListenError", "SimConfig", "SimServer", "run_sim"]


class ListenError(Exception):
    """The simulator cannot listen where it was asked: ``error`` says why (the port in use, an address
    not of this machine, a privileged port). Raised before it serves anything."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


async def run_sim(
    config: SimConfig, host: str, port: int, on_ready: Callable[[str], None] | None = None
) -> None:
    """Serve until SIGINT/SIGTERM. ``on_ready`` gets the base URL (with the real port if ``port`` is 0).
    Raises :class:`ListenError` when it cannot listen there."""
    sim = SimServer(config)
    try:
        server = await serve(sim.handle, host, port)
    except OSError as error:  # binding, or resolving the host: nothing is served yet
        raise ListenError(error) from error
    bound_port = server.sockets[0].getsockname()[1]
    if on_ready is not None:
        on_ready(f"http://{host}:{bound_port}/v1")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()
