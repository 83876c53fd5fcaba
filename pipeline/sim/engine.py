"""A continuous-batching engine in the way vLLM schedules, in (scaled) real time.

* Every running sequence advances one token per engine step; a step with ``b`` sequences takes
  ``b / D(b)`` seconds, where ``D`` is the profile's decode speed, so aggregate throughput follows
  the measured curve and per-sequence speed falls as the batch grows.
* At most ``max_num_seqs`` sequences run; the rest wait in FIFO order (time to first token grows).
* Admitting a sequence costs prefill time (its uncached prompt tokens / prefill speed), during which
  decoding pauses; a prompt prefix seen before is served by the prefix cache.
* Running sequences hold KV cache for prompt + generated tokens. Admission needs room for the prompt;
  when decoding outgrows the cache, the newest sequence is preempted and later recomputed (prefill of
  prompt + generated again).
* With ``thrash`` (:data:`KV_THRASH`; ``pipeline sim --kv-tokens`` turns it on), throughput past the KV
  cache falls, as a real server's does, rather than flattening: while the requests the scheduler would
  run will hold more than the cache when done (``demanded``), decoding runs at ``(cache / demanded) **
  thrash`` of its speed (preemption, recomputation and swapping). 1.35 reproduces a dense 49B's fall from
  695 to 515 tok/s from c=256 to c=320.

The engine is event-driven: it sleeps until the next sequence finishes its prefill or its output, or
until a request arrives or leaves, so its CPU cost does not depend on the token rate. ``speed``
compresses time: at 50, a 5-minute request takes 6 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.sim.profiles import Profile

#: How steeply throughput falls past the KV cache (module docstring); 0: it only flattens.
KV_THRASH = 1.35


@dataclass(eq=False, slots=True)
class Sequence:
    prompt_tokens: int
    output_tokens: int  # what it will generate (reasoning + answer), at most max_tokens
    prefix_key: str | None = None  # requests sharing a prefix key share its cached tokens
    prefix_tokens: int = 0
    generated: float = 0.0
    prefill_left_s: float = 0.0
    first_token: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    first_token_at: float | None = None

    @property
    def kv_tokens(self) -> float:
        return self.prompt_tokens + self.generated


@dataclass(slots=True)
class EngineMetrics:
    running: int = 0
    waiting: int = 0
    peak_running: int = 0
    peak_waiting: int = 0
    kv_usage: float = 0.0
    peak_kv_usage: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0


class Engine:
    def __init__(
        self,
        profile: Profile,
        *,
        speed: float = 1.0,
        max_num_seqs: int | None = None,
        kv_cache_tokens: int | None = None,
        prefix_caching: bool = True,
        thrash: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.profile = profile
        self.thrash = thrash
        self.speed = speed
        self.max_num_seqs = max_num_seqs or profile.max_num_seqs
        self.kv_cache_tokens = kv_cache_tokens or profile.kv_cache_tokens
        self.prefix_caching = prefix_caching
        self.metrics = EngineMetrics()
        self._clock = clock
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._prefix_cache: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        """Virtual seconds: real seconds times ``speed``."""
        return self._clock() * self.speed

    async def generate(self, sequence: Sequence) -> None:
        """Queue a sequence and wait until it has generated all its tokens (cancel to abort it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._waiting.append(sequence)
        self._wake.set()
        try:
            await sequence.finished.wait()
        except asyncio.CancelledError:
            self._remove(sequence)
            raise

    def _remove(self, sequence: Sequence) -> None:
        if sequence in self._running:
            self._running.remove(sequence)
        elif sequence in self._waiting:
            self._waiting.remove(sequence)
        else:
            return
        self.metrics.aborted += 1
        self._wake.set()

    async def _loop(self) -> None:
        last = self.now()
        while True:
            now = self.now()
            self._admit()
            self._advance(last, now - last)
            last = now
            self._publish()
            delay = self._until_next_event()
            self._wake.clear()
            if delay is None:
                await self._wake.wait()
                last = self.now()  # nothing ran while idle
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(delay, 1e-6) / self.speed)

    def _per_sequence_rate(self, batch: int) -> float:
        rate = self.profile.decode_tokens_per_s(batch) / batch
        overcommit = self.overcommit() if self.thrash > 0 else 0.0
        return rate / overcommit**self.thrash if overcommit > 1.0 else rate

    def overcommit(self) -> float:
        """The KV tokens the requests the scheduler would run will hold when done, over the cache."""
        room = max(0, self.max_num_seqs - len(self._running))
        wanting = [*self._running, *list(self._waiting)[:room]]
        demanded = sum(s.prompt_tokens + s.output_tokens for s in wanting)
        return demanded / self.kv_cache_tokens

    def _advance(self, start: float, elapsed: float) -> None:
        """Spend ``elapsed`` virtual seconds from ``start``, event by event and exactly, however late
        the loop woke up: prefill first (in admission order), then decoding; a finished slot is
        refilled at once."""
        cursor, end = start, start + elapsed
        while end - cursor > 1e-12 and self._running:
            prefilling = next((s for s in self._running if s.prefill_left_s > 0), None)
            if prefilling is not None:
                spent = min(end - cursor, prefilling.prefill_left_s)
                prefilling.prefill_left_s -= spent
                cursor += spent
                continue
            rate = self._per_sequence_rate(len(self._running))
            step_s = min(end - cursor, self._tokens_to_next_event() / rate)
            cursor += step_s
            self._decode(step_s * rate, cursor)
            self._preempt_if_full()
            self._admit()

    def _decode(self, tokens: float, at: float) -> None:
        for sequence in list(self._running):
            step = min(tokens, sequence.output_tokens - sequence.generated)
            sequence.generated += step
            self.metrics.generation_tokens += step
            if sequence.first_token_at is None and sequence.generated > 0:
                sequence.first_token_at = at
                sequence.first_token.set()
            if sequence.generated >= sequence.output_tokens - 1e-6:
                self._running.remove(sequence)
                self.metrics.finished += 1
                sequence.finished.set()

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_num_seqs:
            candidate = self._waiting[0]
            if self._kv_used() + candidate.kv_tokens > self.kv_cache_tokens and self._running:
                return
            self._waiting.popleft()
            candidate.prefill_left_s = self._prefill_tokens(candidate) / self.profile.prefill_tokens_per_s
            self._running.append(candidate)

    def _prefill_tokens(self, sequence: Sequence) -> float:
        """Tokens to prefill: prompt (+ what it had generated before a preemption) minus cached prefix.
        Without prefix caching, vLLM neither looks a prompt up nor counts a query: both counters stay 0."""
        self.metrics.prompt_tokens += sequence.prompt_tokens
        if not self.prefix_caching:
            return max(1.0, sequence.kv_tokens)
        self.metrics.prefix_queries += sequence.prompt_tokens
        cached = 0
        if sequence.prefix_key is not None:
            if sequence.prefix_key in self._prefix_cache:
                cached = min(sequence.prefix_tokens, sequence.prompt_tokens)
            self._prefix_cache.add(sequence.prefix_key)
        self.metrics.prefix_hits += cached
        return max(1.0, sequence.kv_tokens - cached)

    def _kv_used(self) -> float:
        return sum(s.kv_tokens for s in self._running)

    def _preempt_if_full(self) -> None:
        while self._kv_used() > self.kv_cache_tokens and len(self._running) > 1:
            victim = self._running.pop()  # the newest, as vLLM does
            self._waiting.appendleft(victim)
            self.metrics.preemptions += 1

    def _until_next_event(self) -> float | None:
        if not self._running:
            return None
        prefilling = [s.prefill_left_s for s in self._running if s.prefill_left_s > 0]
        if prefilling:
            return prefilling[0]
        return self._tokens_to_next_event(first_tokens=True) / self._per_sequence_rate(len(self._running))

    def _tokens_to_next_event(self, *, first_tokens: bool = False) -> float:
        """Tokens each running sequence generates until one finishes or the KV cache fills up (and,
        when the loop is to sleep, until a first token is due, so streamed answers start on time)."""
        tokens = min(s.output_tokens - s.generated for s in self._running)
        if first_tokens and any(s.generated == 0 for s in self._running):
            tokens = min(tokens, 1.0)
        room = self.kv_cache_tokens - self._kv_used()
        if len(self._running) > 1:
            tokens = min(tokens, max(room, 0.0) / len(self._running) + 1e-6)
        return max(tokens, 1e-6)

    def _publish(self) -> None:
        metrics = self.metrics
        metrics.running, metrics.waiting = len(self._running), len(self._waiting)
        metrics.peak_running = max(metrics.peak_running, metrics.running)
        metrics.peak_waiting = max(metrics.peak_waiting, metrics.waiting)
        metrics.kv_usage = self._kv_used() / self.kv_cache_tokens
        metrics.peak_kv_usage = max(metrics.peak_kv_usage, metrics.kv_usage)
