"""The run's prefix-cache hit rate and preemptions over its endpoints, for the progress line, the snapshot
``status`` reads, Prometheus and the run's series; and the warning, said once per endpoint, when the hit
rate is low for what this job can reach there (its shared prefix over its prompt:
:func:`~pipeline.servers.cache_counters.reachable_hit_rate`).

Each endpoint counts its own from its ``/metrics`` scrapes
(:class:`~pipeline.servers.cache_counters.ServerCounters`, in its numbers); a server without them (a
proxy) has None there and adds nothing: the run then shows no hit rate, and says nothing of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from pipeline.servers.cache_counters import hit_rate, low_hit_rate_warning

log = structlog.get_logger("pipeline.run.server_cache")


def cache_totals(endpoints: Mapping[str, Mapping[str, Any]]) -> dict[str, float] | None:
    """Hits, queries (prompt tokens) and preemptions summed over the endpoints that report them."""
    counted = [n for n in endpoints.values() if n.get("prefix_cache_queries") is not None]
    preempting = [n for n in endpoints.values() if n.get("preemptions") is not None]
    if not counted and not preempting:
        return None
    return {
        "prefix_cache_hits": sum(n.get("prefix_cache_hits") or 0 for n in counted),
        "prefix_cache_queries": sum(n["prefix_cache_queries"] for n in counted),
        "preemptions": sum(n["preemptions"] for n in preempting),
    }


def reachable_over(endpoints: Mapping[str, Mapping[str, Any]]) -> float | None:
    """The hit rate the job can reach over its endpoints: each one's (its shared prefix over its prompts),
    weighted by the prompt tokens it looked up; None where none says."""
    reaching = [
        (n["prefix_cache_reachable"], n.get("prefix_cache_queries") or 0)
        for n in endpoints.values()
        if n.get("prefix_cache_reachable") is not None
    ]
    weight = sum(queries for _, queries in reaching)
    return round(sum(r * q for r, q in reaching) / weight, 4) if weight else None


def run_cache_numbers(endpoints: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``prefix_cache_hit_rate`` (since the run began), ``prefix_cache_recent_hit_rate`` (the last few
    minutes: the endpoints' own, weighted by their queries), ``prefix_cache_reachable`` (what the job's
    prompts allow) and ``preemptions``; {} without counters."""
    totals = cache_totals(endpoints)
    if totals is None:
        return {}
    rate = hit_rate(totals["prefix_cache_hits"], totals["prefix_cache_queries"])
    recent = [
        (n["prefix_cache_recent_hit_rate"], n.get("prefix_cache_queries") or 0)
        for n in endpoints.values()
        if n.get("prefix_cache_recent_hit_rate") is not None
    ]
    weight = sum(queries for _, queries in recent)
    return {
        "prefix_cache_hit_rate": None if rate is None else round(rate, 4),
        "prefix_cache_recent_hit_rate": round(sum(r * q for r, q in recent) / weight, 4) if weight else None,
        "prefix_cache_reachable": reachable_over(endpoints),
        "preemptions": int(totals["preemptions"]),
    }


def cache_warnings(endpoints: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A warning for each endpoint whose hit rate is low for what the job can reach there, once it
    served enough prompt tokens to tell."""
    warnings = []
    for name, numbers in endpoints.items():
        where, queries = str(numbers.get("base_url", name)), numbers.get("prefix_cache_queries")
        rate, reachable = numbers.get("prefix_cache_hit_rate"), numbers.get("prefix_cache_reachable")
        warning = low_hit_rate_warning(rate, reachable, where, queries)
        if warning is not None:
            warnings.append(warning)
    return warnings


class CacheWarnings:
    """Logs each endpoint's low-hit-rate warning once per run, and keeps what it said for ``status``."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self._warned: set[str] = set()

    def check(self, endpoints: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """The warnings not said yet (logged now)."""
        new = []
        for name, numbers in endpoints.items():
            if name in self._warned:
                continue
            for warning in cache_warnings({name: numbers}):
                self._warned.add(name)
                log.warning(warning, endpoint=name)
                new.append(warning)
        self.said.extend(new)
        return new


def progress_words(numbers: Mapping[str, Any]) -> str:
    """`` · prefix cache 97% · preemptions 3`` for the progress line; "" without counters."""
    rate, preemptions = numbers.get("prefix_cache_hit_rate"), numbers.get("preemptions")
    words = ""
    if rate is not None:
        recent = numbers.get("prefix_cache_recent_hit_rate")
        now = f" ({recent:.0%} lately)" if recent is not None and abs(recent - rate) >= 0.05 else ""
        words += f" · prefix cache {rate:.0%}{now}"
    if preemptions:
        words += f" · preemptions {preemptions:,}"
    return words
