"""A third server model for the closed loop (:mod:`pipeline.bench.closed_loop`): a family of servers, each
one a :class:`FamilySpec` of parameters, written apart from the simulator's engine and the step model so
that `concurrency: auto` and sharing can be judged over servers drawn at random, not over the two the
policy was tuned on.

The model, per server:

* **Speed.** Decoding ``b`` requests at once delivers ``single_tok_s x b / (1 + (b - 1) / half_batch)``
  output tokens a second (one stream's speed, saturating at ``single_tok_s x half_batch``); past
  ``peak_batch``, if set, it falls as ``(peak_batch / b) ** 0.3``. Running requests share it equally.
* **Prefill.** A request that starts running first prefills its prompt (less the shared prefix, with
  prefix caching) at ``prefill_tok_s``, one at a time in order; meanwhile decoding stops, or with chunked
  prefill goes on at half its speed while the prefill takes the other half.
* **The KV cache** holds ``kv_size`` tokens (a request holds its prompt and its whole answer; the shared
  prefix once, with prefix caching) or ``kv_size`` requests, whatever their tokens (``kv_by``). The
  scheduler looks at the first ``max_num_seqs`` requests on the server, oldest first.
* **Past the cache** (``past``): a queue admits a request only when its whole answer fits, so the rest
  wait and throughput plateaus. A decline or a cliff takes every request the scheduler looks at, and its
  steps slow by how far they overcommit the cache (what they will hold when done, over its size):
  smoothly, to ``fall_to`` of the speed at twice the cache (``over ** log2(fall_to)``), or at once to
  ``fall_to`` of it past the cache. How it overcommits (``overflow``): it preempts and recomputes (only
  those that fit run, the rest wait; the preemption counter grows by 2 a reply per cache overcommitted)
  or it spills to host memory (all of them run, none preempted, the cache shown full).
* **Noise.** Each request's decoding takes its tokens times a lognormal factor of mean 1 and deviation
  ``noise`` (its latency varies beyond its length).
* **/metrics**: running, waiting, KV-cache use, preemptions and the prefix cache's queries and hits, as
  vLLM's; with ``metrics_queue`` False, every request on the server is counted as running and none as
  waiting (a server that shows no queue). It says its KV cache in tokens: ``kv_size``, or by requests
  ``kv_size x slot_tokens`` (what its cache config says a slot holds, which need not be a request's).

Event-driven on the caller's clock (the virtual one in the closed loop): one timer, at the next prefill
or request to end, moved when a request comes or leaves; between those every rate is constant.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

KV_BY = ("tokens", "requests")
PAST = ("cliff", "decline", "queue")
OVERFLOW = ("preempt", "spill")
PAST_PEAK = 0.3  # past ``peak_batch`` throughput falls as (peak / batch) ** this
CHUNK_SHARE = 0.5  # with chunked prefill, the share of a step's time a pending prefill takes
PREEMPTIONS_PER_OVERCOMMIT = 2.0  # preemptions a reply per cache's worth overcommitted (preempt)
EPSILON = 1e-9
PREFILL_DONE = 1e-6  # tokens left of a prefill that is done (rounding)


class Request(Protocol):
    """What the model needs of a request: its prompt and the tokens it will generate."""

    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """One server of the family (the module docstring says what each parameter does). Its repr is the
    server's parameters as code, to paste as a regression example."""

    kv_by: str = "tokens"  # "tokens" or "requests": what the KV cache counts
    kv_size: int = 147_200  # its size in those
    past: str = "decline"  # past the cache: "cliff", "decline" or "queue"
    fall_to: float = 0.5  # a decline's speed at twice the cache, a cliff's anywhere past it
    overflow: str = "preempt"  # past the cache: "preempt" (and recompute) or "spill"
    max_num_seqs: int = 512
    chunked_prefill: bool = True
    prefix_caching: bool = True
    single_tok_s: float = 33.5  # one stream's output tok/s
    half_batch: float = 32.0  # the batch that delivers half the ceiling's speed
    peak_batch: int | None = None  # past it throughput falls; None: it saturates
    prefill_tok_s: float = 20_000.0
    noise: float = 0.0  # the lognormal deviation of each request's decoding time
    metrics_queue: bool = True  # False: /metrics count every request as running, none as waiting
    slot_tokens: int = 4096  # by requests: the tokens its cache config says a slot holds
    seed: int = 0  # of the noise

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("kv_by", self.kv_by, KV_BY),
            ("past", self.past, PAST),
            ("overflow", self.overflow, OVERFLOW),
        ):
            if value not in choices:
                raise ValueError(f"family server {name} {value!r}: one of {', '.join(choices)}")
        positive = ("kv_size", "max_num_seqs", "single_tok_s", "half_batch", "prefill_tok_s", "slot_tokens")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"family server {name} must be positive, not {getattr(self, name)}")
        if (
            not 0 < self.fall_to <= 1
            or self.noise < 0
            or (self.peak_batch is not None and self.peak_batch < 1)
        ):
            raise ValueError(
                f"family server: fall_to in (0, 1], noise >= 0 and peak_batch >= 1, not {self.fall_to}, "
                f"{self.noise} and {self.peak_batch}"
            )

    @property
    def said_kv_tokens(self) -> int:
        """The KV cache in tokens as its cache config says it."""
        return self.kv_size if self.kv_by == "tokens" else self.kv_size * self.slot_tokens

    def decode_tokens_per_s(self, batch: int) -> float:
        """Output tok/s of ``batch`` requests decoding, the cache aside."""
        if batch <= 0:
            return 0.0
        if self.peak_batch is not None and batch > self.peak_batch:
            return self.decode_tokens_per_s(self.peak_batch) * float((self.peak_batch / batch) ** PAST_PEAK)
        return self.single_tok_s * batch / (1.0 + (batch - 1) / self.half_batch)

    def slowdown(self, over: float) -> float:
        """The share of its speed a step keeps when the requests looked at want ``over`` caches."""
        if over <= 1.0 + EPSILON or self.past == "queue":
            return 1.0
        return self.fall_to if self.past == "cliff" else float(over ** math.log2(self.fall_to))

    def cached_prefix(self, prompt_tokens: int, prefix_tokens: int) -> int:
        return min(prefix_tokens, prompt_tokens) if self.prefix_caching else 0

    def own_units(self, prompt_tokens: int, output_tokens: int, prefix_tokens: int) -> int:
        """What one request holds of the cache on its own when done (the shared prefix aside)."""
        if self.kv_by == "requests":
            return 1
        return prompt_tokens + output_tokens - self.cached_prefix(prompt_tokens, prefix_tokens)

    def steady_tokens_per_s(self, concurrency: int, prompt: int, output: int, prefix: int) -> float:
        """Output tok/s at ``concurrency`` in flight of requests alike, in steady state (noise and the
        answers' spread aside): where a sweep of fixed levels looks."""
        scheduled = min(concurrency, self.max_num_seqs)
        own, shared = self.own_units(prompt, output, prefix), self.shared_units(prefix)
        fitting = max(1, (self.kv_size - shared) // own)
        over = (shared + scheduled * own) / self.kv_size
        running = scheduled if self.overflow == "spill" and self.past != "queue" else min(scheduled, fitting)
        decoding = self.decode_tokens_per_s(running) * self.slowdown(over)
        prefill_s = (prompt - self.cached_prefix(prompt, prefix)) / self.prefill_tok_s
        return decoding / (1.0 + decoding * prefill_s / output)

    def shared_units(self, prefix_tokens: int) -> int:
        """What the requests share of the cache, held once: the prefix, by tokens with prefix caching."""
        return prefix_tokens if self.kv_by == "tokens" and self.prefix_caching else 0


@dataclass(eq=False, slots=True)
class _Request:
    prefill_left: float  # tokens to prefill when it starts running (the cached prefix aside)
    held_prompt: int  # cache units its prompt holds on its own
    output: int
    work: float  # its decoding time, in tokens of one stream (output x noise)
    own: int  # cache units it holds on its own when done
    before: int  # cache units of every request that came before it: sums of the waiting line
    start: float = 0.0  # the decoding progress when it started decoding
    finished: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


class FamilyMetrics:
    """What ``/metrics`` show now (read at any moment), and the run's peaks."""

    def __init__(self, server: FamilyServer) -> None:
        self._server = server
        self.peak_running = 0
        self.peak_waiting = 0
        self.preempted = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.finished = 0

    @property
    def running(self) -> int:
        server = self._server
        return len(server.running) + (0 if server.spec.metrics_queue else len(server.waiting))

    @property
    def waiting(self) -> int:
        return len(self._server.waiting) if self._server.spec.metrics_queue else 0

    @property
    def kv_usage(self) -> float:
        return min(1.0, self._server.held_units() / self._server.spec.kv_size)

    @property
    def preemptions(self) -> int:
        return int(self.preempted)

    def publish(self) -> None:
        self.peak_running = max(self.peak_running, self.running)
        self.peak_waiting = max(self.peak_waiting, self.waiting)


class FamilyServer:
    """One server of the family, driven as the closed loop drives a server model."""

    def __init__(
        self,
        spec: FamilySpec,
        *,
        speed: float = 1.0,
        prefix_tokens: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``prefix_tokens``: every request's prompt starts with this shared prefix (the job's fixed part)."""
        self.spec, self.speed, self.prefix_tokens, self._clock = spec, speed, prefix_tokens, clock
        self.kv_cache_tokens = spec.said_kv_tokens
        self.metrics = FamilyMetrics(self)
        self.running: dict[_Request, None] = {}  # in order of admission: the oldest requests
        self.waiting: deque[_Request] = deque()
        self._prefilling: deque[_Request] = deque()
        self._decoding: list[tuple[float, int, _Request]] = []  # (progress when done, order, request)
        self._progress = 0.0  # tokens each decoding request gained so far (its share of the speed)
        self._rate = self._prefill_rate = 0.0
        self._arrived = 0  # cache units of every request that came, and their count
        self._count = 0
        self._running_own = 0
        self._held_prompts = 0  # cache units the running requests' prompts hold on their own
        self._per_work = self._start_per_work = 0.0  # sums over decoding: output / work, and x start
        self._over = 0.0
        self._rng = random.Random(spec.seed)
        self._last = self.now()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def now(self) -> float:
        """The model's seconds: the client's times ``speed``."""
        return self._clock() * self.speed

    async def generate(self, request: Request, /) -> None:
        """Serve one request until it has generated all its tokens (cancel to abort it)."""
        self._loop = self._loop or asyncio.get_running_loop()
        self._advance(self.now())
        job = self._new(request)
        self.waiting.append(job)
        self._changed()
        try:
            await job.done.wait()
        except asyncio.CancelledError:
            self._abort(job)
            raise

    def _new(self, request: Request) -> _Request:
        spec, prefix = self.spec, self.prefix_tokens
        output = max(1, request.output_tokens)
        sigma = spec.noise
        work = output * math.exp(sigma * self._rng.gauss(0.0, 1.0) - sigma * sigma / 2) if sigma else output
        own = spec.own_units(request.prompt_tokens, output, prefix)
        cached = spec.cached_prefix(request.prompt_tokens, prefix)
        held = 0 if spec.kv_by == "requests" else request.prompt_tokens - cached
        found = cached if self._count else 0  # the first request's prefix is not cached yet
        job = _Request(max(1, request.prompt_tokens - found), held, output, work, own, self._arrived)
        self._arrived += own
        if spec.prefix_caching:  # a lookup of a new request: its prompt, and the prefix found cached
            self.metrics.prefix_queries += request.prompt_tokens
            self.metrics.prefix_hits += found
        self._count += 1
        return job

    def _abort(self, job: _Request) -> None:
        self._advance(self.now())
        if job in self.running:
            self._leave(job)
        elif job in self.waiting:
            self.waiting.remove(job)
            for later in self.waiting:  # the sums of the line skip it from now on
                if later.before > job.before:
                    later.before -= job.own
            self._arrived -= job.own
        self._changed()

    def _leave(self, job: _Request) -> None:
        """A running request leaves (done or aborted): its cache is freed."""
        del self.running[job]
        job.finished = True
        self._running_own -= job.own
        self._held_prompts -= job.held_prompt
        if job in self._prefilling:
            self._prefilling.remove(job)
        else:
            self._per_work -= job.output / job.work
            self._start_per_work -= job.output * job.start / job.work

    def _changed(self) -> None:
        """A request came, left or moved on: admit what may run, set the rates, and the timer to the next
        event (a timer, not a task that waits: a third of the CPU a reply takes otherwise)."""
        self._admit()
        self._plan()
        self.metrics.publish()
        if self._timer is not None:
            self._timer.cancel()
        delay = self._next_event_s()
        if delay is not None and self._loop is not None:
            self._timer = self._loop.call_later(max(delay, EPSILON) / self.speed, self._on_time)

    def _on_time(self) -> None:
        self._timer = None
        self._advance(self.now())
        if self._timer is None:  # the time came with no event due (rounding): set it again
            self._changed()

    def _advance(self, now: float) -> None:
        """Spend the time since the last event at the rates set then, event by event."""
        while now - self._last > 0:
            due = self._next_event_s()
            step = now - self._last if due is None else min(now - self._last, due)
            self._progress += self._rate * step
            if self._prefilling:
                self._prefilling[0].prefill_left -= self._prefill_rate * step
            self._last += step
            if due is None or step < due - EPSILON:
                return
            self._events()

    def _next_event_s(self) -> float | None:
        """Seconds to the next prefill or request that ends, at the rates now (None: nothing runs)."""
        times = []
        if self._prefilling and self._prefill_rate > 0:
            times.append(max(0.0, self._prefilling[0].prefill_left) / self._prefill_rate)
        while self._decoding and self._decoding[0][2].finished:
            heapq.heappop(self._decoding)  # aborted while decoding
        if self._decoding and self._rate > 0:
            times.append(max(0.0, self._decoding[0][0] - self._progress) / self._rate)
        return min(times) if times else None

    def _events(self) -> None:
        """What ends now: requests whose decoding is done, the prefill in progress."""
        margin = EPSILON * max(1.0, self._progress)
        while self._decoding and self._decoding[0][0] - self._progress <= margin:
            _, _, job = heapq.heappop(self._decoding)
            if job.finished:
                continue
            self._leave(job)
            self.metrics.finished += 1
            if self.spec.overflow == "preempt" and self.spec.past != "queue":
                self.metrics.preempted += PREEMPTIONS_PER_OVERCOMMIT * max(0.0, self._over - 1.0)
            job.done.set()
        if self._prefilling and self._prefilling[0].prefill_left <= PREFILL_DONE:
            job = self._prefilling.popleft()
            job.start = self._progress
            self._per_work += job.output / job.work
            self._start_per_work += job.output * job.start / job.work
            heapq.heappush(self._decoding, (job.start + job.work, id(job), job))
        self._changed()

    def _admit(self) -> None:
        """Start the oldest waiting requests while the scheduler takes them: up to ``max_num_seqs``, and
        unless it spills past a decline or a cliff, while their whole answers fit in the cache."""
        spec, shared = self.spec, self.spec.shared_units(self.prefix_tokens)
        fits_only = spec.past == "queue" or spec.overflow == "preempt"
        while self.waiting and len(self.running) < spec.max_num_seqs:
            job = self.waiting[0]
            if fits_only and self.running and shared + self._running_own + job.own > spec.kv_size:
                break
            self.waiting.popleft()
            self.running[job] = None
            self._running_own += job.own
            self._held_prompts += job.held_prompt
            self._prefilling.append(job)

    def _plan(self) -> None:
        """The rates until the next event: the decoding speed shared by those decoding, the prefill's."""
        spec = self.spec
        self._over = self._looked_at() / spec.kv_size
        decoding = len(self.running) - len(self._prefilling)
        share = 1.0
        if self._prefilling:
            share = 1.0 - CHUNK_SHARE if spec.chunked_prefill else 0.0
        speed = spec.decode_tokens_per_s(decoding) * spec.slowdown(self._over) * share
        self._rate = speed / decoding if decoding else 0.0
        chunk = CHUNK_SHARE if spec.chunked_prefill and decoding else 1.0
        self._prefill_rate = spec.prefill_tok_s * chunk if self._prefilling else 0.0

    def _looked_at(self) -> int:
        """The cache units the requests the scheduler looks at will hold when done: the running ones and
        the oldest waiting up to ``max_num_seqs`` (the shared prefix once)."""
        if not self.running and not self.waiting:
            return 0
        total = self.spec.shared_units(self.prefix_tokens) + self._running_own
        more = min(len(self.waiting), self.spec.max_num_seqs - len(self.running))
        if more > 0:
            first, last = self.waiting[0], self.waiting[more - 1]
            total += last.before + last.own - first.before
        return total

    def held_units(self) -> float:
        """The cache units held now: the running requests' prompts and what they generated so far."""
        if not self.running:
            return 0.0
        if self.spec.kv_by == "requests":
            return float(len(self.running))
        progress = self._progress + self._rate * max(0.0, self.now() - self._last)
        generated = progress * self._per_work - self._start_per_work
        return self.spec.shared_units(self.prefix_tokens) + self._held_prompts + generated
