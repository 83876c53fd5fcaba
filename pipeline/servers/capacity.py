"""What a server can hold and how fast it answers as it fills: read from its ``/v1/models`` (the context),
``/metrics`` (the KV cache: ``vllm:cache_config_info``) and ``/tokenize`` (the shared prefix's tokens),
and the arithmetic over them: how many of a job's requests fit in the KV cache at once
(:func:`requests_that_fit`, the one place that says it: ``pipeline check``, the run's preflight, and
``concurrency: auto``'s start call it), the latency of a reply at a concurrency, and the throughput.

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
from collections.abc import Sequence
from dataclasses import dataclass

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

    @property
    def kv_tokens(self) -> int | None:
        return self.cache.kv_tokens if self.cache is not None else None

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
    )


async def _metrics_text(base_url: str, timeout_s: float) -> str | None:
    try:
        with anyio.fail_after(timeout_s):
            async with http_client(timeout_s=timeout_s) as http:
                return await text_if_ok(http, metrics_url(base_url))
    except (TimeoutError, OSError):
        return None


def requests_that_fit(
    kv_tokens: int,
    *,
    prompt_tokens: float,
    answer_tokens: float,
    shared_prefix_tokens: float = 0,
    prefix_caching: bool = False,
    block_size: int | None = None,
) -> int:
    """How many requests of this shape the KV cache holds at once: ``kv_tokens`` over the tokens one
    request holds (its prompt and its answer), where with prefix caching the shared prefix is held once
    for all of them. vLLM allocates whole blocks: a request's own tokens are rounded up to
    ``block_size``."""
    shared = min(shared_prefix_tokens, prompt_tokens) if prefix_caching else 0.0
    own = prompt_tokens - shared + answer_tokens
    if block_size:
        own = math.ceil(own / block_size) * block_size
        shared = math.ceil(shared / block_size) * block_size
    if own <= 0:
        return 0
    return max(0, math.floor((kv_tokens - shared) / own))


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
