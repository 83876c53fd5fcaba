"""What a server can hold and how fast it answers as it fills: read from its ``/v1/models`` (the context),
``/metrics`` (the KV cache: ``vllm:cache_config_info``; and its counters, read before a run's first
request) and ``/tokenize`` (the shared prefix's tokens), and the arithmetic over them: what one of a
job's requests holds in the KV cache and how many fit at once (:class:`RequestFit`, the one place that
counts them: ``pipeline check``, the run's preflight, ``concurrency: auto``'s start and the sharing of a
server between jobs all call it), the latency of a reply at a concurrency, and the throughput.

**What a request holds**, as vLLM holds it: the KV cache is ``num_gpu_blocks`` blocks of ``block_size``
tokens (16 on a GPU, 128 on vLLM's CPU build), and a running request holds the blocks of its prompt and
of what it has generated, a partly filled block a whole one. With automatic prefix caching, a block is
shared only when it is full and everything before it is the same, so the full blocks of the job's shared
prefix (system prompt, examples, template) are held once for all running requests and each holds the
rest on its own; without it, each holds all of its own. At its peak a request holds its whole answer, and
the requests a run sends together (its first wave) peak together, so ``N`` fit while ``shared + N x own``
blocks do, where ``own`` counts the prompt and the whole answer (see :class:`RequestFit` for which
answer). The simulator (``pipeline sim --kv-tokens``) admits and preempts by the same arithmetic.

The latency model is the seed curve's (gpt-oss-120b on one GPU box: 33.5 output tok/s on one stream,
863 over 256): aggregate speed grows as concurrency to the power :data:`SCALING_EXPONENT` (0.59), so
each stream slows as concurrency to the power 0.41, and a reply alone in 25 s takes ~4 min at c=256.
Past the requests that fit, the rest wait for a slot: latency grows in proportion. A server measured
by ``pipeline bench`` has its own curve; this one only has to say when a timeout is far too short.
A server that does not say (a proxy without ``/metrics`` or ``/tokenize``) leaves those readings None.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import anyio

from pipeline.errors import PipelineError
from pipeline.servers.client import ChatMessage, LLMClient
from pipeline.servers.http import http_client, text_if_ok
from pipeline.servers.scrape import (
    RUNNING,
    SPEED,
    CacheConfig,
    metrics_url,
    parse_cache_config,
    parse_metrics,
)

#: Aggregate output speed grows as concurrency ** this: log(863 / 33.5) / log(256), the seed curve.
SCALING_EXPONENT = math.log(863.0 / 33.5) / math.log(256.0)
#: vLLM's block size on a GPU: what a fit counts in when the server does not say its own.
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class ServerReading:
    """What one server says of itself; None where it does not say."""

    base_url: str
    context: int | None  # max_model_len, as /v1/models lists it (or the job's own max_model_len)
    cache: CacheConfig | None  # None: no /metrics, or no vllm:cache_config_info in them
    metrics: bool  # whether /metrics answered
    prefix_tokens: int | None  # the job's shared prefix (system prompt, examples) as /tokenize counts it
    time_scale: float = 1.0  # the simulator's --speed: its seconds are this many of the model's
    running: float | None = None  # requests the server was running when read (another job's, say)
    # Its /metrics as parse_metrics reads them: a run's counters start from these (before its first request).
    values: Mapping[str, float] = field(default_factory=dict)

    @property
    def kv_tokens(self) -> int | None:
        return self.cache.kv_tokens if self.cache is not None else None

    @property
    def block_size(self) -> int:
        block_size = self.cache.block_size if self.cache is not None else None
        return block_size or DEFAULT_BLOCK_SIZE

    @property
    def prefix_caching(self) -> bool | None:
        return self.cache.prefix_caching if self.cache is not None else None


async def read_server(
    client: LLMClient, prefix: Sequence[ChatMessage], *, timeout_s: float, check_model: bool = True
) -> ServerReading:
    """Read the server behind ``client``: its model list (``check_model``: raising as a run's preflight
    does when it is down or lacks the model), its ``/metrics`` and its count of ``prefix``; a reading
    that takes longer than ``timeout_s`` or fails is None, never an error."""
    if check_model:
        await client.check_server()
    text = await _metrics_text(client.settings.base_url, timeout_s)
    prefix_tokens = None
    with contextlib.suppress(PipelineError, TimeoutError), anyio.fail_after(timeout_s):
        prefix_tokens = await client.count_tokens(tuple(prefix))
    try:
        values = parse_metrics(text) if text is not None else {}
        cache = parse_cache_config(text) if text is not None else None
    except ValueError:  # whatever answers at /metrics, it is not Prometheus text
        text, values, cache = None, {}, None
    return ServerReading(
        base_url=client.settings.base_url,
        context=client.context_length,
        cache=cache,
        metrics=text is not None,
        prefix_tokens=prefix_tokens,
        time_scale=values.get(SPEED, 1.0) or 1.0,
        running=values.get(RUNNING),
        values=values,
    )


async def _metrics_text(base_url: str, timeout_s: float) -> str | None:
    try:
        with anyio.fail_after(timeout_s):
            async with http_client(timeout_s=timeout_s) as http:
                return await text_if_ok(http, metrics_url(base_url))
    except (TimeoutError, OSError):
        return None


@dataclass(frozen=True, slots=True)
class RequestFit:
    """What one of a job's requests holds in a server's KV cache at its peak, and how many fit at once
    (the module docstring says how vLLM holds them). ``prompt_tokens``: the whole prompt as the server
    counts it, the shared prefix included. ``answer_tokens``: what the request generates, reasoning
    included: the mean of measured replies (``pipeline check``'s probes, a run's first window), since
    preemption comes from the tokens really held; before any reply, ``max_tokens``, the most it may take
    (a floor of the fit on the answer's side, while the record's own text is not counted yet)."""

    kv_tokens: int  # num_gpu_blocks x block_size (vllm:cache_config_info)
    prompt_tokens: float
    answer_tokens: float
    shared_prefix_tokens: float = 0.0  # the prompt's fixed part, as /tokenize counts it
    prefix_caching: bool = False
    block_size: int = DEFAULT_BLOCK_SIZE

    @classmethod
    def of_reading(
        cls, reading: ServerReading, *, answer_tokens: float | None, prompt_tokens: float | None = None
    ) -> RequestFit | None:
        """The fit by what a server says of itself (its KV cache, prefix caching, block size and the
        shared prefix's tokens) for answers of ``answer_tokens`` and prompts of ``prompt_tokens`` (as
        replies measured them; default the shared prefix alone); None while the server has not said."""
        prompt = reading.prefix_tokens if prompt_tokens is None else prompt_tokens
        if reading.kv_tokens is None or prompt is None or answer_tokens is None:
            return None
        return cls(
            reading.kv_tokens,
            prompt_tokens=prompt,
            answer_tokens=answer_tokens,
            shared_prefix_tokens=reading.prefix_tokens or 0,
            prefix_caching=bool(reading.prefix_caching),
            block_size=reading.block_size,
        )

    @property
    def shared_blocks(self) -> int:
        """The blocks every running request shares, held once: with prefix caching, the full blocks of
        the shared prefix (vLLM caches no partial block; the rest of it is each request's own)."""
        if not self.prefix_caching:
            return 0
        return int(min(self.shared_prefix_tokens, self.prompt_tokens) // self.block_size)

    @property
    def own_blocks(self) -> int:
        """The blocks one request holds on its own with its whole answer: its prompt and answer in whole
        blocks, less those it shares."""
        return _blocks(self.prompt_tokens + self.answer_tokens, self.block_size) - self.shared_blocks

    @property
    def own_tokens(self) -> int:
        return self.own_blocks * self.block_size

    @property
    def shared_tokens(self) -> int:
        return self.shared_blocks * self.block_size

    @property
    def requests(self) -> int:
        """How many of these requests the KV cache holds at once, each with its whole answer."""
        own = self.own_blocks
        if own <= 0:
            return 0
        return max(0, (self.kv_tokens // self.block_size - self.shared_blocks) // own)

    def measured(self, prompt_tokens: float, answer_tokens: float) -> RequestFit:
        """The fit for replies measured: their mean prompt and answer tokens (usage)."""
        return replace(self, prompt_tokens=max(1.0, prompt_tokens), answer_tokens=max(1.0, answer_tokens))

    @property
    def held(self) -> str:
        """What one request holds, in words: ``~592 tokens each of its own, for ~3,087 prompt and ~343
        answer tokens, 2,848 prefix tokens held once``."""
        shared = f", {self.shared_tokens:,} prefix tokens held once" if self.shared_blocks else ""
        return (
            f"~{self.own_tokens:,} tokens each of its own, for ~{self.prompt_tokens:,.0f} prompt and "
            f"~{self.answer_tokens:,.0f} answer tokens{shared}"
        )

    @property
    def words(self) -> str:
        return f"{self.requests} requests of this job fit in the KV cache ({self.held})"


def _blocks(tokens: float, block_size: int) -> int:
    """The blocks ``tokens`` take: a partly filled block is a block (a mean's rounding error is not)."""
    return math.ceil(tokens / block_size - 1e-9)


def aggregate_tokens_per_s(single_stream_tok_s: float, concurrency: float) -> float:
    """Output tokens per second over ``concurrency`` streams, from one stream's speed (the seed curve)."""
    return single_stream_tok_s * float(max(1.0, concurrency) ** SCALING_EXPONENT)


def reply_latency_s(latency_alone_s: float, concurrency: int, fit: int | None = None) -> float:
    """How long one reply takes with ``concurrency`` in flight, from how long it takes alone: each of
    the running streams slows as the aggregate curve saturates; those past ``fit`` wait their turn."""
    running = concurrency if fit is None else max(1, min(concurrency, fit))
    latency = latency_alone_s * float(running ** (1.0 - SCALING_EXPONENT))
    return latency * concurrency / running


def effective_concurrency(concurrency: int, fit: int | None) -> int:
    """The streams that really run at once: no more than fit in the KV cache."""
    return concurrency if fit is None or fit <= 0 else min(concurrency, fit)
