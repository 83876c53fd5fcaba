"""A server's prefix cache and preemptions over a run: vLLM's counters (``vllm:prefix_cache_hits_total``
and ``vllm:prefix_cache_queries_total``, in prompt tokens; ``vllm:num_preemptions_total``) read at each
``/metrics`` scrape, as deltas since the run's first scrape.

A repeated system prompt is served from the cache (97% of prompt tokens measured on one), so a low hit
rate is worth a word: the record text may come before the shared part of the prompt (nothing after it
can be shared), or the server runs with prefix caching off. A counter that goes down is a server that
restarted and counts from 0: what it counted since is added, never a negative delta.

Pure logic, the clock passed in; :class:`~pipeline.servers.endpoint.Endpoint` feeds it its scrapes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.servers.scrape import PREEMPTIONS

HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"
#: Below this share of prompt tokens from the cache, the run says what may cause it.
LOW_HIT_RATE = 0.5
#: The recent hit rate is over this many seconds of scrapes.
RECENT_S = 300.0
#: Prompt tokens queried before a hit rate says anything (the first requests fill the cache).
MIN_QUERIES = 2000.0
#: Prompt tokens a server served before its hit rate may warn: the first requests only fill the cache.
WARN_AFTER_QUERIES = 10 * MIN_QUERIES
#: Replies after which a server that looked up no prompt token at all has prefix caching off (vLLM
#: counts no query then): a hit rate of 0.
OFF_AFTER_ANSWERS = 20


@dataclass(slots=True)
class CounterDelta:
    """How much a server's counter grew since it was first read, across restarts."""

    last: float | None = None
    total: float = 0.0

    def observe(self, value: float) -> None:
        if self.last is not None:
            # Lower than before: the server restarted and counts from 0; all it counted since is new.
            self.total += value - self.last if value >= self.last else value
        self.last = value


class ServerCounters:
    """One endpoint's prefix-cache and preemption counters over a run (None where the server has none)."""

    def __init__(self, recent_s: float = RECENT_S) -> None:
        self._recent_s = recent_s
        self._deltas: dict[str, CounterDelta] = {}
        self._history: deque[tuple[float, float, float]] = deque()  # (at, hits, queries) run-to-date
        self.scrapes = 0

    def observe(self, values: Mapping[str, float], now: float) -> None:
        """One scrape's values (:func:`~pipeline.servers.scrape.parse_metrics`), read at ``now``."""
        self.scrapes += 1
        for name in (HITS, QUERIES, PREEMPTIONS):
            if name in values:
                self._deltas.setdefault(name, CounterDelta()).observe(values[name])
        hits, queries = self._total(HITS), self._total(QUERIES)
        if hits is not None and queries is not None:
            self._history.append((now, hits, queries))
            while len(self._history) > 2 and self._history[1][0] <= now - self._recent_s:
                self._history.popleft()

    def _total(self, name: str) -> float | None:
        """Since the first scrape; None before a second one (a single reading tells no delta)."""
        delta = self._deltas.get(name)
        return delta.total if delta is not None and self.scrapes >= 2 else None

    @property
    def prefix_cache_hits(self) -> float | None:
        return self._total(HITS)

    @property
    def prefix_cache_queries(self) -> float | None:
        return self._total(QUERIES)

    @property
    def preemptions(self) -> int | None:
        total = self._total(PREEMPTIONS)
        return None if total is None else round(total)

    @property
    def hit_rate(self) -> float | None:
        """Prompt tokens served from the cache over those queried since the run began."""
        return hit_rate(self.prefix_cache_hits, self.prefix_cache_queries)

    @property
    def recent_hit_rate(self) -> float | None:
        """The same over the last :data:`RECENT_S` of scrapes: what the server does now."""
        if len(self._history) < 2:
            return None
        (_, first_hits, first_queries), (_, hits, queries) = self._history[0], self._history[-1]
        return hit_rate(hits - first_hits, queries - first_queries)

    def as_dict(self, answers: int = 0) -> dict[str, float | int | None]:
        """For the endpoint's numbers (progress, snapshot, Prometheus, the run's series); ``answers``:
        the replies it gave this run (with no query at all, prefix caching is off)."""
        hits, queries = self.prefix_cache_hits, self.prefix_cache_queries
        return {
            "prefix_cache_hits": None if hits is None else round(hits),
            "prefix_cache_queries": None if queries is None else round(queries),
            "prefix_cache_hit_rate": _rounded(hit_rate(hits, queries, answers)),
            "prefix_cache_recent_hit_rate": _rounded(self.recent_hit_rate),
            "preemptions": self.preemptions,
        }


def hit_rate(hits: float | None, queries: float | None, answers: float = 0) -> float | None:
    """Hits over queries; None when unknown or when too few prompt tokens were queried to say. No query
    at all over ``answers`` replies (:data:`OFF_AFTER_ANSWERS` or more) is prefix caching off: 0."""
    if hits is None or queries is None:
        return None
    if queries == 0 and answers >= OFF_AFTER_ANSWERS:
        return 0.0
    if queries < MIN_QUERIES:
        return None
    return min(1.0, max(0.0, hits / queries))


def low_hit_rate_warning(rate: float | None, where: str, queries: float | None = None) -> str | None:
    """What a hit rate below :data:`LOW_HIT_RATE` on the server at ``where`` may come from, else None;
    with ``queries``, only once :data:`WARN_AFTER_QUERIES` prompt tokens were (or none: caching off)."""
    if rate is None or rate >= LOW_HIT_RATE:
        return None
    if queries is not None and 0 < queries < WARN_AFTER_QUERIES:
        return None
    return (
        f"prefix-cache hit rate {rate:.0%}: the record text may come before the shared part of the "
        f"prompt, or prefix caching is off on {where}"
    )


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 4)
