"""A closed-loop load harness over the simulator's in-process engine: keep ``limit`` requests in flight
at a fixed concurrency or under an :class:`~pipeline.servers.limits.AdaptiveLimit`, fed as an endpoint
feeds it (every reply, every timeout, a ``/metrics`` scrape and ``update`` at the router's cadences).

By default time is virtual: the event loop's clock jumps to its next timer whenever nothing is ready,
so a two-hour scenario at c=256 takes seconds of CPU and no real waiting, and a run is deterministic.
``Scenario.real_time`` waits for real instead.

Two clocks, as with a real client of ``pipeline sim --speed S``: the server's runs ``Scenario.speed``
times faster than the client's, which the controller, the timeout and the cadences of scrapes and
updates use (a 2-minute reply at ``speed`` 120 takes one second of the client's, which still scrapes
every second). Durations and every number reported are in the profile's own (unscaled) seconds.

The server collapses past its KV cache (the simulator engine's ``thrash``,
:data:`~pipeline.sim.engine.KV_THRASH`), as a real one does: a dense 49B gave 695 tok/s at c=256 and
515 at c=320, past its cache. Without it the engine flattens there (it admits what fits and preempts
the newest, whose recomputation is a cheap prefill), which hides what overshooting costs. vLLM admits
a request when its prompt fits, so past the cache every decode step
must free blocks: it preempts running requests and recomputes them (prompt and all they had generated)
again and again, and the share of the GPU's time spent on that grows with how far the requests the
scheduler would run (running, and waiting up to ``--max-num-seqs``) overcommit the cache by the tokens
they will hold when done. The model: decoding runs at ``(cache / demanded) ** thrash`` of its speed
when ``demanded`` exceeds the cache. ``thrash`` 1.35 is the 49B's fall: (256 / 320) ** 1.35 = 0.74 =
515 / 695; twice the fitting concurrency then delivers 0.39 of the peak. ``Scenario.thrash`` 0 is the
engine alone.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.bench.family_server import FamilyServer, FamilySpec
from pipeline.bench.step_server import SERVERS, QueuedPastCache, StepServer
from pipeline.bench.step_server import Numbers as ServerNumbers
from pipeline.bench.virtual_clock import VirtualClockLoop
from pipeline.servers.capacity import RequestFit
from pipeline.servers.client_load import ClientLoad, ClientMeter
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.limits import AdaptiveLimit, LimitChange
from pipeline.servers.router import METRICS_EVERY_S, TICK_S
from pipeline.servers.slot_pool import Member
from pipeline.servers.window import DEFAULT_TUNING, ServerLoad, Tuning
from pipeline.sim.engine import KV_THRASH, Engine, Sequence
from pipeline.sim.profiles import PROFILES, REFERENCE_OUTPUT_TOKENS, REFERENCE_PROMPT_TOKENS

#: The collapse past the KV cache: decoding at (cache / demanded) ** THRASH of its speed (the 49B's fall).
THRASH = KV_THRASH
#: The server models a scenario may run on from a profile: the simulator's engine, and a second one
#: written apart from it.
SERVER_MODELS = ("sim", "steps")
#: The third, from parameters instead (``Scenario.family``): one server of a family drawn at random.
FAMILY = "family"


class ServerModel(Protocol):
    """A server the closed loop drives: the simulator's :class:`~pipeline.sim.engine.Engine` or the
    :class:`~pipeline.bench.step_server.StepServer`."""

    speed: float
    kv_cache_tokens: int

    @property
    def metrics(self) -> ServerNumbers: ...
    def now(self) -> float: ...
    async def generate(self, sequence: Sequence, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Workload:
    """The requests: the profiles' reference shape by default, with answers of varying length. They share
    no blocks of the prefix cache: the profiles' curves and KV caches were measured with prompts that
    share nothing, as their decode speed assumes (every reference prompt prefilled whole)."""

    prompt_tokens: int = REFERENCE_PROMPT_TOKENS
    prefix_tokens: int = 1000  # the prompt's fixed part, as a run counts it before any reply (fit_start)
    output_tokens: int = REFERENCE_OUTPUT_TOKENS  # reasoning and answer, on average
    output_spread: float = 0.25  # each answer is output_tokens x (1 ± spread), uniformly
    seed: int = 0

    def sequence(self, rng: random.Random) -> Sequence:
        spread = self.output_spread * (2 * rng.random() - 1)
        output = max(1, round(self.output_tokens * (1 + spread)))
        return Sequence(self.prompt_tokens, output)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One run's setting: the server (a profile, with overrides), the requests, the client's timeout and
    cadences, and the controller's bounds and tuning (used when the run is ``auto``)."""

    profile: str
    duration_s: float  # the profile's seconds
    max_num_seqs: int | None = None  # override the profile's
    kv_cache_tokens: int | None = None  # override the profile's
    workload: Workload = field(default_factory=Workload)
    timeout_s: float = 900.0  # the client's timeout per request, in its seconds
    scrape_every_s: float = METRICS_EVERY_S  # the client's seconds, as the router's
    update_every_s: float = TICK_S
    metrics: bool = True  # False: the controller gets no /metrics (a server without them)
    maximum: int = 512  # the controller's bounds
    minimum: int = 1
    initial: int | None = None
    known_knee: KneeMemory | None = None  # what an earlier run learned: auto starts there
    tuning: Tuning = DEFAULT_TUNING
    speed: float = 1.0  # the server's time compression: its seconds per second of the client's
    real_time: bool = False  # wait for real (the server compressed by ``speed``), not on virtual time
    thrash: float = THRASH  # the collapse past the KV cache (module docstring); 0: the engine alone
    # auto starts where the requests fit, as a run does on a server that shows its KV cache: counted
    # before any reply at the shared prefix (the prompt's fixed part) and an answer of max_tokens
    fit_start: bool = False
    max_tokens: int = 2048
    # The server model (SERVER_MODELS): "sim", the simulator's engine (with ``thrash``), or "steps", the
    # second model (pipeline/bench/step_server.py: its own batching and its own collapse past the cache);
    # or FAMILY, the server ``family`` says (pipeline/bench/family_server.py; the profile is then a name)
    server: str = "sim"
    family: FamilySpec | None = None
    # The client's CPU seconds per reply (reading, parsing, validating) on its one event-loop thread, in
    # its own seconds: past 1 / client_cpu_s replies a second the client is the bottleneck (a loaded
    # machine), and its timers fire late. 0: a client with CPU to spare.
    client_cpu_s: float = 0.0
    # The server's /metrics count no more running than its KV cache holds (at the workload's requests),
    # the rest waiting, as vLLM's do when it preempts past its cache; False: as the server model counts
    queued_past_cache: bool = False

    @property
    def label(self) -> str:
        overrides = [f"max-num-seqs {self.max_num_seqs}"] if self.max_num_seqs else []
        overrides += [f"KV {self.kv_cache_tokens:,} tokens"] if self.kv_cache_tokens else []
        overrides += [f"{self.server} model"] if self.server != "sim" else []
        return self.profile + (f" ({', '.join(overrides)})" if overrides else "")


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What a run did, in the profile's seconds from its start."""

    concurrency: str  # "auto" or the fixed level
    duration_s: float
    replies: tuple[tuple[float, int], ...]  # (finish time, output tokens), in order
    timeouts: int
    mean_running: float
    peak_running: int
    mean_waiting: float
    peak_waiting: int
    preemptions: int
    trace: tuple[tuple[float, int], ...]  # (time, limit): the start and every change
    changes: tuple[tuple[float, LimitChange], ...]
    knee_at: float | None  # when the controller first found its knee
    learned: KneeMemory | None  # what auto leaves the next run
    client_bound: ClientLoad | None = None  # the client's load when it was the bottleneck, if it was

    def throughput(self, start_s: float = 0.0, end_s: float | None = None) -> float:
        """Delivered output tok/s between two moments of the run."""
        end = self.duration_s if end_s is None else end_s
        times = [finished for finished, _ in self.replies]
        first, last = bisect.bisect_right(times, start_s), bisect.bisect_right(times, end)
        return sum(tokens for _, tokens in self.replies[first:last]) / (end - start_s)

    @property
    def final_limit(self) -> int:
        return self.trace[-1][1]

    def limit_at(self, moment_s: float) -> int:
        index = bisect.bisect_right([at for at, _ in self.trace], moment_s) - 1
        return self.trace[max(index, 0)][1]

    def limits_between(self, start_s: float, end_s: float | None = None) -> list[int]:
        """Every limit in force at some moment of the interval."""
        end = self.duration_s if end_s is None else end_s
        return [self.limit_at(start_s)] + [limit for at, limit in self.trace if start_s < at <= end]


@dataclass(slots=True)
class LoadRun:
    """The mutable state of one run while it goes."""

    scenario: Scenario
    engine: ServerModel
    controller: AdaptiveLimit | Member | None  # a job's own, or its place in the machine's pool
    fixed: int
    rng: random.Random
    in_flight: int = 0
    left: int | None = None  # a job's records not sent yet (None: send until the time is up)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    replies: list[tuple[float, int]] = field(default_factory=list)
    timeouts: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)  # (running, waiting) per scrape
    trace: list[tuple[float, int]] = field(default_factory=list)
    changes: list[tuple[float, LimitChange]] = field(default_factory=list)
    knee_at: float | None = None
    core: asyncio.Lock = field(default_factory=asyncio.Lock)  # the client's one event-loop thread
    busy_s: float = 0.0  # its CPU seconds so far
    sent_all_at: float | None = None  # when a job's last record was sent (its requests drain after)

    async def on_core(self, cpu_s: float) -> None:
        """Wait for the event loop's thread, then keep it busy for ``cpu_s`` (the client's seconds)."""
        async with self.core:
            if cpu_s > 0:
                await asyncio.sleep(cpu_s)
                self.busy_s += cpu_s

    @property
    def limit(self) -> int:
        return self.controller.limit if self.controller is not None else self.fixed

    def top_up(self, requests: set[asyncio.Task[None]]) -> None:
        """Send requests until the limit's worth are in flight or the job has no record left (without a
        count, the time bounds the run); each is kept in ``requests`` until it ends."""
        while self.in_flight < self.limit and self.left != 0:
            if self.left is not None:
                self.left -= 1
                self.sent_all_at = self.engine.now() if self.left == 0 else None
            self.in_flight += 1
            task = asyncio.create_task(self.request())
            requests.add(task)
            task.add_done_callback(requests.discard)

    async def request(self) -> None:
        sequence = self.scenario.workload.sequence(self.rng)
        started = self.engine.now()
        try:
            await asyncio.wait_for(self.engine.generate(sequence), self.scenario.timeout_s)
        except TimeoutError:
            self.timeouts += 1
            self.left = None if self.left is None else self.left + 1  # a job sends the record again
            if self.controller is not None:
                self.controller.on_timeout()
        else:
            await self.on_core(self.scenario.client_cpu_s)  # read and handled when the loop gets to it
            now = self.engine.now()
            self.replies.append((now, sequence.output_tokens))
            if self.controller is not None:  # in the client's seconds, as it measures them
                latency_s = (now - started) / self.engine.speed
                self.controller.on_finished(
                    latency_s=latency_s,
                    output_tokens=sequence.output_tokens,
                    prompt_tokens=sequence.prompt_tokens,
                    ok=True,
                )
        finally:
            self.in_flight -= 1
            self.wake.set()

    async def scrape(self) -> None:
        metrics = self.engine.metrics
        while True:
            await asyncio.sleep(self.scenario.scrape_every_s)
            self.samples.append((metrics.running, metrics.waiting))
            if self.controller is not None and self.scenario.metrics:
                load = ServerLoad(metrics.running, metrics.waiting, metrics.kv_usage, metrics.preemptions)
                self.controller.on_server_load(load)

    async def adapt(self, controller: AdaptiveLimit | Member) -> None:
        """The router's ticks: its timers late by the loop's lag, the client's load with each scrape."""
        loop, every = asyncio.get_running_loop(), self.scenario.update_every_s
        meter, ticks = ClientMeter(loop.time, lambda: self.busy_s), 0
        while True:
            asleep = loop.time()
            await asyncio.sleep(every)
            await self.on_core(0.0)
            meter.lagged(loop.time() - asleep - every)
            ticks += 1
            if ticks % max(1, round(self.scenario.scrape_every_s / every)) == 0:
                controller.on_client_load(meter.read())
            waiting = self.scenario.maximum if self.left is None else self.left
            change = controller.update(in_flight=self.in_flight, waiting=waiting)
            now = self.engine.now()
            if controller.at_knee and self.knee_at is None:
                self.knee_at = now
            if change is not None:
                self.changes.append((now, change))
            if controller.limit != self.trace[-1][1]:  # a pool's member: its allowance moves between changes
                self.trace.append((now, controller.limit))
                self.wake.set()


def start_fit(scenario: Scenario, kv_tokens: int, prefix_caching: bool = False) -> RequestFit:
    """What a run counts before any reply: the fixed part of the prompt and an answer of max_tokens. The
    workload's requests share no blocks (Workload), so each holds its fixed part, and the fit counts it;
    a family server with prefix caching holds it once, and says so in its cache config."""
    prefix = scenario.workload.prefix_tokens
    shared = prefix if prefix_caching else 0
    return RequestFit(
        kv_tokens, prefix, scenario.max_tokens, shared_prefix_tokens=shared, prefix_caching=prefix_caching
    )


def prepare(
    scenario: Scenario,
    fixed: int | None,
    server: ServerModel,
    clock: Callable[[], float],
    *,
    seed: int = 0,
) -> LoadRun:
    """One client of ``server`` (``clock`` is the client's) and, for ``auto``, its controller, started as
    a run starts it: at the fit (``fit_start``), at its share when other clients' requests run there."""
    limit = new_limit(scenario, fixed, clock)
    if limit is not None and scenario.fit_start:
        numbers = server.metrics
        load = ServerLoad(numbers.running, numbers.waiting, numbers.kv_usage, numbers.preemptions)
        caching = isinstance(server, FamilyServer) and server.spec.prefix_caching
        fit = start_fit(scenario, server.kv_cache_tokens, caching)
        limit.start_at_fit(fit, load if scenario.metrics else None)
    rng = random.Random(scenario.workload.seed + seed)
    return LoadRun(scenario, server, limit, fixed or 0, rng)


def server_model(scenario: Scenario, clock: Callable[[], float]) -> ServerModel:
    if scenario.server == FAMILY and scenario.family is not None:
        prefix = scenario.workload.prefix_tokens  # the job's fixed part, what its prompts share
        return FamilyServer(scenario.family, speed=scenario.speed, prefix_tokens=prefix, clock=clock)
    model: ServerModel
    if scenario.server == "steps":
        model = StepServer(
            SERVERS[scenario.profile],
            speed=scenario.speed,
            max_num_seqs=scenario.max_num_seqs,
            kv_cache_tokens=scenario.kv_cache_tokens,
            clock=clock,
        )
    elif scenario.server == "sim":
        model = Engine(
            PROFILES[scenario.profile],
            thrash=scenario.thrash,
            speed=scenario.speed,
            max_num_seqs=scenario.max_num_seqs,
            kv_cache_tokens=scenario.kv_cache_tokens,
            clock=clock,
        )
    else:
        models = ", ".join((*SERVER_MODELS, f"{FAMILY} (with a family spec)"))
        raise ValueError(f"server model {scenario.server!r}: one of {models}")
    if scenario.queued_past_cache:
        request = scenario.workload.prompt_tokens + scenario.workload.output_tokens
        return Queued(model, model.kv_cache_tokens // request)
    return model


class Queued:
    """A server model whose ``/metrics`` show no more running than its KV cache holds, the rest waiting
    (:class:`~pipeline.bench.step_server.QueuedPastCache`)."""

    def __init__(self, server: ServerModel, holds: int) -> None:
        self.server, self.holds = server, holds
        self.speed, self.kv_cache_tokens = server.speed, server.kv_cache_tokens

    @property
    def metrics(self) -> ServerNumbers:
        return QueuedPastCache(self.server.metrics, self.holds)

    def now(self) -> float:
        return self.server.now()

    async def generate(self, sequence: Sequence, /) -> None:
        await self.server.generate(sequence)


def new_limit(scenario: Scenario, fixed: int | None, clock: Callable[[], float]) -> AdaptiveLimit | None:
    """For ``auto`` (``fixed`` None), the scenario's controller; else None."""
    if fixed is not None:
        return None
    return AdaptiveLimit(
        maximum=scenario.maximum,
        minimum=scenario.minimum,
        timeout_s=scenario.timeout_s,
        initial=scenario.initial,
        known_knee=scenario.known_knee,
        clock=clock,
        tuning=scenario.tuning,
    )


async def _drive(scenario: Scenario, fixed: int | None, clock: Callable[[], float]) -> LoadResult:
    """Keep the limit's worth of requests in flight until the scenario's time is up."""
    run = prepare(scenario, fixed, server_model(scenario, clock), clock)
    engine, controller = run.engine, run.controller
    started = engine.now()
    run.trace.append((started, run.limit))
    helpers = [asyncio.create_task(run.scrape())]
    if controller is not None:
        helpers.append(asyncio.create_task(run.adapt(controller)))
    requests: set[asyncio.Task[None]] = set()
    end = asyncio.get_running_loop().call_later(scenario.duration_s / engine.speed, run.wake.set)
    while engine.now() - started < scenario.duration_s - 1e-9:
        run.top_up(requests)
        run.wake.clear()
        await run.wake.wait()
    end.cancel()
    await stop([*helpers, *requests])
    return _result(run, started, fixed)


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel a run's tasks and wait for them; one that had failed (the controller, a scrape) raises its
    error here: a benchmark whose policy crashed must not print a table as if it had run."""
    for task in tasks:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [
        e for e in outcomes if isinstance(e, BaseException) and not isinstance(e, asyncio.CancelledError)
    ]
    if failed:
        raise failed[0]


def _result(run: LoadRun, started: float, fixed: int | None) -> LoadResult:
    samples = run.samples or [(0, 0)]
    return LoadResult(
        concurrency="auto" if fixed is None else str(fixed),
        duration_s=run.scenario.duration_s,
        replies=tuple((finished - started, tokens) for finished, tokens in run.replies),
        timeouts=run.timeouts,
        mean_running=sum(running for running, _ in samples) / len(samples),
        peak_running=run.engine.metrics.peak_running,
        mean_waiting=sum(waiting for _, waiting in samples) / len(samples),
        peak_waiting=run.engine.metrics.peak_waiting,
        preemptions=run.engine.metrics.preemptions,
        trace=tuple((at - started, limit) for at, limit in run.trace),
        changes=tuple((at - started, change) for at, change in run.changes),
        knee_at=None if run.knee_at is None else run.knee_at - started,
        learned=run.controller.learned if run.controller is not None else None,
        client_bound=run.controller.client_bound if run.controller is not None else None,
    )


def run_load(scenario: Scenario, concurrency: int | None = None) -> LoadResult:
    """Run one scenario at a fixed ``concurrency``, or under ``AdaptiveLimit`` when it is None."""
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    if scenario.real_time:
        return asyncio.run(_drive(scenario, concurrency, time.monotonic))
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        loop = runner.get_loop()
        return runner.run(_drive(scenario, concurrency, loop.time))
