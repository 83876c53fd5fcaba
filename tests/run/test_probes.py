"""pipeline.run.probes: what ``pipeline check``'s requests measured, and the prompts of a larger sample
counted at the server's ``/tokenize`` (a fake vLLM on 127.0.0.1, through the production client)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import TransientError
from pipeline.run.probes import QUOTED_ANSWER, Measured, Probe, ProbeUnansweredError, counted_prompt
from pipeline.servers.client import ChatRequest, ClientSettings, LLMClient
from tests.support.fakes import ScriptedServer, good_completion, respond, serving

pytestmark = pytest.mark.anyio


def probe(prompt: int, answer: int) -> Probe:
    return Probe(prompt, answer, None, 1.0, "content")


def request(text: str) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": text},), max_tokens=64)


def test_a_prompt_is_as_counted_over_the_sample_else_as_the_probes_said() -> None:
    probes = [probe(3000, 300), probe(3400, 500)]
    counted = Measured(probes, counted_prompt=3230.5, counted=50)
    assert (counted.prompt, counted.answer) == (3230.5, 400)
    assert counted.basis == "answers as 2 probes measured, prompts as counted over 50 records"
    alone = Measured(probes, counted_prompt=None, counted=50)
    assert (alone.prompt, alone.basis) == (3200, "as 2 probes measured")
    assert Measured([], None, 0).prompt is None and Measured([], None, 0).answer is None
    one = Measured([probe(3000, 300)], counted_prompt=3100.0, counted=1)  # `check --probes 1` of one record
    assert one.basis == "answers as 1 probe measured, prompts as counted over 1 record"


async def count_with(server: ScriptedServer, texts: list[str]) -> float | None:
    async with serving(server) as served, LLMClient(ClientSettings(served.url, "test-model")) as client:
        return await counted_prompt(client, [request(text) for text in texts])


async def test_the_samples_prompts_are_counted_at_the_servers_tokenize_nothing_generated() -> None:
    def by_length(messages: list[dict[str, Any]]) -> int:
        return len(str(messages[0]["content"]))

    server = ScriptedServer([respond(good_completion())], count_tokens=by_length)
    assert await count_with(server, ["a" * 100, "b" * 300, "c" * 200]) == 200
    assert len(server.tokenize_bodies) == 3 and server.bodies == []


async def test_a_server_that_does_not_count_leaves_the_prompt_to_the_probes() -> None:
    assert await count_with(ScriptedServer([respond(good_completion())]), ["a", "b"]) is None


def test_a_probe_out_of_time_says_what_the_server_answered_meanwhile() -> None:
    answered = [TransientError("HTTP 503: busy"), TransientError("HTTP 500: " + "y" * 300)]
    said = str(ProbeUnansweredError(5, answered))
    assert said.startswith(
        "in 5 s the server answered 2 times, each with an error a run retries (a probe, alone); the last: "
        "HTTP 500: yyy"
    )
    assert said.endswith("y…") and len(said.split("the last: ")[1]) == QUOTED_ANSWER
    timed_out = TransientError("no reply within 5 s (request_timeout_s)", timed_out=True)
    for silent in ([], [timed_out]):  # nothing, or only the client's timeout: no reply
        assert str(ProbeUnansweredError(5, silent)) == "no reply within 5 s (a probe, alone)"


def test_a_probe_whose_retries_are_spent_says_the_seconds_it_took_and_the_answers_alone() -> None:
    """The client's timeout is no answer: of a timeout and two HTTP 500s in 4.26 s, two were answered."""
    timed_out = TransientError("no reply within 5 s (request_timeout_s)", timed_out=True)
    answered = [timed_out, TransientError("HTTP 503: busy"), TransientError("HTTP 500: engine died")]
    assert str(ProbeUnansweredError(4.26, answered)) == (
        "in 4.3 s the server answered 2 times, each with an error a run retries (a probe, alone); the last: "
        "HTTP 500: engine died"
    )
