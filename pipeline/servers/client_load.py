"""Whether the client itself is the bottleneck: the one place that says so, for `concurrency: auto`
(:mod:`pipeline.servers.limits`). A client starved of CPU (a loaded machine, or validating faster than
one core allows) cannot send or read replies any faster, so more concurrency pays nothing there and a
knee found then is the client's, not the server's.

Two readings over each interval: the event loop's lag (how late a timer fires: callbacks queue behind
the work of the loop's one thread), and that thread's CPU share (its CPU seconds per wall second: it does
not use more than a core). Either above its bound says the client was the bottleneck. The meter is read
on the loop's thread and counts that thread only: DuckDB's threads and the worker threads that write
checkpoints use other cores, and do not slow the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: A mean lag of timers above this says the event loop is behind (a healthy loop: a millisecond or two).
LAG_S = 0.05
#: The loop thread's CPU seconds per wall second above this: it is busy all the time.
CPU_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class ClientLoad:
    """The client over an interval: its event loop's mean lag and its CPU share."""

    lag_s: float
    cpu_share: float

    @property
    def bound(self) -> bool:
        return self.lag_s >= LAG_S or self.cpu_share >= CPU_SHARE

    @property
    def words(self) -> str:
        return f"event-loop lag {self.lag_s * 1000:.0f} ms, its thread's CPU {self.cpu_share:.0%} of a core"

    @staticmethod
    def mean(loads: list[ClientLoad]) -> ClientLoad | None:
        """The mean over an interval's readings (a moment's pause is no bottleneck); None without any."""
        if not loads:
            return None
        return ClientLoad(
            sum(load.lag_s for load in loads) / len(loads), sum(load.cpu_share for load in loads) / len(loads)
        )


class ClientMeter:
    """Readings of the client's own load: ``lagged`` after each timer the loop was late on, ``read`` at
    the end of each interval (the mean lag and the CPU share since the last read)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, cpu: Callable[[], float] = time.thread_time
    ) -> None:
        self._clock, self._cpu = clock, cpu
        self._since, self._cpu_since = clock(), cpu()
        self._lags: list[float] = []

    def lagged(self, late_s: float) -> None:
        self._lags.append(max(0.0, late_s))

    def read(self) -> ClientLoad:
        now, cpu = self._clock(), self._cpu()
        wall = now - self._since
        share = (cpu - self._cpu_since) / wall if wall > 0 else 0.0
        lag = sum(self._lags) / len(self._lags) if self._lags else 0.0
        self._since, self._cpu_since, self._lags = now, cpu, []
        return ClientLoad(lag, share)
