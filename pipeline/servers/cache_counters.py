"""A server's prefix cache and preemptions over a run: vLLM's counters (``vllm:prefix_cache_hits_total``
and ``vllm:prefix_cache_queries_total``, in prompt tokens; ``vllm:num_preemptions_total``) read once
before the run's first request and at each ``/metrics`` scrape, as deltas since that first reading (a
trial that sends everything before the first scrape counts it all).

What the cache can serve of a job is its shared prefix (system prompt, examples, template) over its
prompt (:func:`reachable_hit_rate`): 88% for short records after a long prefix, 30% for long ones.
A hit rate well below that (under :data:`LOW_SHARE_OF_REACHABLE` of it) is worth a word: the record
text may come before the shared part of the prompt (nothing after it can be shared), or the server
evicts the prefix between requests. With prefix caching off vLLM looks nothing up and counts no query:
the rate is unknown, not 0 (``pipeline check`` and the run's preflight say that caching is off). A
counter that goes down is a server that restarted and counts from 0: what it counted since is added,
never a negative delta.

Pure logic, the clock passed in; :class:`~pipeline.servers.endpoint.Endpoint` feeds it its scrapes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.servers.scrape import PREEMPTIONS

HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"
#: Below this share of what the job can reach (its shared prefix over its prompt), the run says what may
#: cause it: 88% reachable and 46% served is told; 30% reachable and 27% served is not.
LOW_SHARE_OF_REACHABLE = 0.75
#: The recent hit rate is over this many seconds of scrapes.
RECENT_S = 300.0
#: Prompt tokens queried before a hit rate says anything (the first requests fill the cache).
MIN_QUERIES = 2000.0
#: Prompt tokens a server served before its hit rate may warn: the first requests only fill the cache.
WARN_AFTER_QUERIES = 10 * MIN_QUERIES


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
        """One reading's values (:func:`~pipeline.servers.scrape.parse_metrics`), read at ``now``: the
        first is where the run's counts start."""
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
        """Since the first reading; None before a second one (a single reading tells no delta)."""
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

    def as_dict(self) -> dict[str, float | int | None]:
        """For the endpoint's numbers (progress, snapshot, Prometheus, the run's series)."""
        hits, queries = self.prefix_cache_hits, self.prefix_cache_queries
        return {
            "prefix_cache_hits": None if hits is None else round(hits),
            "prefix_cache_queries": None if queries is None else round(queries),
            "prefix_cache_hit_rate": _rounded(hit_rate(hits, queries)),
            "prefix_cache_recent_hit_rate": _rounded(self.recent_hit_rate),
            "preemptions": self.preemptions,
        }


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    """Hits over queries; None when unknown or when too few prompt tokens were looked up to say (with
    prefix caching off, none are)."""
    if hits is None or queries is None or queries < MIN_QUERIES:
        return None
    return min(1.0, max(0.0, hits / queries))


def reachable_hit_rate(shared_prefix_tokens: float | None, prompt_tokens: float | None) -> float | None:
    """The most of a job's prompt tokens a prefix cache can serve: its shared prefix (the fixed part, as
    the server counts it) over its prompt (the replies' mean, as the server counted them); None unknown."""
    if shared_prefix_tokens is None or not prompt_tokens:
        return None
    return round(min(1.0, shared_prefix_tokens / prompt_tokens), 4)


def low_hit_rate_warning(
    rate: float | None, reachable: float | None, where: str, queries: float | None = None
) -> str | None:
    """What a hit rate below :data:`LOW_SHARE_OF_REACHABLE` of what the job can reach (``reachable``) on
    the server at ``where`` may come from, else None; with ``queries``, only once
    :data:`WARN_AFTER_QUERIES` prompt tokens were looked up."""
    if rate is None or reachable is None or rate >= LOW_SHARE_OF_REACHABLE * reachable:
        return None
    if queries is not None and queries < WARN_AFTER_QUERIES:
        return None
    return (
        f"prefix-cache hit rate {rate:.0%} where this job's shared prefix is {reachable:.0%} of its prompt: "
        f"the record text may come before the shared part of the prompt, or {where} evicts the prefix "
        "between requests (other prompts, or more requests in flight than its KV cache holds)"
    )


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 4)
