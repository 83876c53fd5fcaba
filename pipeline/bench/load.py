"""One level of the sweep: ``concurrency`` workers, each sending ``rounds`` streaming requests back to
back, with every request's time to first token, latency, tokens and outcome recorded."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio
import openai

from pipeline.extraction.prompt import response_format_for
from pipeline.servers.client import ClientSettings, build_http_client, openai_client
from schemas.linkedin import JobPosting

_WORDS = [
    "the",
    "team",
    "builds",
    "reliable",
    "data",
    "pipelines",
    "for",
    "customers",
    "across",
    "the",
    "region",
    "and",
    "values",
    "clear",
    "writing",
    "careful",
    "review",
    "and",
    "steady",
    "delivery",
    "of",
    "useful",
    "software",
    "every",
    "week",
]


# What chat.completions.create takes by name; anything else of a job's body goes in extra_body.
_SDK_FIELDS = frozenset(
    {"model", "messages", "max_tokens", "temperature", "reasoning_effort", "response_format"}
)


@dataclass(frozen=True, slots=True)
class BenchOptions:
    base_url: str
    model: str
    concurrency: tuple[int, ...]
    prompt_tokens: int = 1500
    output_tokens: int = 400
    shared_prefix: bool = True
    structured: bool = False
    rounds: int = 3
    warmup: bool = True  # one unmeasured request before the first level
    timeout_s: float = 900.0
    reasoning_effort: str | None = "low"
    api_key: str | None = None
    # With --job: the job's own request bodies (prompt, examples, schema, settings), sent in turn.
    job_bodies: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestResult:
    started: float
    ttft_s: float | None
    latency_s: float
    output_tokens: int
    finish_reason: str | None
    reasoning_seen: bool
    content_seen: bool = False
    error: str | None = None

    @property
    def starved(self) -> bool:
        """Cut off by max_tokens while still reasoning: no answer at all."""
        return self.finish_reason == "length" and self.reasoning_seen and not self.content_seen


def _words(count: int, offset: int) -> str:
    return " ".join(_WORDS[(offset + i) % len(_WORDS)] for i in range(count))


def build_messages(options: BenchOptions, worker: int, index: int) -> list[dict[str, str]]:
    """~``prompt_tokens`` tokens: a system part shared by every request (unless ``shared_prefix`` is
    off, then it starts with a unique marker) and a short unique user part, last."""
    words = max(8, int(options.prompt_tokens * 0.75))  # ~1.33 tokens a word
    unique = f"Request {worker}-{index}."
    system = _words(words - 40, 0)
    if not options.shared_prefix:
        system = f"{unique} {system}"
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{unique} {_words(30, worker)}"},
    ]


def request_body(options: BenchOptions, messages: list[dict[str, str]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": options.model,
        "messages": messages,
        "max_tokens": options.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if options.reasoning_effort is not None:
        body["reasoning_effort"] = options.reasoning_effort
    if options.structured:
        body["response_format"] = response_format_for(JobPosting)
    else:
        body["extra_body"] = {"ignore_eos": True}  # vLLM: generate exactly max_tokens
    return body


def next_body(options: BenchOptions, worker: int, index: int) -> dict[str, Any]:
    """A synthetic request, or the job's next one (streamed, so time to first token is seen)."""
    if not options.job_bodies:
        return request_body(options, build_messages(options, worker, index))
    job = options.job_bodies[(worker * options.rounds + index) % len(options.job_bodies)]
    body = {key: value for key, value in job.items() if key in _SDK_FIELDS}
    extra = {key: value for key, value in job.items() if key not in _SDK_FIELDS}  # the job's extra_body
    return {**body, "model": options.model, "stream": True, "stream_options": {"include_usage": True}} | (
        {"extra_body": extra} if extra else {}
    )


async def run_level(options: BenchOptions, concurrency: int) -> tuple[list[RequestResult], float, float]:
    """Every request's result, the level's wall time, and the CPU time this process spent on it."""
    settings = ClientSettings(
        base_url=options.base_url,
        model=options.model,
        concurrency=concurrency,
        request_timeout_s=options.timeout_s,
        api_key=options.api_key,
    )
    client = openai_client(settings, build_http_client(settings))
    results: list[RequestResult] = []

    async def worker(number: int) -> None:
        for index in range(options.rounds):
            body = next_body(options, number, index)
            results.append(await _one_request(client, body, options.timeout_s))

    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        async with anyio.create_task_group() as group:
            for number in range(concurrency):
                group.start_soon(worker, number)
    finally:
        await client.close()
    return results, time.perf_counter() - started, time.process_time() - cpu_started


async def _one_request(client: openai.AsyncOpenAI, body: dict[str, Any], timeout_s: float) -> RequestResult:
    started = time.perf_counter()
    seen = _StreamSeen()
    try:
        with anyio.fail_after(timeout_s):
            stream = await client.chat.completions.create(**body)
            async for chunk in stream:
                seen.add(chunk, started)
    except TimeoutError:
        return seen.result(started, "timeout")
    except openai.APIError as exc:
        return seen.result(
            started,
            f"HTTP {exc.status_code}" if isinstance(exc, openai.APIStatusError) else type(exc).__name__,
        )
    return seen.result(started, None)


class _StreamSeen:
    """What the chunks of one streamed answer showed."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.tokens = self.characters = 0
        self.finish: str | None = None
        self.reasoning = self.content = False

    def add(self, chunk: Any, started: float) -> None:
        if chunk.usage is not None:
            self.tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            reasoning = getattr(delta, "reasoning", None) or getattr(delta, "reasoning_content", None)
            text = (delta.content or "") + (reasoning or "")
            if text and self.first is None:
                self.first = time.perf_counter() - started
            self.reasoning = self.reasoning or bool(reasoning)
            self.content = self.content or bool(delta.content)
            self.characters += len(text)
            self.finish = choice.finish_reason or self.finish

    def result(self, started: float, error: str | None) -> RequestResult:
        tokens = 0 if error else self.tokens or self.characters // 4
        return RequestResult(
            started,
            self.first,
            time.perf_counter() - started,
            tokens,
            self.finish,
            self.reasoning,
            self.content,
            error,
        )
