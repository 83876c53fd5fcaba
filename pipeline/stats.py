"""Live counters of one run, shared by the workers, the writer and the progress display.

All tasks run on one event loop thread, so plain integer updates are safe without locks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RunStats:
    pending_at_start: int
    concurrency: int
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)
    done: int = 0  # committed to the results table
    failed: int = 0  # committed to the failures table
    in_flight: int = 0
    requests: int = 0
    output_tokens: int = 0
    timeouts: int = 0
    retries: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    @property
    def finished(self) -> int:
        return self.done + self.failed

    @property
    def remaining(self) -> int:
        return max(0, self.pending_at_start - self.finished)

    def elapsed_s(self, now: float | None = None) -> float:
        return max(1e-9, (self.clock() if now is None else now) - self.started)

    def records_per_min(self, now: float | None = None) -> float:
        return self.finished * 60.0 / self.elapsed_s(now)

    def output_tokens_per_s(self, now: float | None = None) -> float:
        return self.output_tokens / self.elapsed_s(now)

    def eta_s(self, now: float | None = None) -> float | None:
        rate = self.records_per_min(now) / 60.0
        return self.remaining / rate if rate > 0 else None

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "pending_at_start": self.pending_at_start,
            "done": self.done,
            "failed": self.failed,
            "in_flight": self.in_flight,
            "remaining": self.remaining,
            "requests": self.requests,
            "records_per_min": round(self.records_per_min(now), 2),
            "output_tokens_per_s": round(self.output_tokens_per_s(now), 1),
            "eta_s": None if (eta := self.eta_s(now)) is None else round(eta),
            "elapsed_s": round(self.elapsed_s(now), 1),
            "timeouts": self.timeouts,
            "retries": dict(self.retries),
            "failures": dict(self.failures),
        }
