"""What the simulated model answers: a valid instance of whatever schema the request carries (in
response_format or the system prompt), the faults that spoil it, and answers as gpt-oss's reasoning
parser mangles them under structured output (vLLM issue 23694)."""

from __future__ import annotations

import random
from datetime import date
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
from pydantic import BaseModel, RootModel, ValidationError

from pipeline.extraction.prompt import SCHEMA_INSTRUCTION, response_format_for
from pipeline.sim import SimConfig, SimServer
from pipeline.sim.answers import Answer, Draws, Variation, answer_text, in_reasoning, requested_schema
from pipeline.sim.http import serve
from tests.support.jobs import make_source, table_rows, write_job
from tests.support.processes import run_pipeline, sim_metric, sim_server
from tests.support.schema_constructs import EveryConstruct
from tests.support.schemas import Item

pytestmark = pytest.mark.anyio


def test_in_reasoning_moves_the_answer_into_the_reasoning_field() -> None:
    answer = Answer('{"name": "x"}', "Let me think. ", "stop", 20, 4)
    assert in_reasoning(answer) == Answer(None, '{"name": "x"}', "stop", 20, 4)
    starved = Answer(None, "Let me", "length", 4, 4)  # nothing answered: nothing to move
    assert in_reasoning(starved) == starved


async def replies(config: SimConfig, **body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One answer whole and one streamed (its events' deltas)."""
    sim = SimServer(config)
    server = await serve(sim.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    chat = {
        "model": "m",
        "messages": [{"role": "system", "content": "Extract."}, {"role": "user", "content": "A posting."}],
        "max_tokens": 2048,
        **body,
    }
    async with server, httpx2.AsyncClient(base_url=url, timeout=30) as client:
        whole = (await client.post("/v1/chat/completions", json=chat)).json()
        streamed = await client.post("/v1/chat/completions", json={**chat, "stream": True})
    events = [orjson.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    return whole, [event["choices"][0] for event in events if event["choices"]]


async def test_with_response_format_the_json_is_in_reasoning_and_content_is_null() -> None:
    config = SimConfig(model="m", answer_in_reasoning=True)
    whole, events = await replies(config, response_format=response_format_for(Item))
    choice = whole["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "stop"
    Item.model_validate_json(choice["message"]["reasoning"])
    streamed = "".join(event["delta"].get("reasoning") or "" for event in events)
    assert not any(event["delta"].get("content") for event in events)
    Item.model_validate_json(streamed)
    assert events[-1]["finish_reason"] == "stop"


async def test_without_response_format_the_answer_stays_in_content() -> None:
    config = SimConfig(model="m", answer_in_reasoning=True, reasoning_field="reasoning_content")
    whole, _ = await replies(config)
    message = whole["choices"][0]["message"]
    assert orjson.loads(message["content"]) and message["reasoning_content"].startswith("Let me")


def construct_body(record: str, **overrides: Any) -> dict[str, Any]:
    """A record's request for the every-construct schema, as the pipeline sends it."""
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "system", "content": "Extract."}, {"role": "user", "content": record}],
        "max_tokens": 8192,
        "response_format": response_format_for(EveryConstruct),
    }
    return {**body, **overrides}


RECORDS = [f"Posting {n}: a data engineer in Leeds, GBP 40,000, 3 years of SQL." for n in range(40)]


@pytest.mark.parametrize("variation", [Variation(), Variation(quoted=True), Variation(noise=0.3)], ids=str)
def test_the_answer_generator_satisfies_every_construct_for_each_record_and_seed(
    variation: Variation,
) -> None:
    """A user's first dry run of their own schema: every answer validates, whatever the seed, the record
    and the answer shaping (text quoted from the record, per-request noise)."""
    for seed in range(5):
        for index, record in enumerate(RECORDS):
            body = construct_body(record)
            draws = Draws(seed, body["messages"], variation, random.Random(index))
            EveryConstruct.model_validate_json(answer_text(body, draws, None))


def test_the_schema_in_the_system_prompt_is_found_after_an_example_of_json() -> None:
    """Without response_format the schema ends the system prompt; JSON the user's own prompt shows
    before it (an example answer) is not taken for the schema."""
    schema = orjson.dumps(EveryConstruct.model_json_schema()).decode()
    system = f'Extract. Answer like {{"day": "2024-01-01"}} does.\n\n{SCHEMA_INSTRUCTION}\n{schema}'
    body = construct_body(RECORDS[0], response_format=None)
    body["messages"][0]["content"] = system
    assert requested_schema(body) == EveryConstruct.model_json_schema()
    EveryConstruct.model_validate_json(
        answer_text(body, Draws(1, body["messages"], Variation(), random.Random()), None)
    )


@pytest.mark.parametrize("model", [EveryConstruct, Item, RootModel[str], RootModel[list[int]]], ids=str)
def test_faults_still_spoil_answers_of_any_schema(model: type[BaseModel]) -> None:
    """invalid_json: never JSON, even where the answer is a bare string; schema_invalid: JSON the
    schema refuses."""
    body = construct_body(RECORDS[0], response_format=response_format_for(model))
    for seed in range(10):
        draws = Draws(seed, body["messages"], Variation(), random.Random(seed))
        model.model_validate_json(answer_text(body, draws, None))
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(answer_text(body, draws, "invalid_json"))
        spoiled = answer_text(body, draws, "schema_invalid")
        orjson.loads(spoiled)
        with pytest.raises(ValidationError):
            model.model_validate_json(spoiled)


async def test_every_construct_through_the_http_api_whole_and_streamed() -> None:
    """The simulator as the pipeline meets it: answers over HTTP, whole and streamed, each valid for
    the schema, with the answer shaping still working (an empty field, text quoted from the record)."""
    config = SimConfig(model="m", seed=3, empty_fields=("tags", "optional"), quoted_answers=True)
    sim = SimServer(config)
    server = await serve(sim.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    answers = []
    async with server, httpx2.AsyncClient(base_url=url, timeout=30) as client:
        for index, record in enumerate(RECORDS[:20]):
            response = await client.post(
                "/v1/chat/completions", json=construct_body(record, stream=index % 2 == 1)
            )
            assert response.status_code == 200
            answers.append(_content_of(response))
    for content in answers:
        answer = EveryConstruct.model_validate_json(content)
        assert answer.tags == [] and answer.optional is None
    assert len(set(answers)) == len(answers)


def _content_of(response: httpx2.Response) -> str:
    if not response.headers["content-type"].startswith("text/event-stream"):
        return str(response.json()["choices"][0]["message"]["content"])
    events = [orjson.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return "".join(event["choices"][0]["delta"].get("content") or "" for event in events if event["choices"])


@pytest.mark.integration
def test_a_dry_run_of_a_schema_with_every_construct_extracts_every_record(tmp_path: Path) -> None:
    """The issue's first dry run: `pipeline run` against a real `pipeline sim` process, with a schema
    that has a date, a tuple of floats and every other construct: every record done, none failed, no
    answer asked again (the answer breaker has nothing to blame the server for)."""
    make_source(tmp_path / "test.duckdb", 60)
    with sim_server("--model", "test-model", "--seed", "7") as url:
        job = write_job(
            tmp_path,
            endpoint={"base_url": url},
            schema="tests.support.schema_constructs:EveryConstruct",
            max_tokens=8192,
        )
        run = run_pipeline("run", str(job))
        requests = sim_metric(url, "pipeline_sim:requests_total")
    assert run.returncode == 0, run.stderr[-3000:]
    database = tmp_path / "test.duckdb"
    assert table_rows(database, "SELECT count(*) FROM results") == [(60,)]
    assert table_rows(database, "SELECT count(*) FROM failures") == [(0,)]
    assert requests == 60
    for (extracted,) in table_rows(database, "SELECT extracted FROM results"):
        stored = orjson.loads(extracted)  # as validated and dumped: the date and float pair
        assert date.fromisoformat(stored["day"]) and [type(x) for x in stored["point"]] == [float, float]
