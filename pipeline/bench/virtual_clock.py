"""An asyncio event loop on virtual time, for the closed loop and the simulator's tests: where the loop
would block, its clock jumps to its next timer, so hours of a scenario take seconds of CPU and a run is
deterministic."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from typing import Any


class _VirtualSelector(selectors.BaseSelector):
    """A real selector polled without blocking; where the loop would block, virtual time moves on."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.now = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("virtual clock: nothing is scheduled, the simulation would wait forever")
        self.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``asyncio.sleep(300)`` returns at once, 300 s later by its clock."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now
