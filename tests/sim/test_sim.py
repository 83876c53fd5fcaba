from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import orjson
import pytest

from pipeline.errors import InvalidJSONError, RepetitionLoopError
from pipeline.extraction.parse import loop_reask_request, reask_request
from pipeline.extraction.prompt import response_format_for
from pipeline.servers.client import ChatRequest
from pipeline.sim import Faults, SimConfig, SimServer
from pipeline.sim.answers import prompt_tokens
from pipeline.sim.http import HttpRequest, serve
from schemas.linkedin import JobPosting
from tests.support.schemas import Item
from tests.support.waiting import until

pytestmark = pytest.mark.anyio


async def start(config: SimConfig) -> tuple[Any, str, SimServer]:
    sim = SimServer(config)
    server = await serve(sim.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", sim


@pytest.fixture
async def sim_url() -> AsyncIterator[str]:
    server, url, _ = await start(SimConfig(model="m"))
    async with server:
        yield url


def chat(schema: type[Any] = Item, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "system", "content": "Extract."}, {"role": "user", "content": "A posting."}],
        "max_tokens": 2048,
        "response_format": response_format_for(schema),
        "reasoning_effort": "low",
    }
    body.update(overrides)
    return body


async def test_answers_are_valid_instances_of_the_requested_schema(sim_url: str) -> None:
    async with httpx2.AsyncClient(base_url=sim_url) as client:
        for schema in (Item, JobPosting):
            response = await client.post("/v1/chat/completions", json=chat(schema))
            body = response.json()
            choice = body["choices"][0]
            assert choice["finish_reason"] == "stop"
            schema.model_validate_json(choice["message"]["content"])
            assert choice["message"]["reasoning"]
            usage = body["usage"]
            assert usage["completion_tokens_details"]["reasoning_tokens"] == 64
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_reasoning_shares_the_token_budget(sim_url: str) -> None:
    async with httpx2.AsyncClient(base_url=sim_url) as client:
        starved = (await client.post("/v1/chat/completions", json=chat(max_tokens=32))).json()
        choice = starved["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"] is None
        assert choice["message"]["reasoning"]
        tight = (await client.post("/v1/chat/completions", json=chat(JobPosting, max_tokens=100))).json()
        assert tight["choices"][0]["finish_reason"] == "length"
        assert tight["choices"][0]["message"]["content"]
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(tight["choices"][0]["message"]["content"])
        high = (await client.post("/v1/chat/completions", json=chat(reasoning_effort="high"))).json()
        assert high["usage"]["completion_tokens_details"]["reasoning_tokens"] == 1024


async def test_models_health_metrics_and_errors(sim_url: str) -> None:
    async with httpx2.AsyncClient(base_url=sim_url) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "m"
        await client.post("/v1/chat/completions", json=chat())
        metrics = (await client.get("/metrics")).text
        assert 'vllm:num_requests_running{model_name="m"} 0' in metrics
        assert "vllm:generation_tokens_total" in metrics
        missing = await client.post("/v1/chat/completions", json=chat(model="other"))
        assert missing.status_code == 404 and "does not exist" in missing.json()["error"]["message"]
        assert (await client.post("/v1/chat/completions", content=b"{")).status_code == 400
        assert (await client.get("/nowhere")).status_code == 404


async def test_context_length_and_api_key() -> None:
    server, url, _ = await start(SimConfig(model="m", max_model_len=1000, api_key="k"))
    async with server, httpx2.AsyncClient(base_url=url) as client:
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 401
        headers = {"authorization": "Bearer k"}
        too_long = await client.post("/v1/chat/completions", json=chat(max_tokens=2000), headers=headers)
        assert too_long.status_code == 400
        assert "maximum context length is 1000 tokens" in too_long.json()["error"]["message"]


async def test_tokenize_counts_as_completions_do_and_rejections_are_counted() -> None:
    """vLLM's POST /tokenize beside /v1: a message list counted as a completion's usage counts it, or a
    plain prompt; each 400 for the context is counted in /metrics."""
    server, url, sim = await start(SimConfig(model="m", max_model_len=1000))
    async with server, httpx2.AsyncClient(base_url=url) as client:
        body = chat(max_tokens=10)
        counted = (await client.post("/tokenize", json={"model": "m", "messages": body["messages"]})).json()
        done = (await client.post("/v1/chat/completions", json=body)).json()
        assert counted["count"] == done["usage"]["prompt_tokens"] == len(counted["tokens"])
        assert counted["max_model_len"] == 1000
        assert (await client.post("/tokenize", json={"prompt": "x" * 400})).json()["count"] == 100
        assert (await client.post("/tokenize", json={"model": "other", "prompt": "x"})).status_code == 404
        assert (await client.post("/tokenize", content=b"{")).status_code == 400
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=2000))).status_code == 400
        metrics = (await client.get("/metrics")).text
    assert sim.metrics.tokenize_requests == 2 and sim.metrics.context_rejections == 1
    assert 'pipeline_sim:context_rejections_total{model_name="m"} 1' in metrics
    assert 'pipeline_sim:tokenize_requests_total{model_name="m"} 2' in metrics


async def test_a_server_that_neither_lists_its_context_nor_counts_tokens() -> None:
    server, url, _ = await start(SimConfig(model="m", max_model_len=1000, list_context=False, tokenize=False))
    async with server, httpx2.AsyncClient(base_url=url) as client:
        (model,) = (await client.get("/v1/models")).json()["data"]
        assert model["id"] == "m" and "max_model_len" not in model
        assert (await client.post("/tokenize", json={"prompt": "x"})).status_code == 404
        too_long = await client.post("/v1/chat/completions", json=chat(max_tokens=2000))
        assert "maximum context length is 1000 tokens" in too_long.json()["error"]["message"]


async def test_the_context_length_fault_is_a_request_really_past_the_real_context() -> None:
    """vLLM's 400 with consistent numbers: the server's real context, the prompt as it counts it, and a
    budget that with it is past the context (the budget a proxy in between sent: the whole context)."""
    server, url, sim = await start(
        SimConfig(model="m", max_model_len=4096, faults=Faults(context_length=1.0))
    )
    body = chat(max_tokens=100)
    async with server, httpx2.AsyncClient(base_url=url) as client:
        refused = await client.post("/v1/chat/completions", json=body)
    words = re.fullmatch(
        r"This model's maximum context length is (\d+) tokens\. However, you requested (\d+) tokens "
        r"\((\d+) in the messages, (\d+) in the completion\)\. Please reduce the length of the messages "
        r"or completion\.",
        refused.json()["error"]["message"],
    )
    assert refused.status_code == 400 and words is not None
    context, requested, prompt, budget = map(int, words.groups())
    assert context == 4096 and prompt == prompt_tokens(body["messages"])
    assert requested == prompt + budget > context
    assert sim.metrics.context_rejections == 1 and sim.metrics.faults == {"context_length": 1}


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ("server_error", lambda r: r.status_code in (500, 503)),
        ("context_length", lambda r: r.status_code == 400),
        ("invalid_json", lambda r: r.status_code == 200 and not _parses(r)),
        ("schema_invalid", lambda r: r.status_code == 200 and "unexpected_field" in _content(r)),
        ("length", lambda r: r.json()["choices"][0]["finish_reason"] == "length"),
    ],
)
async def test_each_fault(fault: str, check: Any) -> None:
    server, url, sim = await start(SimConfig(model="m", faults=Faults(**{fault: 1.0})))
    async with server, httpx2.AsyncClient(base_url=url) as client:
        response = await client.post("/v1/chat/completions", json=chat())
        assert check(response)
    assert sim.metrics.faults == {fault: 1}


async def test_reset_fault_drops_the_connection() -> None:
    server, url, _ = await start(SimConfig(model="m", faults=Faults(reset=1.0)))
    async with server, httpx2.AsyncClient(base_url=url) as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            await client.post("/v1/chat/completions", json=chat())


async def test_hang_fault_is_cancelled_when_the_client_leaves() -> None:
    server, url, sim = await start(SimConfig(model="m", faults=Faults(hang=1.0)))
    async with server, httpx2.AsyncClient(base_url=url, timeout=0.2) as client:
        with pytest.raises(httpx2.ReadTimeout):
            await client.post("/v1/chat/completions", json=chat())
        for _ in range(100):
            if sim.metrics.running == 0:
                break
            await anyio.sleep(0.01)
        assert sim.metrics.running == 0  # the disconnect aborted the request


async def test_keep_alive_serves_many_requests_on_one_connection(sim_url: str) -> None:
    limits = httpx2.Limits(max_connections=1)
    async with httpx2.AsyncClient(base_url=sim_url, limits=limits) as client:
        for _ in range(20):
            assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200


async def test_seeded_draws_are_reproducible() -> None:
    config = SimConfig(model="m", seed=7, faults=Faults(invalid_json=0.5))
    outcomes = []
    for _ in range(2):
        server, url, sim = await start(config)
        async with server, httpx2.AsyncClient(base_url=url) as client:
            for _ in range(20):
                await client.post("/v1/chat/completions", json=chat())
        outcomes.append(sim.metrics.faults)
    assert outcomes[0] == outcomes[1] and 0 < outcomes[0]["invalid_json"] < 20


def record_chat(posting: str, *extra: dict[str, str]) -> dict[str, Any]:
    """A record's request: the shared system prompt, the record's prompt, then any re-ask messages."""
    messages = [{"role": "system", "content": "Extract."}, {"role": "user", "content": posting}, *extra]
    return chat(messages=messages)


async def answer_of(sim: SimServer, body: dict[str, Any]) -> str:
    request = HttpRequest("POST", "/v1/chat/completions", {}, orjson.dumps(body))
    response = await sim.handle(request)
    assert response.status == 200
    return str(orjson.loads(response.body)["choices"][0]["message"]["content"])


async def test_a_record_gets_the_same_content_on_every_run_retry_and_reask() -> None:
    postings = [f"Posting {n}: we need a {n}-year engineer." for n in range(20)]
    first, second = SimServer(SimConfig(model="m", seed=5)), SimServer(SimConfig(model="m", seed=5))
    answers = [await answer_of(first, record_chat(posting)) for posting in postings]
    # Another server, other requests in between and the records in reverse order: same content.
    for posting in ("unrelated", *reversed(postings)):
        await answer_of(second, record_chat(posting))
    assert [await answer_of(second, record_chat(posting)) for posting in postings] == answers
    # The pipeline's own re-ask, and its re-ask after a repetition loop: the same record's content.
    rejected = InvalidJSONError("not valid JSON", raw_output='{"title": ')
    reask = reask_request(ChatRequest(tuple(record_chat(postings[3])["messages"]), 100), rejected)
    loop = RepetitionLoopError("looped", raw_output='{"title": "a a a', unit=" a", loop_start=10)
    again = loop_reask_request(ChatRequest(tuple(record_chat(postings[3])["messages"]), 100), loop, 100)
    for retry in (reask, again):
        assert await answer_of(second, chat(messages=list(retry.messages))) == answers[3]
    assert len(set(answers)) >= 15  # different records: different content, but for rare collisions
    Item.model_validate_json(answers[0])
    other_seed = SimServer(SimConfig(model="m", seed=6))
    elsewhere = [await answer_of(other_seed, record_chat(posting)) for posting in postings]
    assert sum(a != b for a, b in zip(answers, elsewhere, strict=True)) >= 15


async def test_few_shot_examples_before_the_record_do_not_make_every_record_alike() -> None:
    """The examples are user/assistant turns before the record: the record's own message decides."""
    examples = [
        {"role": "user", "content": "Example posting."},
        {"role": "assistant", "content": '{"name": "example"}'},
    ]
    sim = SimServer(SimConfig(model="m", seed=5))
    postings = [f"Posting {n}: we need a {n}-year engineer." for n in range(20)]
    plain = [await answer_of(sim, record_chat(posting)) for posting in postings]
    with_examples = [
        await answer_of(sim, chat(messages=[{"role": "system", "content": "Extract."}, *examples,
                                            {"role": "user", "content": posting}]))
        for posting in postings
    ]  # fmt: skip
    assert with_examples == plain


def prompted_chat(posting: str, system: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": posting}]
    return chat(JobPosting, messages=messages)


async def test_answer_noise_redraws_some_fields_per_request_and_keeps_the_rest() -> None:
    postings = [f"Posting {n}: a role." for n in range(60)]
    steady = SimServer(SimConfig(model="m", seed=1))
    noisy = SimServer(SimConfig(model="m", seed=1, answer_noise=0.1))
    clean = [orjson.loads(await answer_of(steady, prompted_chat(p, "Extract."))) for p in postings]
    varied = [orjson.loads(await answer_of(noisy, prompted_chat(p, "Extract."))) for p in postings]
    changed = [sum(a[name] != b[name] for name in a) for a, b in zip(clean, varied, strict=True)]
    fields = len(clean[0])
    # ~10% of the field values are redrawn (some redraws land on the same value): the rest agree
    assert 0.03 * fields * 60 < sum(changed) < 0.2 * fields * 60
    assert max(changed) < fields  # never a whole new answer
    for answer in varied:
        JobPosting.model_validate(answer)


async def test_prompt_sensitive_fields_change_with_the_system_prompt_and_others_do_not() -> None:
    sim = SimServer(SimConfig(model="m", seed=2, prompt_sensitive=("seniority", "explicit_skills")))
    postings = [f"Posting {n}: a role." for n in range(30)]
    first = [orjson.loads(await answer_of(sim, prompted_chat(p, "Extract."))) for p in postings]
    other = [orjson.loads(await answer_of(sim, prompted_chat(p, "Extract, tersely."))) for p in postings]
    differing = {name for a, b in zip(first, other, strict=True) for name in a if a[name] != b[name]}
    assert differing == {"seniority", "explicit_skills"}
    again = [orjson.loads(await answer_of(sim, prompted_chat(p, "Extract."))) for p in postings]
    assert again == first  # the same prompt: the same answers


async def test_an_empty_field_is_answered_empty_and_valid() -> None:
    sim = SimServer(SimConfig(model="m", empty_fields=("salary", "explicit_skills", "title")))
    answer = orjson.loads(await answer_of(sim, prompted_chat("A posting.", "Extract.")))
    assert (answer["salary"], answer["explicit_skills"], answer["title"]) == (None, [], "")
    assert answer["company"] is not None and answer["seniority"] is not None  # the others are answered


async def test_faults_stay_drawn_per_request_and_spoil_the_records_content() -> None:
    clean = await answer_of(SimServer(SimConfig(model="m")), record_chat("A posting."))
    for fault in ("invalid_json", "schema_invalid", "length"):
        sim = SimServer(SimConfig(model="m", faults=Faults(**{fault: 1.0})))
        spoiled = await answer_of(sim, record_chat("A posting."))
        assert spoiled != clean and sim.metrics.faults == {fault: 1}
        if fault != "schema_invalid":
            assert clean.startswith(spoiled.removesuffix(' "'))  # a cut of the record's own answer
    half = SimServer(SimConfig(model="m", faults=Faults(invalid_json=0.5)))
    same_record = [await answer_of(half, record_chat("A posting.")) for _ in range(40)]
    assert 5 < same_record.count(clean) < 35  # the fault is drawn per request, not per record


async def test_schema_from_the_system_prompt_when_no_response_format(sim_url: str) -> None:
    from pipeline.extraction.prompt import SCHEMA_INSTRUCTION

    for schema in (Item, JobPosting):  # each answer has the shape of the schema its prompt gives
        system = f"Extract.\n\n{SCHEMA_INSTRUCTION}\n{orjson.dumps(schema.model_json_schema()).decode()}"
        body = chat(
            response_format=None,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "x"}],
        )
        async with httpx2.AsyncClient(base_url=sim_url) as client:
            response = await client.post("/v1/chat/completions", json=body)
        answer = orjson.loads(_content(response))
        required = {name for name, field in schema.model_fields.items() if field.is_required()}
        assert required <= set(answer) <= set(schema.model_fields)
        schema.model_validate(answer)  # and valid for it, or this raises


def _content(response: httpx2.Response) -> str:
    return str(response.json()["choices"][0]["message"]["content"])


def _parses(response: httpx2.Response) -> bool:
    try:
        orjson.loads(_content(response))
    except orjson.JSONDecodeError:
        return False
    return True


async def test_streaming_with_the_openai_sdk() -> None:
    import openai

    server, url, _ = await start(SimConfig(model="m", profile="gpt-oss-120b", speed=200))
    async with server:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=300, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, reasoning_effort="low",
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
        await client.close()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"  # ignore_eos: exactly max_tokens
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 300
    assert (
        usage.completion_tokens_details is not None and usage.completion_tokens_details.reasoning_tokens == 96
    )


async def test_engine_timing_queueing_and_prefix_cache_in_metrics() -> None:
    config = SimConfig(model="m", profile="nemotron-nano-9b", speed=100, max_num_seqs=2)
    server, url, sim = await start(config)
    system = "Extract the posting's fields. " * 10  # 75 tokens: with the user's message, 5 full blocks
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "A posting."}]
    body = chat(Item, messages=messages, max_tokens=1000, response_format=None, ignore_eos=True)
    async with server, httpx2.AsyncClient(base_url=url, timeout=30) as client:
        async with anyio.create_task_group() as group:
            for _ in range(6):
                group.start_soon(functools.partial(client.post, "/v1/chat/completions", json=body))
            await until(lambda: sim.engine is not None and sim.engine.metrics.running == 2)
            await until(lambda: sim.engine is not None and sim.engine.metrics.waiting == 4)  # all six in
            metrics = (await client.get("/metrics")).text
        assert 'vllm:num_requests_running{model_name="m"} 2' in metrics
        assert 'vllm:num_requests_waiting{model_name="m"} 4' in metrics
        after = (await client.get("/metrics")).text
    # Six requests of one prompt of 85 tokens: the first looks up nothing cached, the five others find
    # its 5 full blocks (80 tokens), as vLLM counts them.
    assert prompt_tokens(messages) == 85
    assert sim.engine is not None and sim.engine.metrics.prefix_queries == 6 * 85
    assert sim.engine.metrics.prefix_hits == 5 * 80
    assert "vllm:prefix_cache_hits_total" in after
    assert sim.metrics.generation_tokens == 6 * 1000


async def test_stream_disconnect_aborts_the_sequence() -> None:
    server, url, sim = await start(SimConfig(model="m", profile="nemotron-nano-9b", speed=1))
    body = chat(max_tokens=5000, response_format=None, ignore_eos=True, stream=True)
    async with server:
        async with (
            httpx2.AsyncClient(base_url=url) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            async for _ in response.aiter_bytes():
                break  # first event received, then leave
        for _ in range(100):
            if sim.engine is not None and sim.engine.metrics.aborted:
                break
            await anyio.sleep(0.01)
    assert sim.engine is not None and sim.engine.metrics.aborted == 1 and sim.engine.metrics.running == 0


async def test_requests_in_flight_count_faulted_and_streamed_requests() -> None:
    config = SimConfig(model="m", latency_s=0.2, faults=Faults(server_error=0.5), seed=4)
    server, url, sim = await start(config)
    async with server, httpx2.AsyncClient(base_url=url, timeout=30) as client:
        async with anyio.create_task_group() as group:
            for index in range(6):
                body = chat(stream=index % 2 == 0, stream_options={"include_usage": True})
                group.start_soon(functools.partial(client.post, "/v1/chat/completions", json=body))
            await until(lambda: sim.metrics.in_flight == 6)  # answered after 0.2 s: all six are in
            assert sim.metrics.running < 6  # the faulted ones are in flight too
        metrics = (await client.get("/metrics")).text
    assert 'pipeline_sim:peak_requests_in_flight{model_name="m"} 6' in metrics
    assert 'pipeline_sim:requests_in_flight{model_name="m"} 0' in metrics  # streams counted until done


async def test_metrics_count_each_chat_request_the_largest_prompt_the_smallest_budget_and_fault() -> None:
    config = SimConfig(model="m", seed=2, faults=Faults(server_error=0.3, context_length=0.3))
    server, url, sim = await start(config)
    short = chat(messages=[{"role": "user", "content": "x" * 40}])
    long = chat(messages=[{"role": "user", "content": "x" * 400}, {"role": "user", "content": "y" * 40}])
    async with server, httpx2.AsyncClient(base_url=url, timeout=30) as client:
        before = (await client.get("/metrics")).text
        for body in (short, long, *[short] * 18):
            await client.post("/v1/chat/completions", json=body)
        await client.post("/v1/chat/completions", json={**short, "max_tokens": 7})
        metrics = (await client.get("/metrics")).text
    assert 'pipeline_sim:min_max_tokens{model_name="m"} 0' in before  # none asked yet
    # the smallest budget asked for, whatever became of the request (the context fault sends another)
    assert 'pipeline_sim:min_max_tokens{model_name="m"} 7' in metrics
    assert 'pipeline_sim:chat_requests_total{model_name="m"} 21' in metrics  # faulted ones included
    assert f'pipeline_sim:requests_total{{model_name="m"}} {sim.metrics.requests}' in metrics
    assert sim.metrics.requests < 21
    assert 'pipeline_sim:max_prompt_tokens{model_name="m"} 118' in metrics  # (400 + 40) / 4 + 4 x 2
    assert 'pipeline_sim:max_messages{model_name="m"} 2' in metrics
    for fault in ("server_error", "context_length", "reset", "hang"):
        count = sim.metrics.faults.get(fault, 0)
        assert f'pipeline_sim:faults_total{{model_name="m",fault="{fault}"}} {count}\n' in metrics
    assert sim.metrics.faults["server_error"] > 0 and sim.metrics.faults["context_length"] > 0


async def test_a_restarted_server_binds_the_same_port_at_once() -> None:
    """SO_REUSEADDR: connections the old server closed (TIME_WAIT) must not block the new one."""
    server, url, _ = await start(SimConfig(model="m"))
    async with server, httpx2.AsyncClient(base_url=url, timeout=30) as client:
        for _ in range(3):  # the server closes these connections: its side waits in TIME_WAIT
            await client.get("/health", headers={"connection": "close"})
    port = int(url.rsplit(":", 1)[1])
    again = await serve(SimServer(SimConfig(model="m")).handle, "127.0.0.1", port)
    async with again, httpx2.AsyncClient(base_url=url, timeout=30) as client:
        assert (await client.get("/health")).status_code == 200


async def test_quoted_answers_copy_phrases_from_the_record() -> None:
    """--quoted-answers: text values are runs of the record's words (grounded in it), never the
    template's labels; a value the schema bounds more tightly is still a valid one."""
    server, url, _ = await start(SimConfig(model="m", quoted_answers=True))
    record = "Title: Data Engineer\n\nWe need Python and SQL for the reporting platform in Berlin."
    body = chat(
        Item, messages=[{"role": "system", "content": "Extract."}, {"role": "user", "content": record}]
    )
    async with server, httpx2.AsyncClient(base_url=url) as client:
        answer = orjson.loads(
            (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
        )
    Item.model_validate(answer)
    words = " ".join(record.split()[1:])  # without the "Title:" label
    for value in [answer["title"], *answer["skills"]]:
        assert value in words and "Title:" not in value
