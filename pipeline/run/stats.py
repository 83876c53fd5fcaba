"""Live counters of one run, shared by the workers, the writer and the progress display.

All tasks run on one event loop thread, so plain integer updates are safe without locks.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.run.server_cache import CacheWarnings, run_cache_numbers

#: Upper bounds (seconds) of the request latency histogram: one busy gpt-oss request takes minutes.
LATENCY_BUCKETS_S: tuple[float, ...] = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 180, 240, 300, 450, 600, 900, 1800)


@dataclass(slots=True)
class LatencyHistogram:
    """Cumulative-ready counts per bucket (the last one is +Inf), as Prometheus histograms want."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    total_s: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_s += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, count of observations <= bound)``, ending with ``(inf, count)``."""
        bounds = (*self.bounds, float("inf"))
        return list(zip(bounds, itertools.accumulate(self.counts), strict=True))


@dataclass(slots=True)
class RunStats:
    pending_at_start: int
    concurrency: int
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)
    done: int = 0  # committed to the results table
    failed: int = 0  # committed to the failures table
    chunks_done: int = 0  # chunks of long records committed to the chunks table
    requests: int = 0
    output_tokens: int = 0
    timeouts: int = 0
    retries: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    last_answer_at: float = field(default=-1.0)  # when the server last finished a request
    # Records in a row failing on the server side that take an endpoint out (the last one: the run
    # stops): retry.abort_after_consecutive_failures. 0: not said in the progress line.
    abort_after_failures: int = 0
    last_failure: str | None = None  # the message of the last record that failed
    # Per endpoint (pipeline.servers.endpoint), by name: set by the runner, read by snapshots and metrics.
    endpoint_numbers: Callable[[], dict[str, dict[str, Any]]] = field(default=dict)
    # The low prefix-cache hit rates said so far (run/server_cache.py): once each, kept for status.
    cache_warnings: CacheWarnings = field(default_factory=CacheWarnings)
    _sent_at: dict[int, float] = field(default_factory=dict)
    _tickets: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()
        if self.last_answer_at < 0:
            self.last_answer_at = self.started

    def request_sent(self) -> int:
        """Count a request in flight; the ticket given back ends it in :meth:`request_ended`."""
        ticket = next(self._tickets)
        self._sent_at[ticket] = self.clock()
        self.requests += 1
        return ticket

    def request_ended(self, ticket: int, *, answered: bool) -> None:
        """``answered``: the server finished the request (a reply or an HTTP error, not a timeout)."""
        sent = self._sent_at.pop(ticket)
        if answered:
            now = self.clock()
            self.last_answer_at = now
            self.latency.observe(now - sent)

    @property
    def in_flight(self) -> int:
        return len(self._sent_at)

    def oldest_in_flight_s(self, now: float | None = None) -> float | None:
        if not self._sent_at:
            return None
        oldest = next(iter(self._sent_at.values()))  # insertion order is sending order
        return (self.clock() if now is None else now) - oldest

    def since_last_answer_s(self, now: float | None = None) -> float:
        return (self.clock() if now is None else now) - self.last_answer_at

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

    def server_failing(self) -> str | None:
        """How close the endpoints failing records in a row are to being given up, or ``None``: at 100%
        5xx a run waits minutes (a restart is plausible) before it stops, and the progress line says so."""
        if not self.abort_after_failures:
            return None
        most = self.abort_after_failures  # records finishing together can pass it before the run stops
        numbers = self.endpoint_numbers().items()
        counts = {name: min(most, int(n.get("failures_in_a_row", 0))) for name, n in numbers}
        failing = {name: count for name, count in counts.items() if count > 0}
        if not failing:
            return None
        of = f"of {most} records in a row failed on the server side"
        if len(counts) == 1:
            said = f"{next(iter(failing.values()))} {of} before the run stops"
        else:
            each = ", ".join(f"{name}: {count}" for name, count in failing.items())
            said = f"{each} {of} before it leaves the rotation (the run stops when no endpoint is left)"
        return f"server failing: {said}; last: {self.last_failure}"

    def server_cache(self) -> dict[str, Any]:
        """The prefix-cache hit rate and preemptions over the endpoints ({} when no server says)."""
        return run_cache_numbers(self.endpoint_numbers())

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        failing = self.server_failing()
        endpoints = self.endpoint_numbers()
        said = self.cache_warnings.said
        return {
            "pending_at_start": self.pending_at_start,
            "done": self.done,
            "failed": self.failed,
            "chunks_done": self.chunks_done,
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
            "endpoints": endpoints,
            **run_cache_numbers(endpoints),
            **({"prefix_cache_warnings": list(said)} if said else {}),
            **({"server_failing": failing} if failing else {}),
        }
