"""A continuous-batching engine in the way vLLM schedules, in (scaled) real time.

* Every running sequence advances one token per engine step; a step with ``b`` sequences takes
  ``b / D(b)`` seconds, where ``D`` is the profile's decode speed, so aggregate throughput follows
  the measured curve and per-sequence speed falls as the batch grows.
* At most ``max_num_seqs`` sequences run; the rest wait in FIFO order (time to first token grows).
* Admitting a sequence costs prefill time (its uncached prompt tokens / prefill speed), during which
  decoding pauses. The prefix cache is vLLM's automatic prefix caching (:mod:`pipeline.sim.blocks`):
  a prompt's full blocks of ``block_size`` tokens are hashed with everything before them, and a prompt
  whose leading blocks are cached (held by a running request, or freed and not evicted yet) neither
  prefills them nor holds them again.
* The KV cache is counted in blocks, as vLLM's is: a running sequence holds its prompt's and its
  generated tokens' blocks, the cached ones shared with every other running sequence that has them.
  Admission needs free blocks for the prompt (cached blocks no running sequence holds are free); when a
  decoding sequence needs a block and none is free, the newest sequence is preempted and later
  recomputed (its prompt and what it had generated, less what is still cached). So ``N`` sequences that
  share ``S`` blocks and hold ``O`` more each when done fit while ``S + N * O`` <= the cache's blocks.
* With ``thrash`` (:data:`KV_THRASH`; ``pipeline sim --kv-tokens`` turns it on), throughput past the KV
  cache falls, as a real server's does, rather than flattening: while the requests the scheduler would
  run will hold more than the cache when done (``demanded``), decoding runs at ``(cache / demanded) **
  thrash`` of its speed (preemption, recomputation and swapping; a shared block is demanded once).
  1.35 reproduces a dense 49B's fall from 695 to 515 tok/s from c=256 to c=320.

The engine is event-driven: it sleeps until the next sequence finishes its prefill or its output, or
until a request arrives or leaves, so its CPU cost does not depend on the token rate. ``speed``
compresses time: at 50, a 5-minute request takes 6 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.sim.blocks import BLOCK_SIZE, BlockCache
from pipeline.sim.profiles import Profile

#: How steeply throughput falls past the KV cache (module docstring); 0: it only flattens.
KV_THRASH = 1.35


@dataclass(eq=False, slots=True)
class Sequence:
    prompt_tokens: int
    output_tokens: int  # what it will generate (reasoning + answer), at most max_tokens
    # The chained hashes of the prompt's full blocks (pipeline.sim.tokens.block_hashes), in the engine's
    # block size: what it may share through the prefix cache. Empty: it shares nothing.
    blocks: tuple[int, ...] = ()
    generated: float = 0.0
    prefill_left_s: float = 0.0
    first_token: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    first_token_at: float | None = None
    # The engine's bookkeeping while it runs: of ``blocks``, those it holds in the prefix cache (all of
    # them with prefix caching, else none), the blocks it holds on its own (the rest: its prompt's partial
    # last block and its generated tokens', every block without prefix caching), and those it will hold
    # on its own when done.
    cached: int = 0
    own: int = 0
    final_own: int = 0
    preempted: bool = False  # vLLM counts a preempted request's second lookup apart from new requests'
    expected_cached: int | None = None  # while it waits: its leading blocks cached when first looked at

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
        block_size: int = BLOCK_SIZE,
        thrash: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.profile = profile
        self.thrash = thrash
        self.speed = speed
        self.max_num_seqs = max_num_seqs or profile.max_num_seqs
        self.kv_cache_tokens = kv_cache_tokens or profile.kv_cache_tokens
        self.prefix_caching = prefix_caching
        self.block_size = block_size
        self.cache = BlockCache(max(1, self.kv_cache_tokens // block_size))
        self.metrics = EngineMetrics()
        self._clock = clock
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._own = 0  # blocks the running sequences hold on their own
        self._final_own = 0  # ... and will hold when done
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        """Virtual seconds: real seconds times ``speed``."""
        return self._clock() * self.speed

    def blocks_of(self, tokens: float) -> int:
        """The blocks ``tokens`` tokens take: a block partly filled is a block."""
        return math.ceil(tokens / self.block_size - 1e-9)

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
            self._release(sequence)
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
        """The blocks the requests the scheduler would run will hold when done (a block they share
        once), over the cache's."""
        room = max(0, self.max_num_seqs - len(self._running))
        demanded = self.cache.held + self._final_own
        for sequence in itertools.islice(self._waiting, room):
            if sequence.expected_cached is None:
                shared = sequence.blocks if self.prefix_caching else ()
                sequence.expected_cached = self.cache.cached_run(shared)
            total = sequence.prompt_tokens + sequence.output_tokens
            demanded += self.blocks_of(total) - sequence.expected_cached
        return demanded / self.cache.total

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
            own = self.blocks_of(sequence.kv_tokens) - sequence.cached
            self._own += own - sequence.own
            sequence.own = own
            if sequence.first_token_at is None and sequence.generated > 0:
                sequence.first_token_at = at
                sequence.first_token.set()
            if sequence.generated >= sequence.output_tokens - 1e-6:
                self._running.remove(sequence)
                self._release(sequence)
                self.metrics.finished += 1
                sequence.finished.set()

    def _blocks_used(self) -> int:
        return self.cache.held + self._own

    def _admit(self) -> None:
        """Admit waiting sequences in order while their blocks are free (the first always, alone)."""
        while self._waiting and len(self._running) < self.max_num_seqs:
            candidate = self._waiting[0]
            shared = candidate.blocks if self.prefix_caching else ()
            own = self.blocks_of(candidate.kv_tokens) - len(shared)
            needed = self.cache.taking(shared) + own
            if self._blocks_used() + needed > self.cache.total and self._running:
                break
            self._waiting.popleft()
            prefill = self._prefill_tokens(candidate, shared)
            candidate.prefill_left_s = prefill / self.profile.prefill_tokens_per_s
            self.cache.hold(shared)
            done = candidate.prompt_tokens + candidate.output_tokens
            candidate.cached, candidate.own = len(shared), own
            candidate.final_own = self.blocks_of(done) - len(shared)
            self._own += own
            self._final_own += candidate.final_own
            self._running.append(candidate)
        self.cache.evict(self._own)

    def _prefill_tokens(self, sequence: Sequence, shared: tuple[int, ...]) -> float:
        """Tokens to prefill: the prompt (and what it had generated before a preemption) less its leading
        blocks in the cache, all but its last token at most (vLLM computes that one for the next). A new
        request's lookup is counted (queries: its prompt tokens; hits: those cached); a preempted one's
        is not, as vLLM counts those apart. Without prefix caching vLLM looks nothing up: both stay 0."""
        tokens = sequence.kv_tokens
        if not sequence.preempted:
            self.metrics.prompt_tokens += sequence.prompt_tokens
        if not self.prefix_caching:
            return max(1.0, tokens)
        most = (math.ceil(tokens) - 1) // self.block_size
        hit = min(self.cache.cached_run(shared), most) * self.block_size
        if not sequence.preempted:
            self.metrics.prefix_queries += sequence.prompt_tokens
            self.metrics.prefix_hits += hit
        return max(1.0, tokens - hit)

    def _release(self, sequence: Sequence) -> None:
        """A sequence leaves the running: its own blocks are freed, its cached ones held one fewer."""
        self.cache.release(sequence.blocks[: sequence.cached])
        self._own -= sequence.own
        self._final_own -= sequence.final_own
        sequence.cached = sequence.own = sequence.final_own = 0

    def _preempt_if_full(self) -> None:
        while self._blocks_used() > self.cache.total and len(self._running) > 1:
            victim = self._running.pop()  # the newest, as vLLM does
            self._release(victim)
            victim.preempted = True
            victim.expected_cached = None
            self._waiting.appendleft(victim)
            self.metrics.preemptions += 1
        self.cache.evict(self._own)

    def _until_next_event(self) -> float | None:
        if not self._running:
            return None
        prefilling = [s.prefill_left_s for s in self._running if s.prefill_left_s > 0]
        if prefilling:
            return prefilling[0]
        return self._tokens_to_next_event(first_tokens=True) / self._per_sequence_rate(len(self._running))

    def _tokens_to_next_event(self, *, first_tokens: bool = False) -> float:
        """Tokens each running sequence generates until one finishes or needs a block when none is free
        (and, when the loop is to sleep, until a first token is due, so streamed answers start on time)."""
        tokens = min(s.output_tokens - s.generated for s in self._running)
        if first_tokens and any(s.generated == 0 for s in self._running):
            tokens = min(tokens, 1.0)
        if len(self._running) > 1:
            tokens = min(tokens, self._tokens_to_full() + 1e-6)
        return max(tokens, 1e-6)

    def _tokens_to_full(self) -> float:
        """Tokens each running sequence generates until one needs a block and none is free. Each needs
        its next block once its last one is full (``slack`` tokens on), then one every ``block_size``
        tokens: the free blocks go to those needs in the order they come."""
        size = self.block_size
        free = self.cache.total - self._blocks_used()
        if free < 0:
            return 0.0
        slacks = [(s.cached + s.own) * size - s.kv_tokens for s in self._running]
        rounds, nth = divmod(free, len(slacks))
        return heapq.nsmallest(nth + 1, slacks)[-1] + rounds * size

    def _publish(self) -> None:
        metrics = self.metrics
        metrics.running, metrics.waiting = len(self._running), len(self._waiting)
        metrics.peak_running = max(metrics.peak_running, metrics.running)
        metrics.peak_waiting = max(metrics.peak_waiting, metrics.waiting)
        metrics.kv_usage = self._blocks_used() / self.cache.total
        metrics.peak_kv_usage = max(metrics.peak_kv_usage, metrics.kv_usage)
