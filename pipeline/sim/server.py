"""An OpenAI-compatible server that answers like vLLM serving a reasoning model, with fault knobs.

Timing comes either from a calibrated engine (``profile``: continuous batching, max-num-seqs, prefill,
prefix cache, KV cache; see :mod:`pipeline.sim.engine`) or from a fixed latency per request. Answers
are valid instances of the request's JSON schema; reasoning shares ``max_tokens`` with the answer
(:mod:`pipeline.sim.answers`); an answer's content depends only on the seed and the record's prompt.
Faults (and answer noise) are drawn per request from a seeded generator. Streaming
(``stream: true``) sends server-sent events: the first at the first token, for TTFT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.sim.answers import (
    DEFAULT_REASONING_TOKENS,
    Answer,
    Draws,
    Variation,
    in_reasoning,
    plan_answer,
)
from pipeline.sim.engine import KV_THRASH, Engine, Sequence
from pipeline.sim.http import HttpRequest, HttpResponse
from pipeline.sim.metrics import CacheConfig, vllm_metrics
from pipeline.sim.profiles import PROFILES
from pipeline.sim.tokens import block_hashes, prompt_text, prompt_tokens, text_tokens


@dataclass(frozen=True, slots=True)
class Faults:
    """Probabilities per chat request; at most one fault applies to a request."""

    server_error: float = 0.0  # 500 (or 503 with Retry-After)
    reset: float = 0.0  # connection dropped without an answer
    hang: float = 0.0  # never answers: only the client's timeout ends it
    invalid_json: float = 0.0
    schema_invalid: float = 0.0
    length: float = 0.0  # the answer is cut short: finish_reason "length"
    # 400 for a request past the context, as behind a proxy that sends the whole context as max_tokens:
    # the real context, the prompt as counted, and that budget (never a request that fits refused)
    context_length: float = 0.0

    def items(self) -> list[tuple[str, float]]:
        return [(name, getattr(self, name)) for name in self.__slots__]


@dataclass(frozen=True, slots=True)
class SimConfig:
    model: str = "sim-model"
    profile: str | None = None  # a calibrated engine (PROFILES); None: fixed latency below
    speed: float = 1.0  # time compression of the engine
    max_num_seqs: int | None = None  # override the profile's
    kv_cache_tokens: int | None = None  # override the profile's (its ``num_gpu_blocks`` x 16 in /metrics)
    kv_thrash: float | None = None  # the fall past the KV cache (engine.py); None: on with kv_cache_tokens
    prefix_caching: bool = (
        True  # off: every prompt token prefilled, no hits (vLLM's --no-enable-prefix-caching)
    )
    latency_s: float = 0.0  # without a profile: fixed time per request
    seconds_per_token: float = 0.0  # without a profile: added per generated token
    jitter: float = 0.0  # ± fraction applied to the fixed delay
    seed: int = 0
    max_model_len: int = 131072
    # Like vLLM, it lists max_model_len in /v1/models and counts a prompt's tokens at POST /tokenize;
    # off, like servers that do neither (the client must learn the context from a 400 then).
    list_context: bool = True
    tokenize: bool = True
    api_key: str | None = None  # if set, requests must carry it
    reasoning_field: str = "reasoning"  # older vLLM: "reasoning_content"
    faults: Faults = field(default_factory=Faults)
    # Like a server without guided decoding: a request with response_format is a 400 naming it.
    reject_response_format: bool = False
    # gpt-oss's reasoning parser bug (vLLM issue 23694): with response_format, the JSON comes in the
    # reasoning field and content is null, finish_reason "stop".
    answer_in_reasoning: bool = False
    # How answers vary (answers.Variation): per-request noise, prompt-sensitive and empty fields.
    answer_noise: float = 0.0
    prompt_sensitive: tuple[str, ...] = ()
    empty_fields: tuple[str, ...] = ()
    quoted_answers: bool = False  # text values copied from the record (grounded), not made-up words

    @property
    def variation(self) -> Variation:
        return Variation(
            self.answer_noise,
            frozenset(self.prompt_sensitive),
            frozenset(self.empty_fields),
            self.quoted_answers,
        )


@dataclass(slots=True)
class SimMetrics:
    running: int = 0
    peak_running: int = 0
    in_flight: int = 0  # chat requests being handled, faulted ones included
    peak_in_flight: int = 0
    requests: int = 0  # chat requests the engine generated for (faulted answers included)
    chat_requests: int = 0  # every chat request received, 5xx/reset/hang/400 faults included
    max_prompt_tokens: int = 0  # the largest prompt received: re-asks must not grow it without bound
    max_messages: int = 0  # the most messages in one chat request
    # The smallest max_tokens a chat request asked for (None before any): a client must not starve one.
    min_max_tokens: int | None = None
    context_rejections: int = 0  # chat requests refused with a 400 because they did not fit the context
    tokenize_requests: int = 0  # POST /tokenize answered
    successes: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    reasoning_tokens: int = 0  # of the generation tokens, in answers the client received
    faults: dict[str, int] = field(default_factory=dict)


async def _finally(stream: AsyncIterator[bytes], done: Callable[[], None]) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            yield chunk
    finally:
        done()


def _error(status: int, message: str, kind: str, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return HttpResponse(status, orjson.dumps(body), headers=headers)


class SimServer:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = SimMetrics()
        self._rng = random.Random(config.seed)
        profile = PROFILES[config.profile] if config.profile else None
        self.engine = (
            Engine(
                profile,
                speed=config.speed,
                max_num_seqs=config.max_num_seqs,
                kv_cache_tokens=config.kv_cache_tokens,
                prefix_caching=config.prefix_caching,
                thrash=_thrash(config),
            )
            if profile is not None
            else None
        )
        self._reasoning = (profile.reasoning_tokens if profile else None) or DEFAULT_REASONING_TOKENS

    async def handle(self, request: HttpRequest) -> HttpResponse:
        path = request.path.split("?", 1)[0].rstrip("/")
        if request.method == "GET" and path == "/health":
            return HttpResponse(200, b"", content_type="text/plain")
        if request.method == "GET" and path == "/metrics":
            return HttpResponse(200, self.prometheus(), content_type="text/plain")
        if request.method == "GET" and path == "/v1/models":
            return self._models()
        if request.method == "POST" and path == "/v1/chat/completions":
            return await self._counted(self._chat(request))
        if request.method == "POST" and path == "/tokenize" and self.config.tokenize:
            return self._tokenize(request)
        return _error(404, f"no route {request.method} {path}", "NotFoundError")

    async def _counted(self, handling: Awaitable[HttpResponse]) -> HttpResponse:
        """Count the request in flight until its answer (or its stream) is done."""
        metrics = self.metrics
        metrics.in_flight += 1
        metrics.peak_in_flight = max(metrics.peak_in_flight, metrics.in_flight)
        try:
            response = await handling
        except BaseException:
            metrics.in_flight -= 1
            raise
        if response.stream is None:
            metrics.in_flight -= 1
            return response
        return dataclasses.replace(response, stream=_finally(response.stream, self._one_less))

    def _one_less(self) -> None:
        self.metrics.in_flight -= 1

    def prometheus(self) -> bytes:
        """vLLM's metrics as vLLM writes them (:mod:`pipeline.sim.metrics`), then the simulator's own."""
        label = f'{{model_name="{self.config.model}"}}'
        engine = self.engine.metrics if self.engine else None
        vllm = {
            "vllm:num_requests_running": engine.running if engine else self.metrics.running,
            "vllm:num_requests_waiting": engine.waiting if engine else 0,
            "vllm:kv_cache_usage_perc": engine.kv_usage if engine else 0.0,
            "vllm:prompt_tokens_total": self.metrics.prompt_tokens,
            "vllm:generation_tokens_total": self.metrics.generation_tokens,
            "vllm:request_success_total": self.metrics.successes,
            "vllm:prefix_cache_queries_total": engine.prefix_queries if engine else 0,
            "vllm:prefix_cache_hits_total": engine.prefix_hits if engine else 0,
            "vllm:num_preemptions_total": engine.preemptions if engine else 0,
        }
        cache = (
            CacheConfig(self.engine.kv_cache_tokens, self.config.prefix_caching, self.engine.block_size)
            if self.engine
            else CacheConfig(None, self.config.prefix_caching)
        )
        own = {
            "pipeline_sim:speed": self.config.speed if self.engine else 1.0,
            "pipeline_sim:peak_requests_running": self.metrics.peak_running,
            "pipeline_sim:peak_requests_waiting": engine.peak_waiting if engine else 0,
            "pipeline_sim:requests_in_flight": self.metrics.in_flight,
            "pipeline_sim:peak_requests_in_flight": self.metrics.peak_in_flight,
            "pipeline_sim:requests_total": self.metrics.requests,
            "pipeline_sim:chat_requests_total": self.metrics.chat_requests,
            "pipeline_sim:max_prompt_tokens": self.metrics.max_prompt_tokens,
            "pipeline_sim:max_messages": self.metrics.max_messages,
            "pipeline_sim:min_max_tokens": self.metrics.min_max_tokens or 0,
            "pipeline_sim:reasoning_tokens_total": self.metrics.reasoning_tokens,
            "pipeline_sim:context_rejections_total": self.metrics.context_rejections,
            "pipeline_sim:tokenize_requests_total": self.metrics.tokenize_requests,
        }
        lines = [vllm_metrics(self.config.model, vllm, cache)]
        lines += [f"{name}{label} {value}\n" for name, value in own.items()]
        lines += [
            f'pipeline_sim:faults_total{{model_name="{self.config.model}",fault="{name}"}} '
            f"{self.metrics.faults.get(name, 0)}\n"
            for name, _ in self.config.faults.items()
        ]
        return "".join(lines).encode()

    def _models(self) -> HttpResponse:
        entry: dict[str, Any] = {"id": self.config.model, "object": "model", "owned_by": "pipeline-sim"}
        if self.config.list_context:
            entry["max_model_len"] = self.config.max_model_len
        return HttpResponse(200, orjson.dumps({"object": "list", "data": [entry]}))

    def _tokenize(self, request: HttpRequest) -> HttpResponse:
        """vLLM's ``POST /tokenize``: ``messages`` counted as a chat completion counts them (its
        ``usage.prompt_tokens``), or a plain ``prompt``; the token ids are the simulator's own."""
        try:
            body = orjson.loads(request.body)
            messages = body.get("messages")
            count = prompt_tokens(messages) if messages is not None else text_tokens(body["prompt"])
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            return _error(400, "the request body is not a tokenize request", "BadRequestError")
        if body.get("model") not in (None, self.config.model):
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        self.metrics.tokenize_requests += 1
        answer = {"count": count, "max_model_len": self.config.max_model_len, "tokens": list(range(count))}
        return HttpResponse(200, orjson.dumps(answer))

    def _authorized(self, request: HttpRequest) -> bool:
        key = self.config.api_key
        return key is None or request.headers.get("authorization") == f"Bearer {key}"

    async def _chat(self, request: HttpRequest) -> HttpResponse:
        if not self._authorized(request):
            return _error(401, "Unauthorized", "AuthenticationError")
        try:
            body = orjson.loads(request.body)
            messages = body["messages"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "the request body is not a chat completion request", "BadRequestError")
        if body.get("model") != self.config.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if self.config.reject_response_format and body.get("response_format") is not None:
            self.metrics.chat_requests += 1
            return _error(
                400, "response_format is not supported by this server (no guided decoding)", "BadRequestError"
            )
        text = prompt_text(messages)
        prompt = text_tokens(text)
        self.metrics.chat_requests += 1
        self.metrics.max_prompt_tokens = max(self.metrics.max_prompt_tokens, prompt)
        self.metrics.max_messages = max(self.metrics.max_messages, len(messages))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1024)
        least = self.metrics.min_max_tokens
        self.metrics.min_max_tokens = max_tokens if least is None else min(least, max_tokens)
        fault = self._draw_fault()
        if fault == "context_length":
            max_tokens = self.config.max_model_len  # what the proxy in between asked for
        if prompt + max_tokens > self.config.max_model_len:
            return self._context_error(prompt, max_tokens)
        failure = await self._failure(fault)
        if failure is not None:
            return failure
        draws = Draws(self.config.seed, messages, self.config.variation, self._rng)
        answer = plan_answer(body, draws, fault, self._reasoning)
        if self.config.answer_in_reasoning and body.get("response_format") is not None:
            answer = in_reasoning(answer)
        sequence = self._sequence(text, prompt, answer)
        if body.get("stream"):
            stream = self._stream(body, sequence, answer, prompt)
            return HttpResponse(200, content_type="text/event-stream", stream=stream)
        await self._generate(sequence)
        self.metrics.reasoning_tokens += answer.reasoning_tokens
        return HttpResponse(200, orjson.dumps(self._completion(answer, prompt)))

    def _draw_fault(self) -> str | None:
        draw = self._rng.random()
        for name, rate in self.config.faults.items():
            if draw < rate:
                self.metrics.faults[name] = self.metrics.faults.get(name, 0) + 1
                return name
            draw -= rate
        return None

    async def _failure(self, fault: str | None) -> HttpResponse | None:
        if fault == "hang":
            self.metrics.running += 1
            try:
                await asyncio.Event().wait()  # until the client disconnects and cancels us
            finally:
                self.metrics.running -= 1
        if fault == "reset":
            await self._delay(1)
            return HttpResponse(500, abort=True)
        if fault == "server_error":
            await self._delay(1)
            if self._rng.random() < 0.5:
                return _error(
                    503, "server overloaded (simulated)", "ServiceUnavailableError", (("retry-after", "1"),)
                )
            return _error(500, "internal server error (simulated)", "InternalServerError")
        return None

    def _context_error(self, prompt: int, max_tokens: int) -> HttpResponse:
        self.metrics.context_rejections += 1
        limit = self.config.max_model_len
        return _error(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            "BadRequestError",
        )

    def _sequence(self, text: str, prompt: int, answer: Answer) -> Sequence:
        """The engine's view: the prompt's tokens, and its full blocks' hashes for the prefix cache (the
        whole prompt's, as vLLM hashes them: two requests share what they have in common from the
        start, the system prompt and the few-shot turns, and a re-ask its record's first prompt)."""
        engine = self.engine
        blocks = block_hashes(text, engine.block_size) if engine is not None and engine.prefix_caching else ()
        return Sequence(prompt, answer.completion_tokens, blocks=blocks)

    async def _generate(self, sequence: Sequence) -> None:
        self.metrics.requests += 1
        self.metrics.running += 1
        self.metrics.peak_running = max(self.metrics.peak_running, self.metrics.running)
        try:
            if self.engine is not None:
                await self.engine.generate(sequence)
            else:
                sequence.first_token.set()
                await self._delay(sequence.output_tokens)
        finally:
            self.metrics.running -= 1
        self.metrics.successes += 1
        self.metrics.prompt_tokens += sequence.prompt_tokens
        self.metrics.generation_tokens += sequence.output_tokens

    async def _delay(self, tokens: int) -> None:
        config = self.config
        delay = config.latency_s + config.seconds_per_token * tokens
        if config.jitter:
            delay *= 1 + config.jitter * (2 * self._rng.random() - 1)
        if delay > 0:
            await asyncio.sleep(delay)

    def _message(self, answer: Answer) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        message[self.config.reasoning_field] = answer.reasoning
        return message

    def _usage(self, answer: Answer, prompt: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": answer.completion_tokens,
            "total_tokens": prompt + answer.completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
        }

    def _completion(self, answer: Answer, prompt: int) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-sim-{self.metrics.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model,
            "choices": [
                {"index": 0, "message": self._message(answer), "finish_reason": answer.finish_reason}
            ],
            "usage": self._usage(answer, prompt),
        }

    async def _stream(
        self, body: dict[str, Any], sequence: Sequence, answer: Answer, prompt: int
    ) -> AsyncIterator[bytes]:
        """Server-sent events: the role and the first piece at the first token, the rest at the end."""
        generation = asyncio.ensure_future(self._generate(sequence))
        try:
            await sequence.first_token.wait()
            first_field = self.config.reasoning_field if answer.reasoning else "content"
            first_text = (answer.reasoning or answer.content or "")[:4]
            yield self._event({"role": "assistant", first_field: first_text}, None)
            await generation
            if answer.reasoning:
                yield self._event({self.config.reasoning_field: answer.reasoning[4:]}, None)
            rest = (answer.content or "") if answer.reasoning else (answer.content or "")[4:]
            if rest:
                yield self._event({"content": rest}, None)
            yield self._event({}, answer.finish_reason)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield self._sse(
                    {
                        "id": "chatcmpl-sim",
                        "object": "chat.completion.chunk",
                        "model": self.config.model,
                        "choices": [],
                        "usage": self._usage(answer, prompt),
                    }
                )
            yield b"data: [DONE]\n\n"
        finally:
            generation.cancel()

    def _event(self, delta: dict[str, Any], finish_reason: str | None) -> bytes:
        return self._sse(
            {
                "id": "chatcmpl-sim",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.config.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
        )

    @staticmethod
    def _sse(payload: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"


def _thrash(config: SimConfig) -> float:
    """A KV cache given in tokens is one to overshoot: past it throughput falls, as a real server's does."""
    if config.kv_thrash is not None:
        return config.kv_thrash
    return KV_THRASH if config.kv_cache_tokens else 0.0
