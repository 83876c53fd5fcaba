"""One server as a run uses it: its client, its concurrency limit (fixed, or adaptive with ``auto``), its
health, its in-flight requests and its numbers. The :mod:`pipeline.servers.router` owns the endpoints.

:class:`EndpointHealth` is the one place that says whether a server is up: a refused connection, a lost
connection that a probe confirms, a stall, or too many server-side failures in a row mark it down; only
a probe that answers marks it up again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import httpx2
import structlog

from pipeline.servers.cache_counters import ServerCounters, reachable_hit_rate
from pipeline.servers.capacity import ServerReading
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.lease import SHARED, Lease, pool_address
from pipeline.servers.limits import AdaptiveLimit, LimitChange
from pipeline.servers.replies import Reply
from pipeline.servers.scrape import metrics_url, parse_metrics, server_load
from pipeline.servers.slot_pool import Member
from pipeline.servers.window import ServerLoad

log = structlog.get_logger("pipeline.servers.endpoint")


class EndpointEvacuatedError(Exception):
    """The request was cancelled because its endpoint stalled: it goes to another one, at no cost."""


@dataclass(slots=True)
class EndpointStats:
    """Per-endpoint numbers for progress, status and Prometheus (label ``endpoint``)."""

    requests: int = 0
    answers: int = 0
    prompt_tokens: int = 0  # the replies', as the server counted them
    output_tokens: int = 0
    timeouts: int = 0
    outages: int = 0
    last_answer_at: float = field(default_factory=time.monotonic)

    def as_dict(self, endpoint: Endpoint) -> dict[str, object]:
        return {
            "base_url": endpoint.config.base_url,
            "up": endpoint.health.up,
            "limit": endpoint.limit,
            "in_flight": endpoint.in_use,
            "requests": self.requests,
            "answers": self.answers,
            "output_tokens": self.output_tokens,
            "timeouts": self.timeouts,
            "outages": self.outages,
            **endpoint.server_counters.as_dict(),
            "prefix_cache_reachable": self.reachable_hit_rate(endpoint.reading),
        }

    def reachable_hit_rate(self, reading: ServerReading | None) -> float | None:
        """What the prefix cache can serve of this job's prompts here: the prefix the server counted
        before the first request over the mean prompt of its replies (None before either)."""
        shared = reading.prefix_tokens if reading is not None else None
        return reachable_hit_rate(shared, self.prompt_tokens / self.answers if self.answers else None)


class EndpointHealth:
    """Up or down, why, and since when. Every decision about a server's health is made here."""

    def __init__(self, *, abort_after_failures: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.up = True
        self.reason: str | None = None
        self.down_since: float | None = None
        self.probe_completion = False  # a stall: only a real completion proves the engine works
        self._clock = clock
        self._abort_after = abort_after_failures
        self._failures_in_a_row = 0

    def mark_down(self, reason: str, *, stalled: bool = False) -> bool:
        """True if this took the endpoint down (it was up)."""
        if not self.up:
            return False
        self.up, self.reason, self.down_since = False, reason, self._clock()
        self.probe_completion = stalled
        return True

    def mark_up(self) -> None:
        self.up, self.reason, self.down_since = True, None, None
        self._failures_in_a_row = 0

    def record_finished(self, *, server_side_failure: bool) -> bool:
        """Count a record's outcome; true when enough server-side failures in a row say it is broken."""
        self._failures_in_a_row = self._failures_in_a_row + 1 if server_side_failure else 0
        return self._failures_in_a_row >= self._abort_after

    @property
    def failures_in_a_row(self) -> int:
        return self._failures_in_a_row


class Endpoint:
    """A server: ``client`` sends, ``limit``/``in_use`` bound the requests in flight, ``health`` says
    whether to send at all, and the adaptive ``controller`` (with ``auto``) moves the limit."""

    def __init__(
        self,
        config: EndpointConfig,
        client: LLMClient,
        *,
        abort_after_failures: int,
        timeout_s: float,
        known_knee: KneeMemory | None = None,
        clock: Callable[[], float] = time.monotonic,
        pooled: bool = False,
    ) -> None:
        """``pooled``: with `auto`, this job takes its requests from the pool of this machine's jobs on
        the server (:meth:`join_pool`, :mod:`~pipeline.servers.lease`)."""
        self.config = config
        self.client = client
        self.health = EndpointHealth(abort_after_failures=abort_after_failures, clock=clock)
        self._timeout_s = timeout_s
        self._clock = clock
        auto = config.concurrency is None
        self.controller: AdaptiveLimit | Member | None = self._new_controller(known_knee) if auto else None
        self.limit = self.controller.limit if self.controller else config.most_in_flight
        self.in_use = 0
        self.stats = EndpointStats(last_answer_at=clock())
        self._scopes: set[anyio.CancelScope] = set()
        # Auto reads the server's load there; every run its prefix cache and preemptions.
        self.metrics_available = True
        self.server_counters = ServerCounters()
        self.reading: ServerReading | None = None  # what it said of itself before the first request
        self.lease: Lease | None = None
        self._pooled = pooled and auto and SHARED

    def _new_controller(self, known_knee: KneeMemory | None) -> AdaptiveLimit:
        maximum = self.config.max_concurrency
        return AdaptiveLimit(
            maximum=maximum, timeout_s=self._timeout_s, known_knee=known_knee, clock=self._clock
        )

    def read_before_start(self, reading: ServerReading) -> None:
        """What the server said of itself before the run's first request (``read_server``): kept for the
        preflight's lines and the prefix's share of the prompt, and its counters' first values, so that
        a run that sends everything before its first scrape still counts every hit and query."""
        self.reading = reading
        if reading.metrics:
            self.server_counters.observe(reading.values, self._clock())

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def context_length(self) -> int | None:
        """Prompt and answer tokens one request may take here, or None when unknown (decided by the
        client: a 400 naming it, else the job's max_model_len, else the server's /v1/models)."""
        return self.client.context_length

    @property
    def found_knee(self) -> KneeMemory | None:
        """What `concurrency: auto` learned on this server in this run, for the next run to start from:
        the knee it bracketed, or else the best level it measured and the levels that did worse (None
        with a fixed concurrency, or before anything was measured)."""
        return self.controller.learned if self.controller is not None else None

    @property
    def deciding(self) -> AdaptiveLimit | None:
        """The search that sets this endpoint's limit, when it runs in this process: its own, or the pool's
        it hosts (None: a fixed concurrency, or another job hosts the pool)."""
        controller = self.controller
        if isinstance(controller, Member):
            return controller.pool.controller if controller.pool is not None else None
        return controller

    @property
    def has_room(self) -> bool:
        return self.health.up and self.in_use < self.limit

    @property
    def load(self) -> float:
        return self.in_use / self.limit

    @contextmanager
    def request(self) -> Iterator[anyio.CancelScope]:
        """One request in flight here; :meth:`evacuate` cancels it (then EndpointEvacuatedError)."""
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        self.stats.requests += 1
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught:
            raise EndpointEvacuatedError(f"{self.name} stalled; the request goes to another endpoint")

    def evacuate(self) -> int:
        """Cancel the requests in flight here (their records go back to the others, at no cost)."""
        for scope in list(self._scopes):
            scope.cancel()
        return len(self._scopes)

    def answered(self, reply: Reply, latency_s: float) -> None:
        self.stats.answers += 1
        self.stats.prompt_tokens += reply.prompt_tokens or 0
        self.stats.output_tokens += reply.completion_tokens or 0
        self.stats.last_answer_at = self._clock()
        if self.controller is not None:
            self.controller.on_finished(
                latency_s=latency_s,
                output_tokens=reply.completion_tokens or 0,
                prompt_tokens=reply.prompt_tokens or 0,
                ok=True,
            )

    def refused_by_server(self, latency_s: float) -> None:
        """An HTTP error status: the server answered, but delivered nothing."""
        self.stats.last_answer_at = self._clock()
        if self.controller is not None:
            self.controller.on_finished(latency_s=latency_s, output_tokens=0, prompt_tokens=0, ok=False)

    def rejoined(self) -> None:
        """A probe answered: back in the rotation, a stall counted from now, not from before the outage."""
        self.health.mark_up()
        self.stats.last_answer_at = self._clock()

    def timed_out(self) -> None:
        self.stats.timeouts += 1
        if self.controller is not None:
            self.controller.on_timeout()

    def stalled_for_s(self) -> float:
        """How long requests have been in flight here without any answer (0 with none in flight)."""
        return self._clock() - self.stats.last_answer_at if self.in_use else 0.0

    def adapt(self, waiting: int = 0) -> LimitChange | None:
        """Let the adaptive controller decide (``waiting``: requests waiting for a slot); the new limit
        applies to the next request."""
        if self.controller is None:
            return None
        change = self.controller.update(in_flight=self.in_use, waiting=waiting)
        self.limit = self.controller.limit
        return change

    async def read_server_load(self, http: httpx2.AsyncClient) -> ServerLoad | None:
        """One scrape of the server's /metrics for the controller and the prefix-cache counters; a server
        without them (a proxy) is asked no more."""
        try:
            response = await http.get(metrics_url(self.config.base_url))
        except httpx2.HTTPError:
            return None
        try:
            values = parse_metrics(response.text) if response.status_code == 200 else None
        except ValueError:  # a 200 that is no Prometheus text
            values = None
        if values is None:
            self.metrics_available = False
            without = "the adaptive limit works from latency and throughput" if self.controller else ""
            log.info(f"no /metrics: {without or 'no prefix-cache hit rate shown'}", endpoint=self.name)
            return None
        self.server_counters.observe(values, self._clock())
        load = server_load(values)
        if self.controller is not None:
            self.controller.on_server_load(load)
        return load

    async def join_pool(self, scrape_every_s: float) -> None:
        """Take this job's requests from the pool of this machine's `auto` jobs on the server, hosted here
        with this endpoint's controller as it starts, or by the job that came first; when neither works,
        this job keeps its own limit (and says so)."""
        controller = self.controller
        if not self._pooled or not isinstance(controller, AdaptiveLimit):
            return
        lease = Lease(
            pool_address(self.config.base_url),
            self._new_controller,
            clock=self._clock,
            scrape_every_s=scrape_every_s,
        )
        try:
            self.controller = await lease.open(controller)
        except OSError as error:
            log.warning(f"this job keeps its own limit: no pool of this machine's jobs ({error})")
            return
        self.lease, self.limit = lease, self.controller.limit
        if not lease.hosting:
            member = lease.member
            log.info(
                "concurrency auto: this job takes its part of the limit the jobs on this machine share",
                endpoint=self.name,
                jobs=member.jobs,
                limit=member.pool_limit,
                part=member.limit,
            )

    def leave_pool(self) -> None:
        """The run is done with this server: its slots go to the other jobs."""
        if self.lease is not None:
            self.lease.close()
