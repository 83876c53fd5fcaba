from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx2
import pytest

from pipeline.errors import (
    ConfigError,
    ConnectionLostError,
    ContextLengthError,
    EndpointUnreachableError,
    FatalRunError,
    ModelNotServedError,
    PermanentRecordError,
    ServerUnreachableError,
    StructuredOutputRejectedError,
    TransientError,
)
from pipeline.extraction.prompt import client_settings
from pipeline.job.spec import load_job
from pipeline.servers.client import (
    ChatRequest,
    ClientSettings,
    LLMClient,
    build_http_client,
    retry_after_seconds,
)
from pipeline.servers.http import KEEPALIVE_EXPIRY_S
from pipeline.servers.replies import Reply
from pipeline.sim import Faults, SimConfig, SimServer
from pipeline.sim.http import serve
from tests.support.fakes import (
    DROP,
    HANG,
    Answer,
    Handler,
    ScriptedServer,
    completion,
    dead_url,
    error,
    good_completion,
    respond,
    serving,
)
from tests.support.http import aiohttp_transport
from tests.support.jobs import write_job

pytestmark = pytest.mark.anyio

REQUEST = ChatRequest(
    messages=({"role": "system", "content": "Extract."}, {"role": "user", "content": "A posting."}),
    max_tokens=300,
)


def settings(**overrides: Any) -> ClientSettings:
    plain = ClientSettings(
        base_url="http://testserver/v1", model="test-model", concurrency=256, request_timeout_s=900.0
    )
    return dataclasses.replace(plain, **overrides)


async def call(handler: Handler, **overrides: Any) -> Reply:
    """One completion from ``handler`` served on 127.0.0.1, through the production client."""
    async with serving(handler) as server, LLMClient(settings(base_url=server.url, **overrides)) as client:
        return await client.complete(REQUEST)


async def test_request_body_carries_job_options() -> None:
    server = ScriptedServer([respond(good_completion())])
    response_format = {"type": "json_schema", "json_schema": {"name": "Item", "schema": {}, "strict": True}}
    await call(
        server,
        temperature=0.2,
        reasoning_effort="low",
        response_format=response_format,
        extra_body={"top_k": 5},
    )
    body = server.bodies[0]
    assert body["model"] == "test-model"
    assert body["max_tokens"] == 300
    assert body["reasoning_effort"] == "low"  # a top-level field, not inside extra_body
    assert body["temperature"] == 0.2
    assert body["response_format"] == response_format
    assert body["top_k"] == 5
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


async def test_optional_fields_are_left_out() -> None:
    server = ScriptedServer([respond(good_completion())])
    await call(server, temperature=None, reasoning_effort=None, response_format=None)
    assert not {"temperature", "reasoning_effort", "response_format"} & set(server.bodies[0])


async def test_reply_fields_and_both_reasoning_names() -> None:
    for field in ("reasoning", "reasoning_content"):
        body = completion('{"a": 1}', reasoning="thinking...", reasoning_field=field, completion_tokens=55)
        reply = await call(ScriptedServer([respond(body)]))
        assert reply.content == '{"a": 1}'
        assert reply.reasoning == "thinking..."
        assert reply.completion_tokens == 55
        assert reply.reasoning_tokens == 10
        assert reply.finish_reason == "stop"


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 504])
async def test_retryable_statuses_are_transient(status: int) -> None:
    with pytest.raises(TransientError, match=f"HTTP {status}"):
        await call(ScriptedServer([error(status, "busy")]))


async def test_retry_after_is_read() -> None:
    with pytest.raises(TransientError) as caught:
        await call(ScriptedServer([error(429, headers={"retry-after": "7"})]))
    assert caught.value.retry_after == 7.0


@pytest.mark.parametrize("status", [400, 413, 422])
async def test_client_errors_are_permanent_for_the_record(status: int) -> None:
    message = "This model's maximum context length is 4096 tokens."
    with pytest.raises(PermanentRecordError, match="maximum context length"):
        await call(ScriptedServer([error(status, message)]))


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (401, "refused the request"),
        (403, "refused the request"),
        (404, "model 'test-model' or its chat completions route"),
    ],
)
async def test_auth_and_missing_model_are_fatal(status: int, message: str) -> None:
    with pytest.raises(FatalRunError, match=message):
        await call(ScriptedServer([error(status)]))


async def test_401_names_the_key_variable_and_whether_it_is_set() -> None:
    with pytest.raises(FatalRunError, match="environment variable MY_KEY .*which is not set"):
        await call(ScriptedServer([error(401)]), api_key_env="MY_KEY", api_key=None)


async def test_connection_refused_is_unreachable_and_at_preflight_it_stops_the_run() -> None:
    """Whether that ends the run is the router's call (another endpoint may answer)."""
    url = dead_url()
    async with LLMClient(settings(base_url=url)) as client:
        with pytest.raises(
            ServerUnreachableError, match=rf"cannot connect to {re.escape(url)}: .*Connect call failed"
        ):
            await client.complete(REQUEST)
        with pytest.raises(EndpointUnreachableError, match=f"cannot connect to {re.escape(url)}"):
            await client.check_server()


async def test_a_refused_response_format_is_told_apart_from_a_bad_record() -> None:
    server = ScriptedServer([error(400, "response_format is not supported by this server")])
    with pytest.raises(StructuredOutputRejectedError, match="does not take response_format"):
        await call(server)
    server = ScriptedServer([error(400, "This model's maximum context length is 8192 tokens")])
    with pytest.raises(PermanentRecordError):
        await call(server)


async def test_without_structured_output_the_schema_goes_in_the_system_prompt() -> None:
    server = ScriptedServer([respond(good_completion())])
    fallback = "Extract the posting.\n\nReply with ... schema"
    async with serving(server) as served:
        with_format = settings(
            base_url=served.url, response_format={"type": "json_schema"}, system_with_schema=fallback
        )
        client = LLMClient(with_format)
        request = ChatRequest(
            ({"role": "system", "content": "Extract the posting."}, REQUEST.messages[-1]), 64
        )
        await client.complete(request)
        client.without_structured_output()
        await client.complete(request)
    first, second = server.bodies
    assert "response_format" in first and "response_format" not in second
    assert first["messages"][0]["content"] == "Extract the posting."
    assert second["messages"][0]["content"] == fallback
    assert request.messages[0]["content"] == "Extract the posting."  # the caller's list is untouched


async def test_a_dropped_connection_is_a_lost_connection_not_a_timeout() -> None:
    with pytest.raises(ConnectionLostError, match=r"connection to http://127.0.0.1:\d+/v1 failed") as caught:
        await call(ScriptedServer([DROP]))
    assert not caught.value.timed_out


async def test_read_timeout_is_transient_and_marked() -> None:
    with pytest.raises(TransientError, match=r"no reply within 1 s \(request_timeout_s\)") as caught:
        await call(ScriptedServer([HANG]), request_timeout_s=0.6)
    assert caught.value.timed_out


async def test_overall_deadline_is_the_request_timeout() -> None:
    async def never(request: httpx2.Request) -> httpx2.Response:
        await anyio.Event().wait()
        raise AssertionError("unreachable")

    with pytest.raises(TransientError) as caught:
        await call(never, request_timeout_s=0.01)
    assert caught.value.timed_out


@pytest.mark.parametrize("body", ["not json", '{"choices": []}', '{"no": "choices"}'])
async def test_malformed_body_is_transient(body: str) -> None:
    with pytest.raises(TransientError, match="malformed"):
        await call(ScriptedServer([respond(body)]))


def asked_paths(handler: Handler) -> tuple[Handler, list[str]]:
    """``handler``, keeping the path of every request it is sent."""
    asked: list[str] = []

    def keeping(request: httpx2.Request) -> httpx2.Response:
        asked.append(request.url.path)
        answer = handler(request)
        assert isinstance(answer, httpx2.Response)
        return answer

    return keeping, asked


async def test_check_server_accepts_a_served_model() -> None:
    handler, asked = asked_paths(ScriptedServer([], models=["other", "test-model"]))
    async with serving(handler) as server, LLMClient(settings(base_url=server.url)) as client:
        await client.check_server()  # raises for a model not in the list
    assert asked == ["/v1/models"]


async def test_check_server_rejects_an_unserved_model() -> None:
    fake = ScriptedServer([], models=["other-a", "other-b"])
    async with serving(fake) as server, LLMClient(settings(base_url=server.url)) as client:
        with pytest.raises(
            ModelNotServedError, match="does not serve model 'test-model'; it serves: other-a, other-b"
        ) as caught:
            await client.check_server()
    assert isinstance(caught.value, ConfigError)  # exit code 2: the job names the wrong model


async def test_check_server_reads_the_context_length_of_the_model() -> None:
    """vLLM lists max_model_len per model in /v1/models; the client keeps the one of its model."""
    listed = [{"id": "other", "max_model_len": 2048}, {"id": "test-model", "max_model_len": 8192}]
    models = {"object": "list", "data": listed}

    def listing(request: httpx2.Request) -> httpx2.Response:
        return respond(models)

    async with serving(listing) as server, LLMClient(settings(base_url=server.url)) as client:
        assert client.context_length is None  # unknown until the server is checked
        await client.check_server()
        assert client.context_length == 8192
    async with serving(ScriptedServer([])) as server, LLMClient(settings(base_url=server.url)) as client:
        await client.check_server()
        assert client.context_length is None  # a server that does not list it


async def test_count_tokens_asks_the_servers_tokenize_beside_v1_with_the_messages_as_sent() -> None:
    """vLLM's POST /tokenize (not under /v1) takes the model and the chat messages and answers `count`;
    the messages are those a completion sends (the system prompt with the schema once response_format
    was refused), and the chat template's own arguments go along."""
    server = ScriptedServer([], count_tokens=lambda messages: 17 * len(messages))
    overrides = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 5}}
    async with (
        serving(server) as served,
        LLMClient(settings(base_url=served.url, system_with_schema="Extract. {}", **overrides)) as client,
    ):
        assert await client.count_tokens(REQUEST.messages) == 34
        client.without_structured_output()
        assert await client.count_tokens(REQUEST.messages) == 34
    first, second = server.tokenize_bodies
    assert first == {
        "model": "test-model",
        "messages": list(REQUEST.messages),
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert second["messages"][0] == {"role": "system", "content": "Extract. {}"}


@pytest.mark.parametrize(
    "answer",
    [error(404, "Not Found"), error(405, "Method Not Allowed"), respond(good_completion())],
)
async def test_a_server_without_tokenize_is_asked_once(answer: httpx2.Response) -> None:
    """No such route, or a route of that name that answers something else: no count, ever again."""
    asked: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        asked.append(request.url.path)
        return answer

    async with serving(handler) as server, LLMClient(settings(base_url=server.url)) as client:
        assert await client.count_tokens(REQUEST.messages) is None
        assert await client.count_tokens(REQUEST.messages) is None
        assert not client.counts_tokens
    assert asked == ["/tokenize"]


async def test_a_tokenize_that_fails_is_transient_or_uncounted() -> None:
    """A 5xx is transient (retried like a completion); a 400 about these messages leaves the estimate."""
    async with (
        serving(lambda request: error(503)) as server,
        LLMClient(settings(base_url=server.url)) as client,
    ):
        with pytest.raises(TransientError):
            await client.count_tokens(REQUEST.messages)
        assert client.counts_tokens
    async with (
        serving(lambda request: error(400)) as server,
        LLMClient(settings(base_url=server.url)) as client,
    ):
        assert await client.count_tokens(REQUEST.messages) is None
        assert client.counts_tokens


async def test_count_tokens_against_the_simulator_counts_as_its_completions_do() -> None:
    sim = SimServer(SimConfig(model="test-model"))
    server = await serve(sim.handle, "127.0.0.1", 0)
    async with server:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        async with LLMClient(settings(base_url=url)) as client:
            counted = await client.count_tokens(REQUEST.messages)
            reply = await client.complete(REQUEST)
    assert counted == reply.prompt_tokens and sim.metrics.tokenize_requests == 1


# vLLM's wordings of a request past the context, old and new (the installed 0.32 clamps max_tokens and
# refuses only a prompt past the context: renderers/params.py, entrypoints/serve/utils/api_utils.py);
# each with the context it names, the prompt's tokens it names, and whether that count is a floor.
CONTEXT_MESSAGES = [
    (  # before 0.10: the prompt and the budget together past the context
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (5000 in "
        "the messages, 4000 in the completion). Please reduce the length of the messages or completion.",
        8192,
        5000,
        False,
    ),
    (  # before 0.6: the prompt alone
        "This model's maximum context length is 8192 tokens. However, you requested 8193 tokens in the "
        "messages, Please reduce the length of the messages.",
        8192,
        8193,
        False,
    ),
    (  # 0.6 to 0.10: the prompt alone
        "This model's maximum context length is 32768 tokens. However, your request has 40000 input "
        "tokens. Please reduce the length of the input messages.",
        32768,
        40000,
        False,
    ),
    (  # 0.10 and 0.11: the budget past what the prompt leaves
        "'max_tokens' or 'max_completion_tokens' is too large: 4096. This model's maximum context length "
        "is 8192 tokens and your request has 5000 input tokens (4096 > 8192 - 5000). None",
        8192,
        5000,
        False,
    ),
    (  # 0.32: the prompt alone, counted up to one token past the context
        "This model's maximum context length is 8192 tokens. However, your prompt contains at least 8193 "
        "input tokens, which exceeds this limit even without any output tokens.",
        8192,
        8193,
        True,
    ),
    (  # 0.32: the prompt alone, more characters than the context's tokens can hold
        "This model's maximum context length is 8192 tokens. However, your prompt contains 900000 "
        "characters (more than 524288 characters, which is the upper bound for 8192 input tokens). "
        "Please reduce the length of the input prompt.",
        8192,
        8193,
        True,
    ),
    (
        "max_tokens=16384 cannot be greater than max_model_len=8192. Please request fewer output tokens.",
        8192,
        None,
        False,
    ),
    ("Input length (9000) exceeds model's maximum context length (4096).", 4096, 9000, False),
    ("This model's maximum context length is 8192 tokens.", 8192, None, False),
]


@pytest.mark.parametrize(("message", "context", "prompt", "at_least"), CONTEXT_MESSAGES)
async def test_a_400_naming_the_context_is_translated_with_its_numbers(
    message: str, context: int, prompt: int | None, at_least: bool
) -> None:
    server = ScriptedServer([error(400, message)], max_model_len=131072)
    async with serving(server) as served, LLMClient(settings(base_url=served.url)) as client:
        await client.check_server()
        with pytest.raises(ContextLengthError) as caught:
            await client.complete(REQUEST)
        assert isinstance(caught.value, PermanentRecordError)  # unless the extractor can make it fit
        refused = caught.value
        assert (refused.context_length, refused.prompt_tokens, refused.prompt_at_least) == (
            context,
            prompt,
            at_least,
        )
        assert str(refused) == f"HTTP 400: {message}"
        assert client.context_length == context  # the server's own word wins over what it lists


async def test_the_jobs_max_model_len_overrides_the_listing_but_not_a_refusal() -> None:
    refused = error(400, "max_tokens=300 cannot be greater than max_model_len=200")
    server = ScriptedServer([refused], max_model_len=8192)
    async with (
        serving(server) as served,
        LLMClient(settings(base_url=served.url, max_model_len=4096)) as client,
    ):
        await client.check_server()
        assert client.context_length == 4096
        with pytest.raises(ContextLengthError):
            await client.complete(REQUEST)
        assert client.context_length == 200


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({}, [None, None]),
        ({"max_model_len": 4096}, [4096, 4096]),
        ({"max_model_len": 4096, "endpoint": {"max_model_len": "2048"}}, [2048, 2048]),
        (
            {"max_model_len": 4096, "endpoint": {"max_model_len": 2048}, "first": {"max_model_len": 1024}},
            [1024, 2048],
        ),
    ],
)
def test_max_model_len_keys_reach_each_endpoints_client(
    tmp_path: Path, job: dict[str, Any], expected: list[int | None]
) -> None:
    first = {"base_url": "http://a:8000/v1", **job.pop("first", {})}
    endpoints = [first, {"base_url": "http://b:8000/v1"}]
    endpoint = {"base_url": None, **job.pop("endpoint", {})}
    spec = load_job(write_job(tmp_path, endpoints=endpoints, endpoint=endpoint, **job))
    settings_of = [client_settings(spec, config) for config in spec.endpoint_configs()]
    assert [each.max_model_len for each in settings_of] == expected
    assert [LLMClient(each).context_length for each in settings_of] == expected


async def test_check_server_gives_up_within_the_preflight_timeout_on_a_silent_server() -> None:
    async def never_answer(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep_forever()
        raise AssertionError

    async with serving(never_answer) as server:
        client = LLMClient(settings(base_url=server.url, preflight_timeout_s=0.2))
        async with client:
            with anyio.fail_after(5), pytest.raises(FatalRunError, match="did not answer within 0.2 s"):
                await client.check_server()


async def test_check_server_fails_fast_on_a_real_socket_that_accepts_and_never_answers() -> None:
    """The aiohttp transport, as in production: a listener that takes the connection and says nothing."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as group:
            group.start_soon(listener.serve, _hold_silently)
            client = LLMClient(settings(base_url=f"http://127.0.0.1:{port}/v1", preflight_timeout_s=0.3))
            async with client:
                started = anyio.current_time()
                with pytest.raises(FatalRunError, match="did not answer"):
                    await client.check_server()
                assert anyio.current_time() - started < 3
            group.cancel_scope.cancel()


def test_the_preflight_takes_what_it_says_when_the_name_lookup_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DNS server that does not answer (a host name over a VPN that is down): the preflight gives up
    at its timeout, and the lookup it leaves running holds neither the event loop's end nor the
    process's exit (asyncio's own lookups run in threads that both wait for: 22 s where 10 were said)."""
    answer = threading.Event()
    real_lookup = socket.getaddrinfo

    def lookup(host: bytes | str | None, *args: Any, **kwargs: Any) -> Any:
        if host == "gpu-box.invalid":
            answer.wait(20)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)

    async def preflight() -> None:
        client = LLMClient(settings(base_url="http://gpu-box.invalid:8000/v1", preflight_timeout_s=0.3))
        async with client:
            with pytest.raises(EndpointUnreachableError, match="did not answer within 0.3 s"):
                await client.check_server()

    started = time.monotonic()
    try:
        anyio.run(preflight)  # the whole event loop, its end included, as a command runs it
        took = time.monotonic() - started
    finally:
        answer.set()
    assert took < 3


async def _hold_silently(stream: anyio.abc.SocketStream) -> None:
    async with stream:
        await anyio.sleep_forever()


async def test_probe_is_true_for_any_http_answer_and_false_for_no_answer() -> None:
    async with serving(ScriptedServer([])) as server, LLMClient(settings(base_url=server.url)) as client:
        assert await client.probe()

    def unavailable(request: httpx2.Request) -> httpx2.Response:
        return error(503, "loading")

    async with serving(unavailable) as server, LLMClient(settings(base_url=server.url)) as client:
        assert await client.probe()

    async with LLMClient(settings(base_url=dead_url())) as client:
        assert not await client.probe()


async def test_check_server_refused_connection_is_fatal() -> None:
    async with LLMClient(settings(base_url=dead_url())) as client:
        with pytest.raises(FatalRunError, match="cannot connect"):
            await client.check_server()


async def test_check_server_tolerates_a_server_without_a_model_list() -> None:
    answers = ScriptedServer([respond(good_completion())])

    def no_models(request: httpx2.Request) -> Answer:
        return error(404, "no route") if request.url.path.endswith("/models") else answers(request)

    handler, asked = asked_paths(no_models)
    async with serving(handler) as server, LLMClient(settings(base_url=server.url)) as client:
        await client.check_server()  # no list to check the model against: the first completion will tell
        assert client.context_length is None
        reply = await client.complete(REQUEST)
    assert asked == ["/v1/models", "/v1/chat/completions"] and reply.finish_reason == "stop"


@contextlib.asynccontextmanager
async def sim(**faults: float) -> AsyncIterator[str]:
    """The simulator in this event loop, on a real 127.0.0.1 socket: the production HTTP stack."""
    server = await serve(
        SimServer(SimConfig(model="test-model", faults=Faults(**faults))).handle, "127.0.0.1", 0
    )
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def test_client_has_no_sdk_retries_and_a_pool_for_the_concurrency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timeouts: list[aiohttp.ClientTimeout] = []
    request = aiohttp.ClientSession.request

    def spy(session: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> Any:
        timeouts.append(kwargs["timeout"])
        return request(session, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "request", spy)
    async with (
        sim() as url,
        LLMClient(settings(base_url=url, concurrency=300, request_timeout_s=1200.0)) as client,
    ):
        reply = await client.complete(REQUEST)
        assert reply.finish_reason == "stop"
        assert client._openai.max_retries == 0
        session = aiohttp_transport(client._http).client
        assert isinstance(session, aiohttp.ClientSession)  # the one session the client made
        connector = session.connector
        assert isinstance(connector, aiohttp.TCPConnector)
        assert connector.limit >= 300 and connector.limit_per_host == 0
        assert connector._keepalive_timeout == KEEPALIVE_EXPIRY_S < 5.0  # below vLLM's 5 s keep-alive
    # Per request: a read timeout as long as the job's, and no total (aiohttp's session default is
    # 5 minutes, shorter than one request at c=256).
    assert [(t.total, t.sock_read) for t in timeouts] == [(None, 1200.0)]


async def test_wire_errors_through_aiohttp_are_told_apart() -> None:
    async with LLMClient(settings(base_url="http://127.0.0.1:9/v1")) as client:
        with pytest.raises(ServerUnreachableError, match="cannot connect to http://127.0.0.1:9/v1"):
            await client.complete(REQUEST)  # refused: never reached a server
    async with sim(reset=1.0) as url, LLMClient(settings(base_url=url)) as client:
        with pytest.raises(
            ConnectionLostError, match="connection to .* failed: ServerDisconnectedError"
        ) as caught:
            await client.complete(REQUEST)  # a server that hangs up is not a timeout
        assert not caught.value.timed_out


def test_http_client_timeouts() -> None:
    client = build_http_client(settings(request_timeout_s=600.0))
    assert client.timeout.read == 600.0
    assert client.timeout.pool == 600.0


def test_retry_after_formats() -> None:
    assert retry_after_seconds(httpx2.Headers({"retry-after": "3"})) == 3.0
    assert retry_after_seconds(httpx2.Headers({"retry-after-ms": "1500"})) == 1.5
    assert retry_after_seconds(httpx2.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    assert retry_after_seconds(httpx2.Headers({"retry-after": "soon"})) is None
    assert retry_after_seconds(httpx2.Headers({})) is None


async def test_request_is_json_with_the_bearer_key() -> None:
    seen: list[httpx2.Request] = []

    def capture(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return respond(good_completion())

    await call(capture, api_key="sk-x")
    request = seen[0]
    assert request.method == "POST" and request.url.path == "/v1/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer sk-x"
    assert request.headers["x-stainless-retry-count"] == "0"
