"""An OpenAI-compatible server that answers like vLLM serving a reasoning model, with fault knobs.

Answers are valid instances of the request's ``response_format`` JSON schema. Reasoning tokens
(by ``reasoning_effort``) share ``max_tokens`` with the answer, exactly the trap gpt-oss sets: an
exhausted budget gives ``finish_reason: "length"`` with truncated JSON, or ``content: null`` with
partial reasoning. Faults are drawn per request from a seeded generator.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.sim.http import HttpRequest, HttpResponse
from pipeline.sim.instances import InstanceGenerator

CHARS_PER_TOKEN = 4
REASONING_TOKENS = {"minimal": 16, "low": 64, "medium": 256, "high": 1024}
DEFAULT_EFFORT = "medium"  # gpt-oss's default when the request names none


@dataclass(frozen=True, slots=True)
class Faults:
    """Probabilities per chat request; at most one fault applies to a request."""

    server_error: float = 0.0  # 500 (or 503 with Retry-After)
    reset: float = 0.0  # connection dropped without an answer
    hang: float = 0.0  # never answers: only the client's timeout ends it
    invalid_json: float = 0.0
    schema_invalid: float = 0.0
    length: float = 0.0  # the answer is cut short: finish_reason "length"
    context_length: float = 0.0  # 400: the prompt does not fit the context

    def items(self) -> list[tuple[str, float]]:
        return [(name, getattr(self, name)) for name in self.__slots__]


@dataclass(frozen=True, slots=True)
class SimConfig:
    model: str = "sim-model"
    latency_s: float = 0.0  # fixed time per request
    seconds_per_token: float = 0.0  # added per generated token
    jitter: float = 0.0  # ± fraction applied to the delay
    seed: int = 0
    max_model_len: int = 131072
    api_key: str | None = None  # if set, requests must carry it
    reasoning_field: str = "reasoning"  # older vLLM: "reasoning_content"
    faults: Faults = field(default_factory=Faults)


@dataclass(slots=True)
class SimMetrics:
    running: int = 0
    peak_running: int = 0
    requests: int = 0
    successes: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def prometheus(self, model: str) -> bytes:
        label = f'{{model_name="{model}"}}'
        lines = [
            f"vllm:num_requests_running{label} {self.running}",
            f"vllm:num_requests_waiting{label} 0",
            f"vllm:kv_cache_usage_perc{label} 0.0",
            f"vllm:prompt_tokens_total{label} {self.prompt_tokens}",
            f"vllm:generation_tokens_total{label} {self.generation_tokens}",
            f"vllm:request_success_total{label} {self.successes}",
            f"vllm:prefix_cache_queries_total{label} 0",
            f"vllm:prefix_cache_hits_total{label} 0",
            f"pipeline_sim:peak_requests_running{label} {self.peak_running}",
            f"pipeline_sim:requests_total{label} {self.requests}",
        ]
        return ("\n".join(lines) + "\n").encode()


def _error(status: int, message: str, kind: str, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return HttpResponse(status, orjson.dumps(body), headers=headers)


class SimServer:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = SimMetrics()
        self._rng = random.Random(config.seed)

    async def handle(self, request: HttpRequest) -> HttpResponse:
        path = request.path.split("?", 1)[0].rstrip("/")
        if request.method == "GET" and path == "/health":
            return HttpResponse(200, b"", content_type="text/plain")
        if request.method == "GET" and path == "/metrics":
            return HttpResponse(200, self.metrics.prometheus(self.config.model), content_type="text/plain")
        if request.method == "GET" and path == "/v1/models":
            return self._models()
        if request.method == "POST" and path == "/v1/chat/completions":
            return await self._chat(request)
        return _error(404, f"no route {request.method} {path}", "NotFoundError")

    def _models(self) -> HttpResponse:
        entry = {
            "id": self.config.model,
            "object": "model",
            "owned_by": "pipeline-sim",
            "max_model_len": self.config.max_model_len,
        }
        return HttpResponse(200, orjson.dumps({"object": "list", "data": [entry]}))

    def _authorized(self, request: HttpRequest) -> bool:
        return (
            self.config.api_key is None
            or request.headers.get("authorization") == f"Bearer {self.config.api_key}"
        )

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
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // CHARS_PER_TOKEN + 4 * len(
            messages
        )
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1024)
        fault = self._draw_fault()
        if fault == "context_length" or prompt_tokens + max_tokens > self.config.max_model_len:
            return self._context_error(prompt_tokens, max_tokens)
        self.metrics.requests += 1
        self.metrics.running += 1
        self.metrics.peak_running = max(self.metrics.peak_running, self.metrics.running)
        try:
            return await self._generate(body, prompt_tokens, max_tokens, fault)
        finally:
            self.metrics.running -= 1

    def _draw_fault(self) -> str | None:
        draw = self._rng.random()
        for name, rate in self.config.faults.items():
            if draw < rate:
                self.metrics.faults[name] = self.metrics.faults.get(name, 0) + 1
                return name
            draw -= rate
        return None

    def _context_error(self, prompt_tokens: int, max_tokens: int) -> HttpResponse:
        limit = self.config.max_model_len
        return _error(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            "BadRequestError",
        )

    async def _generate(
        self, body: dict[str, Any], prompt_tokens: int, max_tokens: int, fault: str | None
    ) -> HttpResponse:
        if fault == "hang":
            await asyncio.Event().wait()  # until the client disconnects and cancels us
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
        answer = self._answer_text(body, fault)
        effort = body.get("reasoning_effort") or DEFAULT_EFFORT
        reasoning_tokens = REASONING_TOKENS.get(str(effort), REASONING_TOKENS[DEFAULT_EFFORT])
        message, finish, completion_tokens = _spend_budget(
            answer, reasoning_tokens, max_tokens, fault == "length"
        )
        await self._delay(completion_tokens)
        self.metrics.successes += 1
        self.metrics.prompt_tokens += prompt_tokens
        self.metrics.generation_tokens += completion_tokens
        if self.config.reasoning_field != "reasoning" and "reasoning" in message:
            message[self.config.reasoning_field] = message.pop("reasoning")
        return HttpResponse(
            200,
            orjson.dumps(
                self._completion(
                    message,
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    min(reasoning_tokens, completion_tokens),
                )
            ),
        )

    def _answer_text(self, body: dict[str, Any], fault: str | None) -> str:
        schema = _requested_schema(body)
        value = InstanceGenerator(schema, self._rng).generate() if schema else {"answer": "simulated"}
        if fault == "schema_invalid" and isinstance(value, dict) and value:
            value.pop(next(iter(value)))
            value["unexpected_field"] = 1
        text = orjson.dumps(value).decode()
        return text[: max(1, len(text) // 2)] + ' "' if fault == "invalid_json" else text

    def _completion(
        self, message: dict[str, Any], finish: str, prompt: int, completion: int, reasoning: int
    ) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-sim-{self.metrics.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "completion_tokens_details": {"reasoning_tokens": reasoning},
            },
        }

    async def _delay(self, tokens: int) -> None:
        config = self.config
        delay = config.latency_s + config.seconds_per_token * tokens
        if config.jitter:
            delay *= 1 + config.jitter * (2 * self._rng.random() - 1)
        if delay > 0:
            await asyncio.sleep(delay)


def _spend_budget(
    answer: str, reasoning_tokens: int, max_tokens: int, force_length: bool
) -> tuple[dict[str, Any], str, int]:
    """Reasoning first, then the answer, all from one ``max_tokens`` budget, as gpt-oss does."""
    answer_tokens = max(1, len(answer) // CHARS_PER_TOKEN)
    reasoning = "Let me work through the posting. " * max(1, reasoning_tokens // 6)
    if reasoning_tokens >= max_tokens:
        cut = reasoning[: max_tokens * CHARS_PER_TOKEN]
        return {"role": "assistant", "content": None, "reasoning": cut}, "length", max_tokens
    room = max_tokens - reasoning_tokens
    if force_length:
        room = min(room, max(1, answer_tokens // 2))
    if answer_tokens > room:
        content = answer[: room * CHARS_PER_TOKEN]
        return (
            {"role": "assistant", "content": content, "reasoning": reasoning},
            "length",
            reasoning_tokens + room,
        )
    return (
        {"role": "assistant", "content": answer, "reasoning": reasoning},
        "stop",
        reasoning_tokens + answer_tokens,
    )


def _requested_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema from ``response_format``, or else one embedded in the system prompt."""
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return schema if isinstance(schema, dict) else None
    for message in body.get("messages", []):
        content = str(message.get("content") or "")
        start = content.find('{"')
        if message.get("role") == "system" and start >= 0:
            try:
                found = orjson.loads(content[start:])
            except orjson.JSONDecodeError:
                return None
            return found if isinstance(found, dict) else None
    return None
