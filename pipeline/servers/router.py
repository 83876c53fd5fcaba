"""The router: every request goes to the endpoint with free capacity that is least loaded relative to its
limit; an endpoint that goes away is held (probed in the background until it answers again) while the
others go on, and the run gives up only when every endpoint has been gone for ``give_up_after_s``.

In the background it also moves the limits of ``concurrency: auto`` endpoints (every ``TICK_S``, with
their server's ``/metrics`` and the client's own load, its event loop's lag at these ticks and its CPU
share, every ``METRICS_EVERY_S``), and takes a stalled endpoint out of the
rotation when another one is up: its requests in flight are cancelled and sent elsewhere at no cost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from pipeline.errors import EndpointUnreachableError, FatalRunError, ServerDownError, first_error
from pipeline.servers.client_load import ClientLoad, ClientMeter
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.http import SMALL_REQUEST_TIMEOUT_S, http_client

log = structlog.get_logger("pipeline.servers.router")

PROBE_INITIAL_S = 1.0
PROBE_MAX_S = 5.0  # a probe is one cheap request; a restarted server should not sit idle long
# How often auto's limits move and read /metrics. A decision waits for a tick and a server signal for
# three scrapes: at 1 s and 5 s, a server whose replies take a second lost a fifth of a short first run
# (0.84 of the best fixed level over 30 replies' latency, benchmarks/adaptive_concurrency.py). A scrape
# is one small GET of vLLM's text metrics; an update is arithmetic.
TICK_S = 0.25
METRICS_EVERY_S = 1.0
COUNTERS_EVERY_S = 5.0  # a fixed concurrency reads only the prefix-cache and preemption counters
CONFIRM_FRESH_S = 1.0  # many requests lose their connection at once: one probe answers for all


class Router:
    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        give_up_after_s: float,
        stall_after_s: float,
        probe_sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        self.endpoints = list(endpoints)
        self._give_up_after_s = give_up_after_s
        self._stall_after_s = stall_after_s
        self._probe_sleep = probe_sleep
        self._clock = clock
        self._changed = anyio.Event()
        self._gave_up: ServerDownError | None = None
        self._tasks: TaskGroup | None = None
        self._confirming = {endpoint.name: anyio.Lock() for endpoint in self.endpoints}
        self._confirmed_up_at: dict[str, float] = {}
        self._waiting = 0  # requests waiting for an endpoint with room

    # -- the workers' side -------------------------------------------------------------------------

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[Endpoint]:
        """Wait for an endpoint with room; it counts this request until the block ends."""
        endpoint = await self._acquire()
        try:
            yield endpoint
        finally:
            endpoint.in_use -= 1
            self._notify()

    async def _acquire(self) -> Endpoint:
        while True:
            if self._gave_up is not None:
                raise self._gave_up
            ready = [endpoint for endpoint in self.endpoints if endpoint.has_room]
            if ready:
                best = min(ready, key=lambda endpoint: endpoint.load)
                best.in_use += 1
                return best
            self._waiting += 1
            try:
                await self._changed.wait()
            finally:
                self._waiting -= 1

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def most_in_flight(self) -> int:
        """The most requests the endpoints may ever have in flight together (auto: its maximum)."""
        return sum(endpoint.config.most_in_flight for endpoint in self.endpoints)

    def others_up(self, endpoint: Endpoint) -> bool:
        return any(other.health.up for other in self.endpoints if other is not endpoint)

    def report_down(self, endpoint: Endpoint, reason: str, *, stalled: bool = False) -> None:
        """Take ``endpoint`` out of the rotation and probe it back in the background."""
        if not endpoint.health.mark_down(reason, stalled=stalled):
            return
        endpoint.stats.outages += 1
        where = "the others go on" if self.others_up(endpoint) else "holding requests until it answers"
        log.warning(f"endpoint down: {where}", endpoint=endpoint.name, reason=reason)
        if stalled:
            endpoint.evacuate()
        assert self._tasks is not None, "report_down needs a running router"
        self._tasks.start_soon(self._probe_until_up, endpoint)
        self._notify()

    async def confirm_lost(self, endpoint: Endpoint, reason: str) -> bool:
        """A connection broke mid-request: is the server gone (then it is reported down), or was it one
        request's bad luck? One probe answers for every request that broke at the same moment."""
        async with self._confirming[endpoint.name]:
            if not endpoint.health.up:
                return True
            if self._clock() - self._confirmed_up_at.get(endpoint.name, float("-inf")) < CONFIRM_FRESH_S:
                return False
            if await endpoint.client.probe():
                self._confirmed_up_at[endpoint.name] = self._clock()
                return False
            self.report_down(endpoint, reason)
            return True

    def record_finished(self, endpoint: Endpoint, *, server_side_failure: bool, error: str) -> None:
        """Count a record's outcome on the endpoint of its last attempt. Too many server-side failures in
        a row take it out of the rotation, or, with no other endpoint up, end the run."""
        if not endpoint.health.record_finished(server_side_failure=server_side_failure):
            return
        failures = endpoint.health.failures_in_a_row
        if not self.others_up(endpoint):
            raise FatalRunError(
                f"{failures} records in a row failed on the server side at {endpoint.config.base_url} "
                f"(last: {error}); stopping the run, results so far are saved"
            )
        self.report_down(endpoint, f"{failures} records in a row failed there (last: {error})", stalled=True)

    # -- the background ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Probe, adapt and watch until cancelled (start it in the run's task group)."""
        async with http_client(timeout_s=SMALL_REQUEST_TIMEOUT_S) as http, anyio.create_task_group() as tasks:
            self._tasks = tasks
            for endpoint in self.endpoints:
                if not endpoint.health.up:
                    tasks.start_soon(self._probe_until_up, endpoint)
                if endpoint.lease is not None:  # the pool of this machine's jobs on the server
                    tasks.start_soon(endpoint.lease.run, TICK_S)
            task_status.started()
            ticks, meter = 0, ClientMeter(self._clock)
            while True:
                asleep = self._clock()
                await anyio.sleep(TICK_S)
                meter.lagged(self._clock() - asleep - TICK_S)  # how late the loop woke: its lag
                ticks += 1
                self._adapt()
                self._watch_stalls()
                if ticks % int(METRICS_EVERY_S / TICK_S) == 0:
                    counters = ticks % int(COUNTERS_EVERY_S / TICK_S) == 0
                    self._client_load(meter.read())
                    for endpoint in self.endpoints:
                        if endpoint.metrics_available and (endpoint.controller is not None or counters):
                            tasks.start_soon(endpoint.read_server_load, http)

    def _client_load(self, load: ClientLoad) -> None:
        for endpoint in self.endpoints:
            if endpoint.controller is not None:
                endpoint.controller.on_client_load(load)

    def _adapt(self) -> None:
        for endpoint in self.endpoints:
            limit = endpoint.limit
            change = endpoint.adapt(self._waiting)
            if endpoint.limit > limit:  # a pool's member: its part grew
                self._notify()
            if change is not None:
                log.info(
                    "concurrency limit changed",
                    endpoint=endpoint.name,
                    old=change.old,
                    new=change.new,
                    reason=change.reason,
                )
                self._notify()

    def _watch_stalls(self) -> None:
        for endpoint in self.endpoints:
            quiet_s = endpoint.stalled_for_s()
            if endpoint.health.up and quiet_s >= self._stall_after_s and self.others_up(endpoint):
                reason = f"stalled: {endpoint.in_use} requests in flight, no answer for {quiet_s:.0f} s"
                self.report_down(endpoint, reason, stalled=True)

    async def _probe_until_up(self, endpoint: Endpoint) -> None:
        wait = PROBE_INITIAL_S
        while True:
            await self._probe_sleep(wait)
            client = endpoint.client
            if await (client.probe_completion() if endpoint.health.probe_completion else client.probe()):
                since = endpoint.health.down_since
                down_s = 0.0 if since is None else self._clock() - since
                endpoint.rejoined()
                log.warning(
                    "endpoint answers again: back in the rotation",
                    endpoint=endpoint.name,
                    down_s=round(down_s, 1),
                )
                self._notify()
                return
            if self._all_down_for() >= self._give_up_after_s:
                self._give_up()
                return
            wait = min(PROBE_MAX_S, wait * 2)

    def _all_down_for(self) -> float:
        if any(endpoint.health.up for endpoint in self.endpoints):
            return 0.0
        now = self._clock()
        downs = [endpoint.health.down_since for endpoint in self.endpoints]
        return now - max(now if since is None else since for since in downs)

    def _give_up(self) -> None:
        reasons = "; ".join(f"{endpoint.name}: {endpoint.health.reason}" for endpoint in self.endpoints)
        self._gave_up = ServerDownError(
            f"every endpoint stayed unreachable for {self._all_down_for():.0f} s "
            f"(operations.server_down_abort_s); {reasons}"
        )
        self._notify()

    # -- before the run --------------------------------------------------------------------------------

    async def check_servers(self) -> None:
        """Preflight every endpoint at once. A model an endpoint does not serve, or a refused key, ends
        the run here; an endpoint that does not answer starts held (it joins when it answers), and with
        none answering the run does not start."""
        errors: dict[str, EndpointUnreachableError] = {}

        async def check(endpoint: Endpoint) -> None:
            try:
                await endpoint.client.check_server()
            except EndpointUnreachableError as error:
                errors[endpoint.name] = error

        fatal: FatalRunError | None = None
        try:
            async with anyio.create_task_group() as checks:
                for endpoint in self.endpoints:
                    checks.start_soon(check, endpoint)
        except* FatalRunError as group:  # a wrong model or a refused key: not a matter of waiting
            fatal = first_error(group)
        if fatal is not None:  # raised here: inside except*, CPython before 3.11.4 wraps it in a group
            raise fatal
        if len(errors) == len(self.endpoints):
            raise next(iter(errors.values()))
        for endpoint in self.endpoints:
            if endpoint.name in errors:
                endpoint.health.mark_down(str(errors[endpoint.name]))
                log.warning(
                    "endpoint does not answer: starting without it",
                    endpoint=endpoint.name,
                    error=str(errors[endpoint.name]),
                )
