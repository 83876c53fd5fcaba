"""What `concurrency: auto` measures (:mod:`pipeline.servers.limits`): one measurement window, what a
``/metrics`` scrape says, and the controller's knobs.

A window starts at the first reply to a request sent after the last change (earlier ones belong to the
old limit: the transient). After a step of a ``descent`` or more it counts only replies to requests sent
after that first reply: the requests sent with the step run in lockstep (their prefills together, their
KV cache growing together) and tell little of the level in steady state. It lasts ``window_share`` of a
turnover after a small step, a whole one after a doubling (the limit in replies, and the replies' mean
latency in time, within ``min_window_s`` and ``max_window_s``: a fast server is not measured on a slow
one's clock), and until the standard error of its rate is below what its comparison needs (``precision``
for a small step, 5% for a doubling or more). It measures the delivery rate by Little's law,
``in flight x tokens / latency``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.servers.client_load import ClientLoad


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """One ``/metrics`` scrape; a field is None when the server does not report it."""

    running: float | None  # vllm:num_requests_running
    waiting: float | None  # vllm:num_requests_waiting
    kv_usage: float | None  # vllm:kv_cache_usage_perc, 0..1 (older vLLM: vllm:gpu_cache_usage_perc)
    preemptions_total: float | None  # vllm:num_preemptions_total, a counter


@dataclass(frozen=True, slots=True)
class Tuning:
    """The controller's knobs; the defaults are what the benchmark and the tests ran with."""

    first_level: int = 128  # the ramp's first step goes this far (a real server's knee is at 64 to 512),
    growth: float = 4.0  # then its factor per window while steps pay well, and at least that,
    sprint: float = 4.0  # and while /metrics show room (nothing waiting, the KV cache far from full)
    descent: float = 1.41  # the largest step down: below a level the curve is steeper than above
    kv_fill: float = 0.9  # a jump aims no higher than this KV use, at the KV used per running request
    min_step: float = 0.04  # the smallest relative step: the precision of the knee
    min_elasticity: float = 0.3  # an increase must return >= 0.3% throughput per 1% of concurrency
    ramp_elasticity: float = 0.35  # a step that returns this much is followed by a twice larger one
    noise: float = 0.02  # relative throughput changes below this are noise (a real client's windows)
    window_share: float = 0.25  # a window lasts this share of a turnover (the limit in replies and its
    # mean latency in time) after a small step, a whole one after a doubling or more (the server needs
    # a turnover to settle: a KV cache fills up as the new requests grow),
    min_replies: int = 8  # at least this many replies,
    min_window_s: float = 0.0  # bounded below
    max_window_s: float = 15.0  # and above (a slow server's replies count is what makes it long),
    precision: float = 0.01  # and until its rate's relative standard error is below this
    ramp_precision: float = 0.05  # the precision a window needs for a step of a doubling or more
    min_scrapes: int = 3  # /metrics scrapes before a server signal counts
    waiting_share: float = 0.5  # share of scrapes with waiting > 0 that means "sustained",
    full_share: float = 0.9  # a window counts while the requests in flight are at least this share of the
    # limit (a sample a second: a refill in progress is not a gap)
    queue_share: float = 0.05  # unless the mean number waiting is below this share of those running;
    flood_share: float = 0.25  # one scrape suffices after a step up when this share of those running waits
    kv_high: float = 0.9  # mean KV-cache use above which steps up are min_step only
    preemption_rate: float = 1.0  # preemptions per reply above which the limit backs off: a thrash
    latency_share: float = 0.5  # p90 latency above this share of the timeout backs off
    hold_latencies: float = 10.0  # mean reply latencies held at the knee between two re-probes,
    confirm_latencies: float = 3.0  # and before the first one, from a knee an earlier run found
    stale_latencies: float = 30.0  # a best level measured longer ago is measured again before a probe
    ceiling_windows: int = 12  # decisions a ceiling from a server signal lasts
    shift: float = 0.25  # throughput change at the held level that restarts the search
    slower: float = 0.1  # an earlier run's knee this much slower than it was (and than the noise) is left


DEFAULT_TUNING = Tuning()


@dataclass(slots=True)
class Window:
    """What one measurement window saw: replies after the transient, in-flight samples, scrapes."""

    limit: int
    changed_at: float
    grew: bool  # after an increase, server signals count at once (an overload shows immediately)
    precision: float  # the relative standard error its rate must reach
    share: float = 1.0  # of a turnover it lasts at least (Tuning.window_share)
    # After a large step the requests sent with it run in lockstep (their prefills together, their KV
    # growing together), unlike any later: only replies to requests sent after the first reply count.
    lockstep: bool = False
    # The run's first window: everything was sent together from nothing, and a server admits it a few a
    # step (a CPU one, a prefill per step of seconds): no queue is told before the first replies.
    from_nothing: bool = False
    started_at: float | None = None
    replies: list[tuple[float, float]] = field(default_factory=list)  # (tokens delivered, latency s)
    in_flight: list[int] = field(default_factory=list)
    scrapes: list[ServerLoad] = field(default_factory=list)
    settled_scrape: int = 0  # the first scrape after the transient
    clients: list[ClientLoad] = field(default_factory=list)  # the client's own load, a reading a scrape

    @property
    def client_bound(self) -> ClientLoad | None:
        """The client's load over the window when it was the bottleneck (its mean reading), else None."""
        load = ClientLoad.mean(self.clients)
        return load if load is not None and load.bound else None

    def reply(self, now: float, latency_s: float, tokens: int, ok: bool) -> None:
        if now - latency_s < self.changed_at - 1e-9:
            return  # sent under the old limit: its latency tells about that one
        if self.started_at is None:
            self.started_at = now  # the first reply to a request sent under this limit
            self.settled_scrape = len(self.scrapes)
        if self.lockstep and now - latency_s < self.started_at:
            return
        self.replies.append((tokens if ok else 0, latency_s))

    def full(self, share: float) -> bool:
        """Whether the limit was kept full (every sample at least ``share`` of it): else the window
        measured the client's supply (a run's start or tail), not the level."""
        return all(sample >= share * self.limit for sample in self.in_flight)

    def sample(self, in_flight: int) -> None:
        if self.started_at is not None:
            self.in_flight.append(in_flight)

    def scrape(self, load: ServerLoad) -> None:
        if self.started_at is not None or self.grew:  # not while the old, higher limit drains
            self.scrapes.append(load)

    def complete(self, now: float, tuning: Tuning) -> bool:
        if self.started_at is None or len(self.replies) < max(tuning.min_replies, self.share * self.limit):
            return False
        floor = self.share * self.mean_latency
        floor = min(max(floor, tuning.min_window_s), tuning.max_window_s)
        return now - self.started_at >= floor and self.error <= self.precision

    @property
    def mean_latency(self) -> float:
        return sum(seconds for _, seconds in self.replies) / len(self.replies) if self.replies else math.inf

    @property
    def throughput(self) -> float:
        """Little's law: requests in flight (the limit, kept full) x tokens per second of latency."""
        latency = sum(seconds for _, seconds in self.replies)
        return self.limit * sum(tokens for tokens, _ in self.replies) / latency if latency > 0 else 0.0

    def server_view(self, latest: ServerLoad | None = None) -> tuple[float, float]:
        """Beside other jobs: their requests on the server over the window (the settled scrapes' running
        and waiting, less this job's limit, kept full) and the server's throughput: this job's, scaled by
        the server's requests over its own (every request on one server decodes at one speed). A window
        shorter than the scrapes' interval has none of its own: the ``latest`` scrape stands for it (else
        its throughput would be this job's alone, a fraction of the others')."""
        settled = [s for s in self.scrapes[self.settled_scrape :] if s.running is not None]
        if not settled and latest is not None and latest.running is not None:
            settled = [latest]
        if not settled or self.limit <= 0:
            return 0.0, self.throughput
        on_server = sum((s.running or 0.0) + (s.waiting or 0.0) for s in settled) / len(settled)
        others = max(0.0, on_server - self.limit)
        return others, self.throughput * (self.limit + others) / self.limit

    @property
    def error(self) -> float:
        """The relative standard error of tokens per second of latency (a ratio estimator)."""
        count, tokens = len(self.replies), sum(tokens for tokens, _ in self.replies)
        if count < 2 or tokens <= 0:
            return math.inf if count < 2 else 0.0  # nothing delivered is exactly nothing
        rate = tokens / sum(seconds for _, seconds in self.replies)
        residuals = sum((delivered - rate * seconds) ** 2 for delivered, seconds in self.replies)
        return math.sqrt(residuals / (count - 1) / count) / (tokens / count)

    @property
    def p90_latency(self) -> float:
        ordered = sorted(seconds for _, seconds in self.replies)
        return ordered[int(0.9 * (len(ordered) - 1))] if ordered else 0.0

    @staticmethod
    def mean(values: list[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return sum(known) / len(known) if known else None
