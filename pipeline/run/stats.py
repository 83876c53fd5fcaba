"""A run's live state: its numbers as they grow (a :class:`~pipeline.store.numbers.RunNumbers`, the one
record of its counts) and what only a run going on has beside them: the requests in flight, the
latency histogram, the clock, the endpoints' own numbers. Shared by the workers, the writer, the
progress display, the snapshot, the series and Prometheus, each of which reads :meth:`RunStats.now`.

All tasks run on one event loop thread, so plain integer updates are safe without locks.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

from pipeline.extraction.outcomes import Stored
from pipeline.run.server_cache import CacheWarnings, cache_totals, progress_words, run_cache_numbers
from pipeline.servers.replies import Reply
from pipeline.store.numbers import RunNumbers
from pipeline.wording import counted

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
    pending_at_start: InitVar[int]  # what the run sets out to do
    concurrency: int
    clock: Callable[[], float] = time.monotonic
    # What the run's options select, --limit aside (None: as many as it sets out to do).
    backlog_at_start: InitVar[int | None] = None
    started: float = field(default=-1.0)
    numbers: RunNumbers = field(init=False)  # the counts: read them through now()
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    last_answer_at: float = field(default=-1.0)  # when the server last finished a request
    # Records in a row failing on the server side that take an endpoint out (the last one: the run
    # stops): retry.abort_after_consecutive_failures. 0: not said in the progress line.
    abort_after_failures: int = 0
    last_failure: str | None = None  # the message of the last record that failed
    # Per endpoint (pipeline.servers.endpoint), by name: set by the runner, read by snapshots and metrics.
    endpoint_numbers: Callable[[], dict[str, dict[str, Any]]] = field(default=dict)
    # The low prefix-cache hit rates said so far (run/server_cache.py): once each, in the log.
    cache_warnings: CacheWarnings = field(default_factory=CacheWarnings)
    _final: RunNumbers | None = None  # its numbers at its end (end()), which every reader after takes
    _sent_at: dict[int, float] = field(default_factory=dict)
    _tickets: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self, pending_at_start: int, backlog_at_start: int | None) -> None:
        backlog = pending_at_start if backlog_at_start is None else backlog_at_start
        self.numbers = RunNumbers(pending_at_start=pending_at_start, backlog_at_start=backlog)
        if self.started < 0:
            self.started = self.clock()
        if self.last_answer_at < 0:
            self.last_answer_at = self.started

    def request_sent(self) -> int:
        """Count a request as it is sent (an attempt, whatever becomes of it) and in flight; the ticket
        given back ends it in :meth:`request_ended`."""
        ticket = next(self._tickets)
        self._sent_at[ticket] = self.clock()
        self.numbers.attempts += 1
        return ticket

    def request_ended(self, ticket: int, *, answered: bool) -> None:
        """``answered``: the server finished the request (a reply or an HTTP error, not a timeout)."""
        sent = self._sent_at.pop(ticket)
        if answered:
            now = self.clock()
            self.last_answer_at = now
            self.latency.observe(now - sent)

    def replied(self, reply: Reply) -> None:
        """Count the tokens of a reply, as the server counted them."""
        numbers = self.numbers
        numbers.prompt_tokens += reply.prompt_tokens or 0
        numbers.completion_tokens += reply.completion_tokens or 0
        numbers.reasoning_tokens += reply.reasoning_tokens or 0

    def timed_out(self) -> None:
        self.numbers.timeouts += 1

    def retried(self, cause: str) -> None:
        self.numbers.retries[cause] = self.numbers.retries.get(cause, 0) + 1

    def committed(self, outcomes: Sequence[Stored]) -> None:
        """Count outcomes once they are committed."""
        for outcome in outcomes:
            self.numbers.add(outcome)

    def made_transient(self, changed: Counter[str]) -> None:
        self.numbers.made_transient(changed)

    def set_pending(self, pending_at_start: int, backlog_at_start: int) -> None:
        """What the run sets out to do, once every phase of its count is in."""
        self.numbers.pending_at_start, self.numbers.backlog_at_start = pending_at_start, backlog_at_start

    def set_blank(self, blank: int) -> None:
        """What the run's options select that it sets aside unsent, every prompt field empty, as each
        phase of its count comes in."""
        self.numbers.blank = blank

    def end(self) -> RunNumbers:
        """The run ended (its workers stopped): its numbers stop here, its time too, so the row, the
        summary, the snapshot and the metrics written after all say these."""
        if self._final is None:
            self._final = self.now()
        return self._final.copy()

    def now(self) -> RunNumbers:
        """The run's numbers as of now (a copy): its time up to now, and the servers' prefix cache and
        preemptions over its endpoints, read once; once it ended, those of its end."""
        if self._final is not None:
            return self._final.copy()
        numbers = self.numbers.copy()
        numbers.elapsed_s = max(0.0, self.clock() - self.started)
        endpoints = self.endpoint_numbers()
        cache = run_cache_numbers(endpoints)
        totals = cache_totals(endpoints)
        numbers.prefix_cache_hit_rate = cache.get("prefix_cache_hit_rate")
        numbers.prefix_cache_reachable = cache.get("prefix_cache_reachable")
        numbers.preemptions = cache.get("preemptions")
        queries = totals.get("prefix_cache_queries") if totals is not None else None
        numbers.prefix_cache_queries = None if queries is None else round(queries)
        return numbers

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
        of = f"of {counted(most, 'record')} in a row failed on the server side"
        if len(counts) == 1:
            said = f"{next(iter(failing.values()))} {of} before the run stops"
        else:
            each = ", ".join(f"{name}: {count}" for name, count in failing.items())
            said = f"{each} {of} before it leaves the rotation (the run stops when no endpoint is left)"
        return f"server failing: {said}; last: {self.last_failure}"

    def cache_words(self, numbers: RunNumbers) -> str:
        """The progress line's words on the servers' prefix cache: ``numbers``' hit rate, and the rate
        of the last few minutes when it differs."""
        recent = run_cache_numbers(self.endpoint_numbers()).get("prefix_cache_recent_hit_rate")
        return progress_words(
            {
                "prefix_cache_hit_rate": numbers.prefix_cache_hit_rate,
                "prefix_cache_recent_hit_rate": recent,
                "preemptions": numbers.preemptions,
            }
        )

    def snapshot(self) -> dict[str, Any]:
        """The numbers as of now and what only a live run has: for the snapshot file and the log."""
        numbers = self.now()
        endpoints = self.endpoint_numbers()
        failing = self.server_failing()
        said = self.cache_warnings.said
        recent = run_cache_numbers(endpoints).get("prefix_cache_recent_hit_rate")
        return {
            **numbers.to_json(),
            "in_flight": self.in_flight,
            "endpoints": endpoints,
            **({"prefix_cache_recent_hit_rate": recent} if recent is not None else {}),
            **({"prefix_cache_warnings": list(said)} if said else {}),
            **({"server_failing": failing} if failing else {}),
        }
