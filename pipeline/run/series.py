"""The run over time, kept small: a point every few seconds (records/min, requests in flight, each
endpoint's limit), at most :data:`MOST_POINTS` of them. When the run outlasts that, every other point
is dropped and the interval doubles, so a 32-hour run keeps its whole shape in the same few kilobytes
as a 10-minute one. The points go into the run's row (``runs.series``) now and then and at the end,
for ``pipeline report``'s pictures.

A point's ``records_per_min`` is the run's own up to then (its numbers' ``records_per_min``, what the
progress line said at that moment), so the last point, sampled after the run ended, says the run's
rate as its summary, status and report do; ``records_per_min_since_previous`` is the rate since the
point before, which draws the run's shape.

Where the servers count them (vLLM's ``/metrics``), a point also holds the prefix-cache hits and queries
(prompt tokens) and the preemptions since the run began, summed over the endpoints; its
``prefix_cache_hit_rate`` is the run's own up to then (its numbers', as the progress line said it), so
the last point's is the run's, as its row, ``status`` and ``report`` say it, and
``prefix_cache_hit_rate_since_previous`` is the rate since the point before. Sampling is also when a
low hit rate is said (:mod:`pipeline.run.server_cache`), once per endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from pipeline.run.server_cache import cache_totals
from pipeline.run.stats import RunStats
from pipeline.servers.cache_counters import hit_rate

FIRST_INTERVAL_S = 5.0
MOST_POINTS = 600
SAVE_EVERY_POINTS = 12  # about a minute at first: a killed run keeps most of its series


class RunSeries:
    def __init__(
        self,
        stats: RunStats,
        *,
        interval_s: float = FIRST_INTERVAL_S,
        most: int = MOST_POINTS,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self._stats = stats
        self.interval_s = interval_s
        self._most = max(2, most)
        self._sleep = sleep
        self.points: list[dict[str, Any]] = []
        self._last = (0.0, 0)  # (elapsed s, records finished) at the last point
        self._last_cache = (0.0, 0.0)  # (prefix-cache hits, queries) at the last point

    def sample(self) -> dict[str, Any]:
        """Add a point for now (and thin the series out when it is full)."""
        stats = self._stats
        numbers = stats.now()
        elapsed, finished = numbers.elapsed_s, numbers.finished
        since_s, since_finished = self._last
        span = elapsed - since_s
        endpoints = stats.endpoint_numbers()
        point = {
            "t": round(elapsed, 2),
            "done": numbers.done,
            "failed": numbers.failed,
            "records_per_min": numbers.records_per_min,
            "records_per_min_since_previous": (
                round((finished - since_finished) * 60 / span, 2) if span > 0 else None
            ),
            "in_flight": stats.in_flight,
            "limits": {name: numbers["limit"] for name, numbers in endpoints.items()},
            **self._cache_point(endpoints, numbers.prefix_cache_hit_rate),
        }
        stats.cache_warnings.check(endpoints)
        self.points.append(point)
        self._last = (elapsed, finished)
        if len(self.points) > self._most:
            # Keep every other point (the last one too), and sample half as often from now on.
            self.points = [*self.points[:-1:2], self.points[-1]]
            self.interval_s *= 2
        return point

    def _cache_point(self, endpoints: dict[str, dict[str, Any]], run_rate: float | None) -> dict[str, Any]:
        """The run's prefix-cache counters so far, its hit rate (``run_rate``, its numbers') and the hit
        rate since the last point ({}: no server counts them)."""
        totals = cache_totals(endpoints)
        if totals is None:
            return {}
        hits, queries = totals["prefix_cache_hits"], totals["prefix_cache_queries"]
        since_hits, since_queries = self._last_cache
        self._last_cache = (hits, queries)
        since = hit_rate(hits - since_hits, queries - since_queries)
        return {
            "prefix_cache_hits": round(hits),
            "prefix_cache_queries": round(queries),
            "prefix_cache_hit_rate": run_rate,
            "prefix_cache_hit_rate_since_previous": None if since is None else round(since, 4),
            "preemptions": round(totals["preemptions"]),
        }

    async def run(self, save: Callable[[list[dict[str, Any]]], Awaitable[None]]) -> None:
        """Sample until cancelled; hand the points to ``save`` every :data:`SAVE_EVERY_POINTS`."""
        taken = 0
        while True:
            self.sample()
            taken += 1
            if taken % SAVE_EVERY_POINTS == 0:
                await save(list(self.points))
            await self._sleep(self.interval_s)
