"""The one place that talks to the model server.

Builds each chat-completion request, sends it with AsyncOpenAI (its own retries off: the retry policy
lives in :mod:`pipeline.extraction.retry`), reads the reply body with orjson, and translates every SDK / HTTP
error into :mod:`pipeline.errors`. It never retries and never looks at the answer's meaning.
"""

from __future__ import annotations

import dataclasses
import email.utils
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import aiohttp
import anyio
import httpx2
import openai
import orjson

from pipeline.errors import (
    ConfigError,
    ConnectionLostError,
    ContextLengthError,
    EndpointUnreachableError,
    FatalRunError,
    ModelNotServedError,
    PermanentRecordError,
    PipelineError,
    ServerUnreachableError,
    StructuredOutputRejectedError,
    TransientError,
)
from pipeline.servers.config import api_path_hint
from pipeline.servers.http import http_client
from pipeline.servers.lookup import look_up_host
from pipeline.servers.replies import Reply, parse_completion_body, served_models, token_count, tokenize_url

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
# A server without POST /tokenize (not vLLM): 404 no such route, 405 the route takes no POST, 501.
_NO_ROUTE_STATUS = frozenset({404, 405, 501})
# A 400 about the request's structured output, not about the record (vLLM without guided decoding,
# other OpenAI-compatible servers): "response_format", "json_schema", "guided_json".
_STRUCTURED_OUTPUT_WORDS = re.compile(
    r"response_format|json_schema|guided_(json|decoding)|structured output", re.I
)
# A 400 about the context, as vLLM's versions word it (tests/servers/test_client.py has each): "This
# model's maximum context length is 8192 tokens. However, you requested 9000 tokens (5000 in the messages,
# 4000 in the completion)", "... you requested 9000 tokens in the messages", "... your request has 9000
# input tokens", "'max_tokens' ... is too large: 4096. This model's maximum context length is 8192 tokens
# and your request has 5000 input tokens", "... your prompt contains [at least] 9000 input tokens",
# "max_tokens=16384 cannot be greater than max_model_len=8192", "Input length (9000) exceeds ...".
_CONTEXT_LENGTH = re.compile(r"maximum context length (?:is |\()(\d+)|max_model_len ?= ?(\d+)", re.I)
_PROMPT_TOKENS = re.compile(
    r"(?P<messages>\d+) (?:tokens )?in the messages"
    r"|(?:prompt contains|request has) (?P<at_least>at least )?(?P<input>\d+) input tokens"
    r"|input length \((?P<length>\d+)\)",
    re.I,
)
# vLLM 0.32 refuses a prompt of more characters than the context's tokens can hold without counting it:
# "your prompt contains 900000 characters (more than 524288 characters, which is the upper bound for 8192
# input tokens)". Its tokens are unknown, but past the context.
_PROMPT_PAST_CONTEXT = re.compile(r"prompt contains \d+ characters", re.I)


class ChatMessage(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What varies between attempts for one record: the messages, the token budget, and sampling
    fields for this request only (a retry after a repetition loop sends penalties). A request's own
    ``response_format`` replaces the settings' (a model judge's answer has a shape per request)."""

    messages: tuple[ChatMessage, ...]
    max_tokens: int
    sampling: dict[str, float] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Everything about a request that is the same for every record of a job."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)  # never in a repr, a log line or an error
    api_key_env: str | None = None
    concurrency: int = 256
    request_timeout_s: float = 900.0
    temperature: float | None = 0.0
    reasoning_effort: str | None = "low"
    response_format: dict[str, Any] | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    # /v1/models answers at once even from a server busy with 256 requests, so waiting long for it
    # only delays the error when the server is down or the address is wrong.
    preflight_timeout_s: float = 10.0
    # The system prompt with the schema appended, for a job that leaves the schema out of the prompt
    # (include_schema: false) when the server refuses response_format: then the prompt must carry it.
    system_with_schema: str | None = field(default=None, repr=False)
    # The job's max_model_len for this server: its context length, whatever /v1/models lists.
    max_model_len: int | None = None


def build_http_client(settings: ClientSettings) -> httpx2.AsyncClient:
    """The pool for the job's requests: one connection per request in flight and read timeouts as
    long as the job's (:func:`pipeline.servers.http.http_client` decides the rest). Tests reach their
    fake servers through this same pool, on 127.0.0.1."""
    return http_client(timeout_s=settings.request_timeout_s, concurrency=settings.concurrency)


def openai_client(settings: ClientSettings, http: httpx2.AsyncClient) -> openai.AsyncOpenAI:
    """The SDK over ``http``, its own retries off: the retry policy lives in
    :mod:`pipeline.extraction.retry`."""
    return openai.AsyncOpenAI(
        base_url=settings.base_url,
        api_key=settings.api_key or "EMPTY",  # what vLLM without --api-key expects
        max_retries=0,
        timeout=http.timeout,
        http_client=http,
    )


class LLMClient:
    """Sends chat completions; :meth:`complete` returns a :class:`Reply` or raises a pipeline error."""

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self._http = build_http_client(settings)
        self._openai = openai_client(settings, self._http)
        self._system_override: str | None = None
        self._listed_context: int | None = None  # max_model_len in /v1/models, for our model
        self._refused_at_context: int | None = None  # the length a 400 named
        self.counts_tokens = True  # until the server shows it has no /tokenize

    @property
    def context_length(self) -> int | None:
        """Prompt and answer tokens one request may take on this server, or ``None`` when unknown: the
        length a 400 named (the server's own word), else the job's ``max_model_len``, else what
        ``/v1/models`` lists (vLLM lists ``max_model_len`` per model)."""
        return self._refused_at_context or self.settings.max_model_len or self._listed_context

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._openai.close()

    def _messages_as_sent(self, messages: tuple[ChatMessage, ...]) -> list[ChatMessage]:
        sent = list(messages)
        if self._system_override is not None and sent and sent[0]["role"] == "system":
            sent[0] = {"role": "system", "content": self._system_override}
        return sent

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body of ``POST /chat/completions``; ``reasoning_effort`` is a top-level field."""
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": self._messages_as_sent(request.messages),
            "max_tokens": request.max_tokens,
        }
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if self.settings.reasoning_effort is not None:
            body["reasoning_effort"] = self.settings.reasoning_effort
        response_format = request.response_format or self.settings.response_format
        if response_format is not None:
            body["response_format"] = response_format
        body.update(self.settings.extra_body)
        body.update(request.sampling)
        return body

    async def complete(self, request: ChatRequest) -> Reply:
        # The SDK's low-level post with a body serialised once by orjson: chat.completions.create
        # would walk every message through its type transforms and re-encode with the json module,
        # which costs more CPU than the rest of the pipeline together at thousands of requests/s.
        content = orjson.dumps(self.request_body(request))
        started = time.perf_counter()
        try:
            with anyio.fail_after(self.settings.request_timeout_s):
                response = await self._openai.post(
                    "/chat/completions", cast_to=httpx2.Response, content=content
                )
        except TimeoutError as exc:
            raise self._timeout_error() from exc
        except openai.APIError as exc:
            raise self._translate(exc) from exc
        return parse_completion_body(response.content, time.perf_counter() - started)

    async def count_tokens(self, messages: tuple[ChatMessage, ...]) -> int | None:
        """The prompt tokens the server counts for ``messages`` as a chat completion would send them
        (vLLM: ``POST /tokenize`` beside ``/v1``, answering ``count``), or ``None`` from a server
        without that route, or whose route answers something else (asked once: :attr:`counts_tokens`
        is then false). A server that does not answer in time raises :class:`TransientError`, as a
        completion would."""
        if not self.counts_tokens:
            return None
        body: dict[str, Any] = {"model": self.settings.model, "messages": self._messages_as_sent(messages)}
        # The chat template may read these (a reasoning model's thinking switch): count what is sent.
        if "chat_template_kwargs" in self.settings.extra_body:
            body["chat_template_kwargs"] = self.settings.extra_body["chat_template_kwargs"]
        try:
            with anyio.fail_after(self.settings.request_timeout_s):
                response = await self._openai.post(
                    tokenize_url(self.settings.base_url), cast_to=httpx2.Response, content=orjson.dumps(body)
                )
        except TimeoutError as exc:
            raise self._timeout_error() from exc
        except openai.APIStatusError as exc:
            if exc.status_code in _NO_ROUTE_STATUS:
                self.counts_tokens = False
                return None
            if exc.status_code in (400, 422):  # it cannot count these messages: the estimate will do
                return None
            raise self._translate(exc) from exc
        except openai.APIError as exc:
            raise self._translate(exc) from exc
        count = token_count(response.content)
        self.counts_tokens = count is not None
        return count

    async def check_server(self) -> None:
        """Fail the run early if the server is down, refuses the key, or does not serve the model."""
        url = self.settings.base_url
        try:
            with anyio.fail_after(self.settings.preflight_timeout_s):
                await look_up_host(url)  # abandoned at the timeout, it holds up no exit
                raw = await self._openai.models.with_raw_response.list()
        except TimeoutError as exc:
            raise EndpointUnreachableError(
                f"{url}/models did not answer within {self.settings.preflight_timeout_s:g} s "
                "(operations.preflight_timeout_s): is the server up, and is the address right?"
            ) from exc
        except openai.NotFoundError as exc:
            if hint := api_path_hint(url):  # its chat completions are not there either: say so now
                raise ConfigError(f"{url}/models: not found (HTTP 404); {hint}") from exc
            return  # a server without a model list; the first completion will tell
        except openai.APIError as exc:
            error = self._translate(exc)
            if isinstance(error, FatalRunError):
                raise error from exc
            if isinstance(error, ServerUnreachableError):
                raise EndpointUnreachableError(str(error)) from exc
            raise EndpointUnreachableError(f"{url}/models failed: {error}") from exc
        served = served_models(raw.http_response.content)
        if served is not None and self.settings.model not in served:
            raise ModelNotServedError(
                f"{url} does not serve model '{self.settings.model}'; "
                f"it serves: {', '.join(sorted(served)) or 'nothing'}"
            )
        self._listed_context = served.get(self.settings.model) if served is not None else None

    async def probe(self) -> bool:
        """Whether the server answers at all (any HTTP status) within the preflight timeout."""
        try:
            with anyio.fail_after(self.settings.preflight_timeout_s):
                await self._openai.models.with_raw_response.list()
        except openai.APIStatusError:
            return True
        except (TimeoutError, openai.APIError):
            return False
        return True

    async def probe_completion(self) -> bool:
        """Whether the server finishes a one-token completion within the request timeout: after a
        stall, a server whose API still lists models may have an engine that generates nothing."""
        body = self.request_body(ChatRequest(({"role": "user", "content": "ping"},), 1))
        body.pop("response_format", None)
        try:
            with anyio.fail_after(min(self.settings.request_timeout_s, 60.0)):
                await self._openai.post(
                    "/chat/completions", cast_to=httpx2.Response, content=orjson.dumps(body)
                )
        except (TimeoutError, openai.APIError):
            return False
        return True

    def without_structured_output(self) -> None:
        """The server refused ``response_format``: send requests without it from now on, with the
        schema in the system prompt instead (validation and re-asks keep the answers honest)."""
        self.settings = dataclasses.replace(self.settings, response_format=None)
        self._system_override = self.settings.system_with_schema

    def _key_hint(self) -> str:
        name = self.settings.api_key_env
        if name is None:
            return "the job sends no API key: name the variable holding it in endpoint.api_key_env"
        state = "is set" if self.settings.api_key else "is not set"
        return f"the API key comes from environment variable {name} (endpoint.api_key_env), which {state}"

    def _timeout_error(self) -> TransientError:
        return TransientError(
            f"no reply within {self.settings.request_timeout_s:.0f} s (request_timeout_s); "
            "a server queueing at high concurrency needs a longer timeout",
            timed_out=True,
        )

    def _translate_transport(self, exc: openai.APIConnectionError) -> PipelineError:
        url = self.settings.base_url
        kind, cause = _transport_cause(exc)
        text = _one_line(str(cause)) if cause is not None else ""
        if kind == "timeout":
            return self._timeout_error()
        if kind == "connect":
            return ServerUnreachableError(f"cannot connect to {url}: {text or 'refused'}")
        return ConnectionLostError(f"connection to {url} failed: {type(cause).__name__} {text}".rstrip())

    def _translate(self, exc: openai.APIError) -> PipelineError:
        url = self.settings.base_url
        if isinstance(exc, openai.APIConnectionError):  # APITimeoutError included
            return self._translate_transport(exc)
        if isinstance(exc, openai.APIStatusError):
            error = _translate_status(exc, url, self.settings.model, self._key_hint())
            if isinstance(error, ContextLengthError):
                self._refused_at_context = error.context_length
            return error
        return TransientError(f"unexpected reply from {url}: {_one_line(str(exc))}")


def _transport_cause(exc: BaseException) -> tuple[str, BaseException | None]:
    """What went wrong on the wire: ``connect``, ``timeout`` or ``other``, and the error saying so.

    aiohttp's errors reach us through the SDK's adapter, which turns every connection error (a refused
    connect, a server that hung up) into ``httpx2.ConnectTimeout``: the aiohttp error in the chain is
    the one that tells them apart. Without one, only the SDK's own timeout is left to recognise."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__
    native = next((error for error in chain if isinstance(error, aiohttp.ClientError)), None)
    if native is None:
        return ("timeout" if isinstance(exc, openai.APITimeoutError) else "other"), chain[-1]
    if isinstance(native, aiohttp.ClientConnectorError):
        return "connect", native
    if isinstance(native, aiohttp.ServerTimeoutError):
        return "timeout", native
    return "other", native


def _translate_status(exc: openai.APIStatusError, url: str, model: str, key_hint: str) -> PipelineError:
    status = exc.status_code
    detail = f"HTTP {status}: {_server_message(exc)}"
    if status in (401, 403):
        return FatalRunError(f"{url} refused the request ({detail}); {key_hint}")
    if status == 404:
        hint = f"; {api_path_hint(url)}" if api_path_hint(url) else ""
        return FatalRunError(
            f"{url}: model '{model}' or its chat completions route not found ({detail}){hint}"
        )
    if status in _RETRYABLE_STATUS or status >= 500:
        return TransientError(detail, retry_after=retry_after_seconds(exc.response.headers))
    if status == 400 and _STRUCTURED_OUTPUT_WORDS.search(detail):
        return StructuredOutputRejectedError(f"{url} does not take response_format ({detail})")
    if status == 400 and (context := _CONTEXT_LENGTH.search(detail)):
        return _context_length_error(detail, int(next(group for group in context.groups() if group)))
    return PermanentRecordError(detail)


def _context_length_error(detail: str, context_length: int) -> ContextLengthError:
    """A 400 naming the context, with the prompt's tokens where it names them (or, where it says only
    that the prompt's characters are past the context, at least one token more than the context)."""
    if prompt := _PROMPT_TOKENS.search(detail):
        tokens = int(prompt["messages"] or prompt["input"] or prompt["length"])
        at_least = prompt["at_least"] is not None
        return ContextLengthError(
            detail, context_length=context_length, prompt_tokens=tokens, prompt_at_least=at_least
        )
    if _PROMPT_PAST_CONTEXT.search(detail):
        return ContextLengthError(
            detail, context_length=context_length, prompt_tokens=context_length + 1, prompt_at_least=True
        )
    return ContextLengthError(detail, context_length=context_length)


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    message: object = None
    if isinstance(body, dict):
        inner = body.get("error")
        message = body.get("message") or (inner.get("message") if isinstance(inner, dict) else inner)
    return _one_line(str(message or exc.message))[:300]


def retry_after_seconds(headers: httpx2.Headers) -> float | None:
    """``Retry-After`` (seconds or HTTP date) or ``retry-after-ms``, as seconds; ``None`` if absent."""
    if (millis := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _one_line(text: str) -> str:
    return " ".join(text.split())
