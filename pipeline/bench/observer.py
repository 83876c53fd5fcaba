"""The server's Prometheus ``/metrics`` during a level: peaks of the gauges, deltas of the counters."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from pipeline.servers.http import SMALL_REQUEST_TIMEOUT_S, http_client, text_if_ok
from pipeline.servers.scrape import GAUGES, SPEED, parse_metrics


@dataclass(slots=True)
class ServerObservation:
    available: bool = False
    peaks: dict[str, float] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def peak(self, name: str) -> float | None:
        return self.peaks.get(name) if self.available else None

    def delta(self, name: str) -> float | None:
        if not self.available or name not in self.first or name not in self.last:
            return None
        return self.last[name] - self.first[name]

    @property
    def time_scale(self) -> float:
        """Server seconds per client second: the simulator's speed, else 1."""
        return self.last.get(SPEED, 1.0) if self.available else 1.0

    @property
    def prefix_hit_rate(self) -> float | None:
        queries, hits = self.delta("vllm:prefix_cache_queries"), self.delta("vllm:prefix_cache_hits")
        return hits / queries if queries and hits is not None else None


async def watch(metrics_url: str, observation: ServerObservation, interval_s: float = 0.5) -> None:
    """Sample until cancelled; a server without /metrics leaves the observation unavailable."""
    async with http_client(timeout_s=SMALL_REQUEST_TIMEOUT_S) as client:
        while True:
            text = await text_if_ok(client, metrics_url)
            if text is not None:
                values = parse_metrics(text)
                observation.available = True
                observation.first = observation.first or values
                observation.last = values
                for name in GAUGES:
                    if name in values:
                        observation.peaks[name] = max(observation.peaks.get(name, 0.0), values[name])
            await anyio.sleep(interval_s)
