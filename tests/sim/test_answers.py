"""Answers as gpt-oss's reasoning parser mangles them under structured output (vLLM issue 23694)."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest

from pipeline.extraction.prompt import response_format_for
from pipeline.sim import SimConfig, SimServer
from pipeline.sim.answers import Answer, in_reasoning
from pipeline.sim.http import serve
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
