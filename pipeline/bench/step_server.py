"""A second server model for the benchmarks that judge `concurrency: auto` and sharing, written from the
seeds' curves and not from the simulator's code (:mod:`pipeline.sim`, which the policy was tuned on): a
policy that holds only on the model it was tuned on is not done.

How it differs from the simulator's engine, on purpose:

* **Batching by steps.** The server runs discrete decode steps; every running request gains one token a
  step, and a step's seconds are a cost model fitted to the seeds' curves, not their interpolation:
  a fixed part (the weights read once a step), an experts part for a mixture of experts (the share of
  experts a batch's tokens touch: ``1 - (1 - top_k / experts) ** batch``), a part per request at its
  context (attention reads its KV), and a part growing with the square of the batch (scheduling and
  sampling). Past the largest batch with a captured CUDA graph the requests beyond it run eagerly, at a
  cost growing with the square of their number: gpt-oss-120b's curve peaks near 256 and falls at 384.
  A step that admits requests also prefills their prompts (up to a token budget a step, as chunked
  prefill does).
* **Its own failure past the KV cache.** No formula for the collapse, and no preemption: the scheduler
  admits a request whenever it has a slot (``max_num_seqs``); the cache is counted in blocks of 16 tokens
  (no prefix caching: the benchmarks' requests share nothing), and the blocks past the GPU's cache live
  in host memory (KV offloading, or unified memory oversubscribed), which every step reads over the
  link: a step pays ``spill_s`` per token held there. So past the cache each request more slows every
  step by its whole context, and the fall grows with how far the cache is overcommitted. ``/metrics``
  show the cache 100% used, nothing waiting and no preemption: only throughput tells.

The three servers are the seeds' (:data:`SERVERS`): gpt-oss-120b (33.5 tok/s at c=1, 863 at c=256,
771 at c=384, fitted to its twelve points within 5%), a dense 49B (5.8 tok/s at c=1, 695 at c=256, its
KV cache full at ~260 requests of the reference shape: past it, it collapses to 515 at c=320) and a 9B
whose scheduler runs 8 (``max_num_seqs``): flat from c=8 because the rest queue.

The model is event-driven over whole steps: it sleeps until a request finishes or arrives (a request
joins at the next step, as in vLLM), so a long run costs little CPU. Its
interface is the one the closed loop (:mod:`pipeline.bench.closed_loop`) drives: ``generate``, ``now``,
``speed``, ``kv_cache_tokens`` and ``metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

BLOCK = 16  # tokens a KV block holds
REFERENCE_CONTEXT = 1700  # the curves' requests: ~1,500 prompt tokens, ~200 generated on average
MOST_STEPS = 4096  # steps slept at once at most, so a long quiet stretch still publishes its numbers


class Request(Protocol):
    """What the model needs of a request: its prompt and the tokens it will generate."""

    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One server: a step's cost (seconds), its prefill, its scheduler and its KV cache."""

    name: str
    fixed_s: float  # a step's fixed part: the weights read once
    experts_s: float  # a mixture of experts': all experts read...
    expert_share: float  # ...times the share a batch touches (top_k / experts per token); 0: dense
    per_request_s: float  # per running request at the reference context
    per_pair_s: float  # times the batch squared
    prefill_tokens_per_s: float
    max_num_seqs: int
    kv_cache_tokens: int
    graph_max: int | None = None  # the largest batch with a captured CUDA graph; None: all are
    eager_s: float = 0.0  # a step above it pays this times the square of the requests past it
    spill_s: float = 0.0  # a step pays this per token held past the GPU's KV cache (read over the link)
    prefill_budget: int = 8192  # prompt tokens prefilled in one step at most (the first always)

    def step_s(self, batch: int, context_tokens: float, spilled_tokens: float = 0.0) -> float:
        """Seconds of one decode step with ``batch`` requests holding ``context_tokens`` in all, of which
        ``spilled_tokens`` past the GPU's KV cache."""
        if batch <= 0:
            return 0.0
        touched = 1.0 - (1.0 - self.expert_share) ** batch if self.expert_share else 0.0
        seconds = self.fixed_s + self.experts_s * touched
        seconds += self.per_request_s * context_tokens / REFERENCE_CONTEXT + self.per_pair_s * batch**2
        if self.graph_max is not None and batch > self.graph_max:
            seconds += self.eager_s * (batch - self.graph_max) ** 2
        return seconds + self.spill_s * spilled_tokens

    def tokens_per_s(self, batch: int) -> float:
        """Decode output tok/s at ``batch`` requests of the reference context, prefill aside."""
        return batch / self.step_s(batch, batch * REFERENCE_CONTEXT)


# Fitted by least squares (relative error) to the seeds' points with the prefill of the reference
# prompts (1,500 tokens, 400 generated) taken out of each step, then checked against them in
# tests/bench/test_step_server.py.
SERVERS: dict[str, ServerSpec] = {
    spec.name: spec
    for spec in (
        ServerSpec(
            "gpt-oss-120b",  # 128 experts, 4 a token; a DGX Spark
            fixed_s=0.02506,
            experts_s=0.1517,
            expert_share=4 / 128,
            per_request_s=8.352e-5,
            per_pair_s=8.706e-7,
            prefill_tokens_per_s=20_000.0,
            max_num_seqs=512,
            kv_cache_tokens=1_100_000,
            graph_max=256,
            eager_s=5.43e-6,  # 771 tok/s at 384
            spill_s=6e-6,  # with a KV cache of 64 requests, twice that many deliver under half the peak
        ),
        ServerSpec(
            "nemotron-super-49b",  # dense
            fixed_s=0.1733,
            experts_s=0.0,
            expert_share=0.0,
            per_request_s=1.639e-4,
            per_pair_s=4.964e-7,
            prefill_tokens_per_s=8_000.0,
            max_num_seqs=512,
            kv_cache_tokens=500_000,  # ~260 requests of the reference shape when done
            spill_s=3.9e-6,  # 515 tok/s at 320
        ),
        ServerSpec(
            "nemotron-nano-9b",  # hybrid; its scheduler runs 8
            fixed_s=0.03798,
            experts_s=0.0,
            expert_share=0.0,
            per_request_s=0.0,
            per_pair_s=1.922e-4,
            prefill_tokens_per_s=15_000.0,
            max_num_seqs=8,
            kv_cache_tokens=400_000,
        ),
    )
}


@dataclass(slots=True)
class StepMetrics:
    """What ``/metrics`` would show, and the run's peaks."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    preemptions: int = 0  # never: past the cache this server spills, it does not preempt
    peak_running: int = 0
    peak_waiting: int = 0
    finished: int = 0


@dataclass(eq=False, slots=True)
class _Job:
    prompt: int
    output: int
    generated: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def context(self) -> int:
        return self.prompt + self.generated

    def blocks_after(self, steps: float) -> int:
        return math.ceil((self.context + steps) / BLOCK)


class StepServer:
    """The server (the module docstring says how it batches and how it fails past its KV cache)."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        speed: float = 1.0,
        max_num_seqs: int | None = None,
        kv_cache_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec, self.speed, self._clock = spec, speed, clock
        self.max_num_seqs = max_num_seqs or spec.max_num_seqs
        self.kv_cache_tokens = kv_cache_tokens or spec.kv_cache_tokens
        self.total_blocks = max(1, self.kv_cache_tokens // BLOCK)
        self.metrics = StepMetrics()
        self._running: list[_Job] = []
        self._waiting: deque[_Job] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        """The model's seconds: the client's times ``speed``."""
        return self._clock() * self.speed

    async def generate(self, request: Request) -> None:
        """Serve one request until it has generated all its tokens (cancel to abort it)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        job = _Job(request.prompt_tokens, max(1, request.output_tokens))
        self._waiting.append(job)
        self._publish()
        self._wake.set()
        try:
            await job.done.wait()
        except asyncio.CancelledError:
            self._abort(job)
            raise

    def _abort(self, job: _Job) -> None:
        if job in self._running:
            self._running.remove(job)
        elif job in self._waiting:
            self._waiting.remove(job)
        self._publish()
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._publish()
                self._wake.clear()
                await self._wake.wait()
                continue
            prefill_s = self._admit() / self.spec.prefill_tokens_per_s
            self._publish()
            steps = min(MOST_STEPS, min(job.output - job.generated for job in self._running))
            if self._waiting and len(self._running) < self.max_num_seqs:
                steps = 1  # the prefill budget left some: the next step admits more
            middle = steps / 2  # the requests grow during the steps: their mean context
            context = sum(job.context for job in self._running) + middle * len(self._running)
            step_s = self.spec.step_s(len(self._running), context, self._spilled(middle))
            done = await self._sleep(prefill_s, step_s, steps)
            self._step(done)
            self._publish()

    async def _sleep(self, prefill_s: float, step_s: float, steps: int) -> int:
        """Sleep through ``steps`` steps, or fewer when a request arrives or leaves: the step in progress
        ends first (a request joins at the next one). The steps slept."""
        self._wake.clear()
        started, planned = self.now(), prefill_s + steps * step_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(planned, 1e-9) / self.speed)
        elapsed = self.now() - started
        if elapsed >= planned - 1e-9 or step_s <= 0:
            return steps
        done = min(steps, max(1, math.ceil((elapsed - prefill_s) / step_s - 1e-9)))
        rest = prefill_s + done * step_s - elapsed
        if rest > 0:
            await asyncio.sleep(rest / self.speed)
        return done

    def _admit(self) -> int:
        """Admit waiting requests in order while the scheduler has slots, within the prefill budget (the
        first always); the prompt tokens to prefill."""
        prefill = 0
        while self._waiting and len(self._running) < self.max_num_seqs:
            job = self._waiting[0]
            if self._running and prefill + job.prompt > self.spec.prefill_budget:
                break
            self._waiting.popleft()
            prefill += job.prompt
            self._running.append(job)
        return prefill

    def _held_blocks(self, steps: float = 0.0) -> int:
        return sum(job.blocks_after(steps) for job in self._running)

    def _spilled(self, steps: float) -> float:
        """Tokens held past the GPU's KV cache after ``steps`` more steps."""
        return max(0, self._held_blocks(steps) - self.total_blocks) * BLOCK

    def _step(self, steps: int) -> None:
        """``steps`` steps done: every running request gained as many tokens (no more than it makes)."""
        for job in list(self._running):
            job.generated = min(job.output, job.generated + steps)
            if job.generated >= job.output:
                self._running.remove(job)
                self.metrics.finished += 1
                job.done.set()

    def _publish(self) -> None:
        metrics = self.metrics
        metrics.running, metrics.waiting = len(self._running), len(self._waiting)
        metrics.kv_usage = min(1.0, self._held_blocks() / self.total_blocks)
        metrics.peak_running = max(metrics.peak_running, metrics.running)
        metrics.peak_waiting = max(metrics.peak_waiting, metrics.waiting)


class Numbers(Protocol):
    """A server model's ``/metrics`` as the closed loop reads them."""

    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def peak_running(self) -> int: ...
    @property
    def peak_waiting(self) -> int: ...


@dataclass(frozen=True, slots=True)
class QueuedPastCache:
    """A server's numbers as vLLM shows them past its KV cache: no more running than the cache holds
    (``holds`` requests), the rest waiting (preempted, or not admitted), whatever the model runs."""

    numbers: Numbers
    holds: int

    @property
    def running(self) -> int:
        return min(self.numbers.running, self.holds)

    @property
    def waiting(self) -> int:
        return self.numbers.waiting + max(0, self.numbers.running - self.holds)

    @property
    def kv_usage(self) -> float:
        return self.numbers.kv_usage

    @property
    def preemptions(self) -> int:
        return self.numbers.preemptions

    @property
    def peak_running(self) -> int:
        return min(self.numbers.peak_running, self.holds)

    @property
    def peak_waiting(self) -> int:
        return self.numbers.peak_waiting
