"""Waiting in a test for what other tasks do: on the condition an assert reads, never for a fixed time."""

from __future__ import annotations

from collections.abc import Callable

import anyio

#: Long enough for a loaded machine: a condition that holds is seen within milliseconds.
TIMEOUT_S = 10.0


async def until(condition: Callable[[], bool], *, timeout_s: float = TIMEOUT_S, every_s: float = 0.0) -> None:
    """Let the other tasks run until ``condition()`` holds: looked at after each turn of the event loop
    (``every_s`` 0), or every ``every_s`` for what another thread or process does. A condition that
    never holds fails the test with ``TimeoutError`` after ``timeout_s``."""
    with anyio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110  (polling is the point: no event says the condition holds)
            await anyio.sleep(every_s)
