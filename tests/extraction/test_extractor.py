from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson
import pytest
from httpx2 import Request, Response

from pipeline.errors import FailureClass, FatalRunError
from pipeline.extraction.budget import FIXED_PART_ADVICE, FIXED_PART_FULL, estimated_tokens, fewest_tokens
from pipeline.extraction.calibration import RATE_MARGIN, Calibration
from pipeline.extraction.extractor import BudgetGrowth, Extractor
from pipeline.extraction.outcomes import Extracted, Failed, Outcome
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.retry import RetryPolicy
from pipeline.job.spec import JobSpec, load_job
from pipeline.run.stats import RunStats
from pipeline.servers.endpoint import Endpoint
from pipeline.sim import SimConfig, SimServer
from pipeline.sim.answers import prompt_tokens as sim_prompt_tokens
from pipeline.sim.http import HttpRequest, HttpResponse, serve
from pipeline.source.reader import SourceRecord
from tests.support.endpoints import endpoint_for, running_router
from tests.support.fakes import (
    DROP,
    GOOD_ITEM,
    HANG,
    LoopbackServer,
    ScriptedServer,
    completion,
    error,
    good_completion,
    respond,
)
from tests.support.jobs import write_job
from tests.support.runs import no_sleep, served

pytestmark = pytest.mark.anyio

RECORD = SourceRecord(7, {"title": "Data Engineer", "description": "We need SQL."})
# Reasoning that was cut off, as a model writes it: no stretch of it repeats.
REASONING = " ".join(f"weighing {chr(97 + i % 26)}{chr(97 + i // 26)} against the posting" for i in range(60))


class Harness:
    """One endpoint and its router over ``server`` served on 127.0.0.1, records extracted one by one."""

    def __init__(self, spec: JobSpec, server: ScriptedServer, abort_after: int = 50) -> None:
        self.spec = spec.model_copy(
            update={"retry": spec.retry.model_copy(update={"abort_after_consecutive_failures": abort_after})}
        )
        self.server = server
        self.loopback = LoopbackServer(server)
        self.stats = RunStats(pending_at_start=1, concurrency=1)
        self.prompts = PromptBuilder(spec)
        self.endpoint: Endpoint | None = None
        # What the run learned (one per run, as the run's extractor has): its records teach each other.
        self.calibration: Calibration | None = None
        self._down_for_probes = 0

    async def extract(self, record: SourceRecord = RECORD) -> Extracted | Failed:
        if self.endpoint is None:  # one server and one endpoint over all the records
            await self.loopback.start()
            self.endpoint = endpoint_for(served(self.spec, self.loopback))
            await self.endpoint.client.check_server()  # the run's preflight: reads the context length
        spec = self.spec
        async with running_router([self.endpoint], probe_sleep=self._probe_sleep) as router:
            extractor = Extractor(
                router,
                self.prompts,
                spec.schema_class,
                RetryPolicy(spec.retry, sleep=no_sleep),
                BudgetGrowth(spec.retry.truncation_growth, spec.max_tokens_ceiling),
                self.stats,
            )
            if self.calibration is None:
                self.calibration = extractor.calibration
            extractor.calibration = self.calibration
            return await extractor.extract(record)

    async def restart_server(self, down_for_probes: int) -> None:
        """Stop the server; it listens again after the router has waited ``down_for_probes`` times."""
        await self.loopback.stop()
        self._down_for_probes = down_for_probes

    async def _probe_sleep(self, _: float) -> None:
        if self._down_for_probes:
            self._down_for_probes -= 1
            if not self._down_for_probes:
                await self.loopback.start()

    async def aclose(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.client.aclose()
        await self.loopback.stop()


MakeHarness = Callable[..., Harness]


@pytest.fixture
async def make_harness() -> AsyncIterator[MakeHarness]:
    made: list[Harness] = []

    def make(spec: JobSpec, server: ScriptedServer, abort_after: int = 50) -> Harness:
        made.append(Harness(spec, server, abort_after))
        return made[-1]

    yield make
    for harness in made:
        await harness.aclose()


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return load_job(
        write_job(
            tmp_path,
            retry={"transient_retries": 3, "reasks": 2, "truncation_retries": 2, "max_tokens_ceiling": 1024},
        )
    )


async def test_ok_first_time(spec: JobSpec, make_harness: MakeHarness) -> None:
    harness = make_harness(spec, ScriptedServer([respond(good_completion())]))
    outcome = await harness.extract()
    assert isinstance(outcome, Extracted)
    assert outcome.record_id == 7
    assert orjson.loads(outcome.data_json) == GOOD_ITEM
    assert outcome.attempts == 1
    assert outcome.reply.completion_tokens == 40
    assert harness.stats.in_flight == 0
    assert harness.stats.now().completion_tokens == 40


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_an_answer_in_the_reasoning_is_taken_at_once_and_marked(
    spec: JobSpec, make_harness: MakeHarness, field: str
) -> None:
    """gpt-oss under structured output (vLLM issue 23694): content null, the JSON in reasoning."""
    answer = orjson.dumps(GOOD_ITEM).decode()
    server = ScriptedServer([respond(completion(None, reasoning=answer, reasoning_field=field))])
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Extracted) and outcome.from_reasoning
    assert orjson.loads(outcome.data_json) == GOOD_ITEM and outcome.attempts == 1  # not asked again
    plain = await make_harness(spec, ScriptedServer([respond(completion(answer, reasoning="x"))])).extract()
    assert isinstance(plain, Extracted) and not plain.from_reasoning


async def test_first_request_puts_the_static_system_prompt_first_and_the_record_last(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    server = ScriptedServer([respond(good_completion())])
    await make_harness(spec, server).extract()
    system, user = server.bodies[0]["messages"]
    assert system["role"] == "system" and system["content"].startswith("Extract the posting.")
    assert '"skills"' in system["content"]  # the schema (with its descriptions) is in the prompt
    assert user == {"role": "user", "content": "Title: Data Engineer\n\nWe need SQL."}


async def test_transient_then_ok(spec: JobSpec, make_harness: MakeHarness) -> None:
    server = ScriptedServer([error(503), DROP, respond(good_completion())])
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Extracted)
    assert outcome.attempts == 3
    assert server.bodies[0] == server.bodies[2]  # a transient retry resends the same request


async def test_invalid_json_is_reasked_with_the_error(spec: JobSpec, make_harness: MakeHarness) -> None:
    server = ScriptedServer([respond(completion('{"title": "x", ')), respond(good_completion())])
    harness = make_harness(spec, server)
    first_request = harness.prompts.request_for(RECORD.fields)
    before = copy.deepcopy(first_request)
    outcome = await harness.extract()
    assert isinstance(outcome, Extracted) and outcome.attempts == 2
    reask = server.bodies[1]["messages"]
    assert reask[:2] == server.bodies[0]["messages"]
    assert reask[2] == {"role": "assistant", "content": '{"title": "x", '}
    assert reask[3]["role"] == "user" and "not valid JSON" in reask[3]["content"]
    assert first_request == before
    assert harness.prompts.request_for(RECORD.fields) == before  # nothing shared was mutated


async def test_schema_invalid_reask_carries_field_errors(spec: JobSpec, make_harness: MakeHarness) -> None:
    bad = orjson.dumps({**GOOD_ITEM, "skills": "SQL"}).decode()
    server = ScriptedServer([respond(completion(bad)), respond(good_completion())])
    assert isinstance(await make_harness(spec, server).extract(), Extracted)
    assert "skills: Input should be a valid list" in server.bodies[1]["messages"][3]["content"]


async def test_truncated_retries_with_a_larger_budget(spec: JobSpec, make_harness: MakeHarness) -> None:
    truncated = completion(None, finish_reason="length", reasoning=REASONING)
    server = ScriptedServer([respond(truncated), respond(truncated), respond(good_completion())])
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Extracted)
    assert [body["max_tokens"] for body in server.bodies] == [256, 512, 1024]
    assert all(len(body["messages"]) == 2 for body in server.bodies)


async def test_truncation_exhausted_is_recorded_with_the_reason(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    truncated = completion(None, finish_reason="length", reasoning=REASONING, completion_tokens=256)
    outcome = await make_harness(spec, ScriptedServer([respond(truncated)])).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.TRUNCATED
    assert outcome.attempts == 3
    assert "raise max_tokens or lower reasoning_effort" in outcome.message
    assert outcome.last_raw_output == REASONING


async def test_bad_output_exhausted_keeps_the_last_raw_output(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    server = ScriptedServer(
        [respond(completion("nope 1")), respond(completion("nope 2")), respond(completion("nope 3"))]
    )
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.INVALID_JSON
    assert outcome.attempts == 3
    assert outcome.last_raw_output == "nope 3"


async def test_empty_output_exhausted(spec: JobSpec, make_harness: MakeHarness) -> None:
    outcome = await make_harness(spec, ScriptedServer([respond(completion(""))])).extract()
    assert isinstance(outcome, Failed) and outcome.failure_class is FailureClass.EMPTY


async def test_permanent_error_fails_at_once(spec: JobSpec, make_harness: MakeHarness) -> None:
    server = ScriptedServer([error(400, "This model's maximum context length is 4096 tokens.")])
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.PERMANENT
    assert outcome.attempts == 1
    assert "maximum context length" in outcome.message


async def test_transient_exhausted_is_a_transient_failure(spec: JobSpec, make_harness: MakeHarness) -> None:
    outcome = await make_harness(spec, ScriptedServer([error(502)])).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.TRANSIENT
    assert outcome.attempts == 4


async def test_fatal_error_escapes(spec: JobSpec, make_harness: MakeHarness) -> None:
    with pytest.raises(FatalRunError, match="refused"):
        await make_harness(spec, ScriptedServer([error(401)])).extract()


async def test_many_server_side_failures_in_a_row_stop_the_run(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    harness = make_harness(spec, ScriptedServer([error(400, "bad request")]), abort_after=3)
    assert isinstance(await harness.extract(), Failed)
    assert isinstance(await harness.extract(), Failed)
    with pytest.raises(FatalRunError, match="3 records in a row failed on the server side"):
        await harness.extract()


async def test_a_success_resets_the_failure_streak(spec: JobSpec, make_harness: MakeHarness) -> None:
    steps = [error(400), error(400), respond(good_completion()), error(400), error(400)]  # then 400s
    harness = make_harness(spec, ScriptedServer(steps), abort_after=3)
    outcomes = [type(await harness.extract()) for _ in range(5)]
    assert outcomes == [Failed, Failed, Extracted, Failed, Failed]  # four failed, never three in a row
    with pytest.raises(FatalRunError, match="3 records in a row failed on the server side"):
        await harness.extract()  # the third in a row since the success


async def test_bad_output_failures_do_not_stop_the_run(spec: JobSpec, make_harness: MakeHarness) -> None:
    harness = make_harness(spec, ScriptedServer([respond(completion("not json"))]), abort_after=2)
    for _ in range(4):
        assert isinstance(await harness.extract(), Failed)


async def test_timeouts_are_counted(spec: JobSpec, make_harness: MakeHarness) -> None:
    quick = spec.with_overrides(request_timeout_s=0.5)
    harness = make_harness(quick, ScriptedServer([HANG, respond(good_completion())]))
    assert isinstance(await harness.extract(), Extracted)
    assert (harness.stats.now().timeouts, harness.stats.now().attempts) == (1, 2)


async def test_refused_connections_wait_for_the_server_and_cost_no_attempt(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """A server restart: connections refused after the server had answered are not the record's fault."""
    harness = make_harness(spec, ScriptedServer([respond(good_completion())]))
    first = await harness.extract(SourceRecord(1, RECORD.fields))
    await harness.restart_server(down_for_probes=3)
    second = await harness.extract(SourceRecord(2, RECORD.fields))
    assert isinstance(first, Extracted) and isinstance(second, Extracted)
    assert second.attempts == 1  # refused while down (three probes), no attempt spent, no transient retry
    assert harness.stats.now().retries == {}
    assert harness.stats.now().attempts == 3 and harness.stats.in_flight == 0  # one of them refused


# --- the context ------------------------------------------------------------------------------------

CONTEXT = 1000


def looping_answer(repeats: int = 60) -> str:
    """A small model's answer cut off while it repeated one list item."""
    return '{"title":"Data Engineer","skills":[' + '"SQL for reporting",' * repeats


async def test_no_request_asks_for_more_than_the_context_leaves(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """The budget grows after a truncation only up to what the context leaves after the prompt; an
    answer cut off with all of it is `truncated` with the numbers, never a request the server refuses."""
    cut = completion(
        None, finish_reason="length", reasoning=REASONING, completion_tokens=300, prompt_tokens=700
    )
    server = ScriptedServer([respond(cut)], max_model_len=CONTEXT)
    outcome = await make_harness(spec, server).extract()
    assert [body["max_tokens"] for body in server.bodies] == [256, CONTEXT - 700]
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.attempts, outcome.max_tokens) == (FailureClass.TRUNCATED, 2, 300)
    assert outcome.message.startswith(
        "answer truncated at the end of the context: prompt 700 tokens + budget 300 tokens of a context "
        "of 1000; it produced 300 completion tokens, 10 of them reasoning (finish_reason=length)"
    )


async def test_before_any_count_a_budget_the_estimate_cuts_goes_with_what_the_floor_leaves(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """No /tokenize, nothing counted yet: the plain estimate errs towards more tokens (the LinkedIn
    job's prompts, 1,080 tokens short of a 4,096 context, were sent with 26-175 and their answers cut
    off). The run's first request goes with what its floor leaves: vLLM 0.32 cuts such a budget itself
    and answers (here), an older one's 400 names the count. The reply's count teaches the run the rate,
    and the next record's budget is cut at that rate, on the safe side of what the server counts."""
    server = ScriptedServer([respond(good_completion())] * 2, max_model_len=CONTEXT)
    harness = make_harness(spec.with_overrides(max_tokens=4096), server)
    messages = harness.prompts.request_for(RECORD.fields).messages
    estimate = estimated_tokens(messages)
    assert estimate > sum(len(message["content"]) for message in messages) / 3.7  # SmolLM2: 3.7 chars/token
    assert isinstance(await harness.extract(), Extracted)
    assert isinstance(await harness.extract(), Extracted)
    first, second = (body["max_tokens"] for body in server.bodies)
    assert first == CONTEXT - fewest_tokens(messages)
    assert harness.calibration is not None  # the reply counted 100 tokens: the rate, and its margin
    assert (
        second
        == CONTEXT - harness.calibration.scaled(estimate)
        == CONTEXT - math.ceil(100 * (1 + RATE_MARGIN))
    )


async def test_a_reask_counts_the_prompt_the_server_counted_and_estimates_what_it_adds(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    server = ScriptedServer(
        [respond(completion("x" * 600, prompt_tokens=700)), respond(good_completion())], max_model_len=CONTEXT
    )
    assert isinstance(await make_harness(spec, server).extract(), Extracted)
    reask = server.bodies[1]
    assert len(reask["messages"]) == 4
    assert reask["max_tokens"] == CONTEXT - 700 - estimated_tokens(reask["messages"][2:])


async def test_an_answer_cut_off_in_a_loop_is_asked_again_another_way(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    looping = completion(looping_answer(), finish_reason="length", completion_tokens=256)
    server = ScriptedServer([respond(looping), respond(good_completion())])
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Extracted) and outcome.attempts == 2
    first, again = server.bodies
    assert again["max_tokens"] == first["max_tokens"] == 256  # a larger budget buys a longer loop
    assert again["messages"][:2] == first["messages"]
    shown, instruction = again["messages"][2:]
    assert shown == {
        "role": "assistant",
        "content": '{"title":"Data Engineer","skills":[' + '"SQL for reporting",' * 2 + "…",
    }
    assert (
        instruction["role"] == "user" and "kept repeating '\"SQL for reporting\",'" in instruction["content"]
    )
    assert again["frequency_penalty"] > 0 and again["presence_penalty"] > 0  # for that retry only
    assert not {"frequency_penalty", "presence_penalty"} & set(first)


async def test_a_loop_that_persists_is_a_truncated_failure_saying_so(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    looping = completion(looping_answer(), finish_reason="length", completion_tokens=256)
    cut = completion(None, finish_reason="length", reasoning=REASONING, completion_tokens=256)
    server = ScriptedServer([respond(looping), respond(cut), respond(looping)])
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Failed) and outcome.failure_class is FailureClass.TRUNCATED
    assert outcome.attempts == 3  # loops and truncations share retry.truncation_retries (2)
    assert outcome.message.startswith(
        "repetition loop: the same 20-character stretch repeated 60 times in 'skills' at the end of the "
        "cut-off answer (finish_reason=length, 256 completion tokens"
    )
    assert "SQL" not in outcome.message  # the answer (it may quote the record) stays out of messages
    assert [body["max_tokens"] for body in server.bodies] == [256, 256, 512]


def refused_for_context(message: str) -> Response:
    return error(400, message)


@pytest.mark.parametrize(
    ("message", "budget", "retried_with"),
    [
        (
            "This model's maximum context length is 1000 tokens. However, you requested 1212 tokens "
            "(700 in the messages, 512 in the completion). Please reduce the length of the messages or "
            "completion.",
            512,
            300,
        ),
        (
            "max_tokens=4096 cannot be greater than max_model_len=1000. Please request fewer output tokens.",
            4096,
            None,  # no prompt count in the message: the estimate
        ),
    ],
)
async def test_a_400_naming_the_context_is_retried_once_with_a_budget_that_fits(
    spec: JobSpec, make_harness: MakeHarness, message: str, budget: int, retried_with: int | None
) -> None:
    server = ScriptedServer([refused_for_context(message), respond(good_completion())])
    harness = make_harness(spec.with_overrides(max_tokens=budget), server)
    outcome = await harness.extract()
    assert isinstance(outcome, Extracted) and outcome.attempts == 2
    assert harness.endpoint is not None and harness.endpoint.context_length == CONTEXT
    expected = retried_with or CONTEXT - estimated_tokens(server.bodies[0]["messages"])
    assert [body["max_tokens"] for body in server.bodies] == [budget, expected]


async def test_a_400_saying_the_prompt_alone_does_not_fit_is_too_long_with_the_numbers(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """A server that lists no context and cannot count (no /tokenize): its 400 says what does not fit.
    The record's fields are a few words: the rest, the part every record sends, fills the context."""
    message = (
        "This model's maximum context length is 1000 tokens. However, your prompt contains 1500 input "
        "tokens, which exceeds this limit even without any output tokens."
    )
    outcome = await make_harness(spec, ScriptedServer([refused_for_context(message)])).extract()
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.attempts) == (FailureClass.TOO_LONG, 1)
    assert outcome.message.startswith(
        "the prompt alone does not fit the context: 1500 tokens against a context of 1000 tokens (the "
        f"server's max_model_len), and {FIXED_PART_FULL}: its fixed part (system prompt, examples, "
        "template: what every record sends) is about 14"
    )
    assert outcome.message.endswith(FIXED_PART_ADVICE)


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 1000 tokens. However, your prompt contains at least 1001 "
        "input tokens, which exceeds this limit even without any output tokens.",
        "This model's maximum context length is 1000 tokens. However, your prompt contains 90000 characters "
        "(more than 64000 characters, which is the upper bound for 1000 input tokens).",
    ],
)
async def test_a_400_saying_the_prompt_is_past_the_context_without_its_count_is_too_long(
    spec: JobSpec, make_harness: MakeHarness, message: str
) -> None:
    """vLLM 0.32 counts a prompt only up to one token past the context, or refuses it on its characters
    alone: the prompt is at least one token past the context, whatever the estimate says."""
    outcome = await make_harness(spec, ScriptedServer([refused_for_context(message)])).extract(LONG_RECORD)
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.attempts) == (FailureClass.TOO_LONG, 1)
    assert outcome.message.startswith(
        "the prompt alone does not fit the context: at least 1001 tokens (the server's count) against a "
        "context of 1000 tokens"
    )


async def test_a_400_without_the_prompts_count_is_counted_by_the_server_before_it_is_judged(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """The 400 names only the context; the estimate says the prompt is past it, the server's count says
    it is not: the record is retried with what its count leaves, not failed on the estimate."""
    message = "max_tokens=256 cannot be greater than max_model_len=20. Please request fewer output tokens."
    server = ScriptedServer(
        [refused_for_context(message), respond(good_completion())], count_tokens=lambda messages: 4
    )
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Extracted) and outcome.attempts == 2
    assert estimated_tokens(server.bodies[0]["messages"]) > 20  # the estimate alone would have said too long
    # 16 left: what an answer needs before any is measured (1/16 of max_tokens 256), so it goes
    assert [body["max_tokens"] for body in server.bodies] == [256, 20 - 4]
    assert len(server.tokenize_bodies) == 1


def counting(per_message: int) -> Callable[[list[dict[str, object]]], int]:
    """A server's /tokenize that counts ``per_message`` tokens a message."""
    return lambda messages: per_message * len(messages)


# A description long enough for the estimate to put the prompt near a context of 1,000 tokens.
LONG_RECORD = SourceRecord(8, {"title": "Data Engineer", "description": "We need SQL. " * 250})


async def test_a_prompt_near_the_context_is_counted_by_the_server_before_it_is_sent(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """The estimate puts prompt and budget past the context: the server counts it, the request asks for
    exactly what is left, and the record is sent whole (it fits); the count serves its re-ask too."""
    server = ScriptedServer(
        [respond(completion("not json")), respond(good_completion())],
        max_model_len=CONTEXT,
        count_tokens=counting(200),
    )
    harness = make_harness(spec.with_overrides(max_tokens=900), server)
    assert isinstance(await harness.extract(), Extracted)
    assert len(server.tokenize_bodies) == 2  # the first request, then the re-ask (estimated past it too)
    assert server.tokenize_bodies[0]["messages"] == server.bodies[0]["messages"]
    assert server.tokenize_bodies[0]["model"] == "test-model"
    assert [body["max_tokens"] for body in server.bodies] == [CONTEXT - 400, CONTEXT - 800]


async def test_a_prompt_far_from_the_context_is_not_counted(spec: JobSpec, make_harness: MakeHarness) -> None:
    server = ScriptedServer([respond(good_completion())], max_model_len=100_000, count_tokens=counting(300))
    assert isinstance(await make_harness(spec, server).extract(), Extracted)
    assert server.tokenize_bodies == [] and server.bodies[0]["max_tokens"] == 256


async def test_a_record_just_under_the_limit_is_sent_whole(spec: JobSpec, make_harness: MakeHarness) -> None:
    """The estimate says it does not fit; the server counts 744 tokens, which leave the whole budget
    (256) of a context of 1,000: sent whole, as it is."""
    server = ScriptedServer(
        [respond(good_completion())], max_model_len=CONTEXT, count_tokens=lambda messages: 744
    )
    assert estimated_tokens(PromptBuilder(spec).request_for(LONG_RECORD.fields).messages) > CONTEXT
    outcome = await make_harness(spec, server).extract(LONG_RECORD)
    assert isinstance(outcome, Extracted) and outcome.attempts == 1
    assert [body["max_tokens"] for body in server.bodies] == [256]
    assert "We need SQL. " * 250 in server.bodies[0]["messages"][-1]["content"]


async def test_a_record_that_cannot_fit_is_never_sent(spec: JobSpec, make_harness: MakeHarness) -> None:
    server = ScriptedServer(
        [respond(good_completion())], max_model_len=CONTEXT, count_tokens=lambda messages: 1000
    )
    outcome = await make_harness(spec, server).extract(LONG_RECORD)
    assert server.bodies == []  # counted, never sent
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.attempts, outcome.usage.requests) == (FailureClass.TOO_LONG, 0, 0)
    assert outcome.message.startswith(
        "the prompt alone does not fit the context: 1000 tokens against a context of 1000 tokens (the "
        "server's max_model_len); most of it is field 'description' (3,250 characters): enable chunking "
        "(chunking: field: description)"
    )


async def test_a_400_whose_own_numbers_fit_stays_permanent(spec: JobSpec, make_harness: MakeHarness) -> None:
    """No smaller budget to try: the server got a larger budget than was sent (a proxy in between that
    raised max_tokens, as the simulator's context-length fault), so the 400 is not about the budget."""
    message = (
        "This model's maximum context length is 1000 tokens. However, you requested 1100 tokens "
        "(100 in the messages, 1000 in the completion). Please reduce the length of the messages or "
        "completion."
    )
    outcome = await make_harness(spec, ScriptedServer([refused_for_context(message)])).extract()
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.attempts) == (FailureClass.PERMANENT, 1)
    assert "by these numbers the request fits: prompt 100 tokens + budget 256 of a context of 1000" in (
        outcome.message
    )


def answered_with_prompt(prompt_tokens: int) -> dict[str, object]:
    return completion(orjson.dumps(GOOD_ITEM).decode(), prompt_tokens=prompt_tokens)


def refused_past_the_context(prompt: int) -> Callable[[Request], Response]:
    """vLLM's 400 for a prompt of ``prompt`` tokens and the budget asked for, past the context (before
    vLLM cut the budget to fit itself)."""

    def refuse(request: Request) -> Response:
        budget = orjson.loads(request.content)["max_tokens"]
        return refused_for_context(
            f"This model's maximum context length is {CONTEXT} tokens. However, you requested "
            f"{prompt + budget} tokens ({prompt} in the messages, {budget} in the completion). Please "
            "reduce the length of the messages or completion."
        )

    return refuse


async def test_behind_a_server_that_cannot_count_a_prompt_that_may_fit_is_sent(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """A proxy or a router without /tokenize: the estimate puts the prompt past the context, its floor
    (one token a word) does not, so it may fit: it is sent, asking for what the floor leaves, and the
    server's answer settles it."""
    server = ScriptedServer([respond(answered_with_prompt(744))], max_model_len=CONTEXT)
    harness = make_harness(spec, server)
    messages = harness.prompts.request_for(LONG_RECORD.fields).messages
    assert estimated_tokens(messages) > CONTEXT > fewest_tokens(messages)
    outcome = await harness.extract(LONG_RECORD)
    assert isinstance(outcome, Extracted) and outcome.attempts == 1
    assert [body["max_tokens"] for body in server.bodies] == [min(256, CONTEXT - fewest_tokens(messages))]


async def test_behind_a_server_that_cannot_count_its_400_gives_the_budget_that_fits(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """Sent on its floor, the request asks for more than the context leaves; the server's 400 names the
    prompt's tokens (900), and the retry asks for what they leave."""
    server = ScriptedServer(
        [refused_past_the_context(900), respond(answered_with_prompt(900))], max_model_len=CONTEXT
    )
    harness = make_harness(spec, server)
    floor = fewest_tokens(harness.prompts.request_for(LONG_RECORD.fields).messages)
    outcome = await harness.extract(LONG_RECORD)
    assert isinstance(outcome, Extracted) and outcome.attempts == 2
    assert [body["max_tokens"] for body in server.bodies] == [CONTEXT - floor, CONTEXT - 900]


async def test_behind_a_server_that_cannot_count_its_400_says_when_the_prompt_alone_is_over(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    server = ScriptedServer([refused_past_the_context(1200)], max_model_len=CONTEXT)
    outcome = await make_harness(spec, server).extract(LONG_RECORD)
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.attempts) == (FailureClass.TOO_LONG, 1)
    assert outcome.message.startswith(
        "the prompt alone does not fit the context: 1200 tokens against a context of 1000 tokens (the "
        "server's max_model_len); most of it is field 'description' (3,250 characters): enable chunking"
    )


async def test_a_prompt_whose_floor_is_past_the_context_is_never_sent(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    server = ScriptedServer([respond(good_completion())], max_model_len=CONTEXT)
    harness = make_harness(spec, server)
    huge = SourceRecord(10, {"title": "Huge", "description": "word " * CONTEXT})
    floor = fewest_tokens(harness.prompts.request_for(huge.fields).messages)
    outcome = await harness.extract(huge)
    assert isinstance(outcome, Failed) and server.bodies == []
    assert (outcome.failure_class, outcome.attempts) == (FailureClass.TOO_LONG, 0)
    assert floor > CONTEXT and outcome.message.startswith(
        f"the prompt alone does not fit the context: at least {floor} tokens (one a word) against a "
        "context of 1000 tokens"
    )


async def test_a_fixed_part_that_leaves_no_room_is_too_long_saying_chunking_cannot_help(
    tmp_path: Path, make_harness: MakeHarness
) -> None:
    """The system prompt alone is about the context: no record fits, and no chunk of one would."""
    long_system = load_job(write_job(tmp_path, prompt={"system": "Extract the posting, carefully. " * 150}))
    server = ScriptedServer(
        [respond(good_completion())], max_model_len=CONTEXT, count_tokens=lambda messages: 1050
    )
    outcome = await make_harness(long_system, server).extract()
    assert isinstance(outcome, Failed) and outcome.failure_class is FailureClass.TOO_LONG
    assert server.bodies == []
    assert outcome.message.startswith(
        "the prompt alone does not fit the context: 1050 tokens against a context of 1000 tokens (the "
        f"server's max_model_len), and {FIXED_PART_FULL}: its fixed part (system prompt, examples, "
        "template: what every record sends) is about "
    )
    assert outcome.message.endswith(FIXED_PART_ADVICE)


Seen = list[tuple[int, int, int]]


@asynccontextmanager
async def small_context_sim(
    context: int, *, counts: bool = True, lists: bool | None = None
) -> AsyncIterator[tuple[str, Seen]]:
    """`pipeline sim --max-model-len CONTEXT` on 127.0.0.1, and every chat request it got: the prompt
    as it counts it, the max_tokens asked for, and its status. ``counts`` false: a server that cannot
    count tokens (``--no-tokenize``), and unless ``lists``, does not list its context either
    (``--no-list-context``)."""
    lists = counts if lists is None else lists
    sim = SimServer(
        SimConfig(model="test-model", max_model_len=context, seed=3, list_context=lists, tokenize=counts)
    )
    seen: Seen = []

    async def recording(request: HttpRequest) -> HttpResponse:
        response = await sim.handle(request)
        if request.path.endswith("/chat/completions"):
            body = orjson.loads(request.body)
            seen.append((sim_prompt_tokens(body["messages"]), body["max_tokens"], response.status))
        return response

    server = await serve(recording, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", seen


async def extract_at_the_simulator(
    spec: JobSpec,
    context: int,
    effort: str,
    *,
    counts: bool = True,
    lists: bool | None = None,
    sizes: range = range(5),
) -> tuple[list[Outcome], Seen]:
    """Records of ``sizes`` sentences and one whose prompt alone is five times the context, one by
    one, with max_tokens far past the context."""
    records = [SourceRecord(i, {"title": f"Job {i}", "description": "We need SQL. " * i}) for i in sizes]
    records.append(SourceRecord(99, {"title": "Huge", "description": "word " * context * 4}))
    async with small_context_sim(context, counts=counts, lists=lists) as (url, seen):
        job = spec.with_overrides(base_url=url, max_tokens=4096, reasoning_effort=effort)
        endpoint = endpoint_for(job)
        try:
            await endpoint.client.check_server()
            listed = counts if lists is None else lists
            assert endpoint.context_length == (context if listed else None)  # from its /v1/models
            async with running_router([endpoint]) as router:
                extractor = Extractor(
                    router,
                    PromptBuilder(job),
                    job.schema_class,
                    RetryPolicy(job.retry, sleep=no_sleep),
                    BudgetGrowth(job.retry.truncation_growth, job.max_tokens_ceiling),
                    RunStats(pending_at_start=len(records), concurrency=1),
                )
                return [await extractor.extract(record) for record in records], seen
        finally:
            await endpoint.client.aclose()


@pytest.mark.parametrize(("context", "effort"), [(700, "low"), (280, "low"), (700, "high")])
async def test_against_the_simulator_no_request_passes_its_context(
    spec: JobSpec, context: int, effort: str
) -> None:
    """No request asks for more than the context leaves (the simulator refuses those, as vLLM): each
    prompt the estimate puts near the context is counted by the simulator's /tokenize first, so every
    request asks for exactly what the context leaves, and the prompt alone past it is `too_long`
    without being sent."""
    (*normal, huge), seen = await extract_at_the_simulator(spec, context, effort)
    assert all(prompt + budget <= context for prompt, budget, _ in seen)
    assert [status for _, _, status in seen].count(400) == 0
    assert isinstance(huge, Failed) and huge.failure_class is FailureClass.TOO_LONG
    assert huge.message.startswith("the prompt alone does not fit the context: ") and huge.attempts == 0
    assert len(seen) == sum(outcome.attempts for outcome in normal)  # the huge one was never sent
    if effort == "low":  # the server's count leaves what the answer needs: one request each
        assert all(isinstance(outcome, Extracted) and outcome.attempts == 1 for outcome in normal)
        assert all(prompt + budget == context for prompt, budget, _ in seen)
    else:  # reasoning past what the context leaves: the record's fit, not an answer the server spoilt
        for outcome in normal:
            assert isinstance(outcome, Failed) and outcome.failure_class is FailureClass.TOO_LONG
            assert outcome.message.startswith("the prompt leaves too little of the context for an answer: ")
            assert "and the answer was cut off there (" in outcome.message


async def test_a_server_that_neither_lists_nor_counts_learns_the_context_from_its_400(spec: JobSpec) -> None:
    """Only the 400 tells: the first request learns the context (retried once with what fits); from
    then on the estimate decides, as the server cannot count: the prompt it puts past the context is
    `too_long` without being sent."""
    (*normal, huge), seen = await extract_at_the_simulator(spec, 700, "low", counts=False)
    assert isinstance(huge, Failed) and huge.failure_class is FailureClass.TOO_LONG and huge.attempts == 0
    assert huge.message.startswith("the prompt alone does not fit the context: at least ")
    assert "tokens (one a word) against a context of 700 tokens" in huge.message
    assert all(isinstance(outcome, Extracted) for outcome in normal)
    statuses = [status for _, _, status in seen]
    assert statuses[0] == 400 and statuses.count(400) == 1
    assert all(prompt + budget <= 700 for prompt, budget, status in seen if status == 200)


async def test_behind_a_server_without_tokenize_records_that_fit_are_done(spec: JobSpec) -> None:
    """Issue 22's proxy: the server lists its context but cannot count (``sim --no-tokenize``). These
    records' estimates are past the context of 700, their prompts as the server counts them are not:
    the first is sent on its floor, refused with its count, and done with the budget that fits; its
    count taught the run the server's rate, so the others go at once with nearly all the context
    leaves (the margin of the rate short of it); the huge one, whose floor alone is past the context,
    is never sent."""
    sizes = range(120, 140, 5)
    (*normal, huge), seen = await extract_at_the_simulator(
        spec, 700, "low", counts=False, lists=True, sizes=sizes
    )
    job = PromptBuilder(spec)
    prompts = [
        job.request_for({"title": f"Job {i}", "description": "We need SQL. " * i}).messages for i in sizes
    ]
    assert all(
        estimated_tokens(messages) > 700 > sim_prompt_tokens([*map(dict, messages)]) for messages in prompts
    )
    assert all(isinstance(outcome, Extracted) for outcome in normal)
    assert [outcome.attempts for outcome in normal] == [2] + [1] * (len(sizes) - 1)
    assert [status for _, _, status in seen] == [400] + [200] * len(sizes)
    first, *others = [(prompt, budget) for prompt, budget, status in seen if status == 200]
    assert sum(first) == 700
    # short of what the context leaves by the rate's margin (2%) and its rounding: under 3% of the prompt
    assert RATE_MARGIN == 0.02
    assert all(0 <= 700 - prompt - budget < prompt * 0.03 for prompt, budget in others)
    assert isinstance(huge, Failed) and huge.failure_class is FailureClass.TOO_LONG and huge.attempts == 0


# --- issue 29: behind a proxy, a record that fits must not get a starved budget ---------------------


async def test_a_budget_the_estimate_starves_is_never_sent(spec: JobSpec, make_harness: MakeHarness) -> None:
    """The estimate leaves 3 tokens (issue 29's budgets were 1, 3 and 13), less than the fewest an answer
    of the schema can be: the request goes with what its floor leaves instead, and the server's 400
    names the prompt's tokens, whose room the retry asks for."""
    job = spec.with_overrides(max_tokens=4096)
    messages = PromptBuilder(job).request_for(RECORD.fields).messages
    context = estimated_tokens(messages) + 3
    counted = estimated_tokens(messages) * 3 // 4

    def refuse(request: Request) -> Response:
        budget = orjson.loads(request.content)["max_tokens"]
        return refused_for_context(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{counted + budget} tokens ({counted} in the messages, {budget} in the completion)."
        )

    server = ScriptedServer([refuse, respond(answered_with_prompt(counted))], max_model_len=context)
    outcome = await make_harness(job, server).extract()
    assert isinstance(outcome, Extracted) and outcome.attempts == 2
    assert [body["max_tokens"] for body in server.bodies] == [
        context - fewest_tokens(messages),
        context - counted,
    ]


async def test_an_answer_cut_off_with_a_budget_the_context_cut_is_too_long_not_truncated(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """The server counted the prompt (700): the budget is all the context leaves (300), below the job's
    4,096, and the answer still did not end. The record's fit, not an answer the server spoilt: not
    `truncated`, which the run's answer breaker would count against the server."""
    cut = completion(
        None, finish_reason="length", reasoning=REASONING, completion_tokens=300, prompt_tokens=700
    )
    server = ScriptedServer([respond(cut)], max_model_len=CONTEXT, count_tokens=lambda messages: 700)
    outcome = await make_harness(spec.with_overrides(max_tokens=4096), server).extract(LONG_RECORD)
    assert [body["max_tokens"] for body in server.bodies] == [CONTEXT - 700]
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.attempts) == (FailureClass.TOO_LONG, 1)
    assert outcome.message.startswith(
        "the prompt leaves too little of the context for an answer: 700 tokens of a context of 1000 tokens "
        "(the server's max_model_len) leaves 300 tokens for the answer, and the answer was cut off there "
        "(300 completion tokens, 10 of them reasoning, finish_reason=length), short of the job's "
        "max_tokens 4,096; most of it is field 'description' (3,250 characters): enable chunking"
    )
    assert (outcome.counted_prompt_tokens, outcome.answer_cut_at) == (700, 300)  # for a later run


async def test_a_record_an_earlier_run_counted_past_the_context_is_too_long_without_a_request(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """`--only-failed --class too_long` behind a server that cannot count: its failure kept the server's
    count (1,050 tokens, one a word leaves it room), the context is what it was: nothing to send."""
    server = ScriptedServer([respond(good_completion())], max_model_len=CONTEXT)
    record = dataclasses.replace(LONG_RECORD, counted_prompt_tokens=1050)
    outcome = await make_harness(spec.with_overrides(max_tokens=4096), server).extract(record)
    assert isinstance(outcome, Failed) and server.bodies == []
    assert (outcome.failure_class, outcome.attempts, outcome.counted_prompt_tokens) == (
        FailureClass.TOO_LONG,
        0,
        1050,
    )
    assert outcome.message.startswith(
        "the prompt alone does not fit the context: 1050 tokens (the server's count in an earlier run) "
        "against a context of 1000 tokens"
    )


async def test_a_record_whose_answer_was_cut_off_at_the_end_of_the_context_goes_again_only_with_more_room(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """An earlier run counted its prompt at 700 tokens and its answer took all 300 the context left: the
    same context refuses it unsent; one of 1,100 sends it, with the 400 tokens that leaves."""
    job = spec.with_overrides(max_tokens=4096)
    record = dataclasses.replace(LONG_RECORD, counted_prompt_tokens=700, answer_cut_at=300)
    server = ScriptedServer([respond(good_completion())], max_model_len=CONTEXT)
    outcome = await make_harness(job, server).extract(record)
    assert isinstance(outcome, Failed) and server.bodies == []
    assert (outcome.failure_class, outcome.attempts) == (FailureClass.TOO_LONG, 0)
    assert (outcome.counted_prompt_tokens, outcome.answer_cut_at) == (700, 300)  # still known
    assert outcome.message.startswith(
        "the prompt leaves too little of the context for an answer: 700 tokens (the server's count in an "
        "earlier run) of a context of 1000 tokens (the server's max_model_len) leaves 300 tokens for the "
        "answer, and an answer needs 301 tokens (its answer was cut off at 300 tokens in an earlier run)"
    )
    larger = ScriptedServer([respond(answered_with_prompt(700))], max_model_len=1100)
    assert isinstance(await make_harness(job, larger).extract(record), Extracted)
    assert [body["max_tokens"] for body in larger.bodies] == [400]


async def test_an_answer_cut_off_with_a_budget_only_the_estimate_cut_is_asked_again_with_all_the_room(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    """No /tokenize: the estimate cut the budget; the reply counts the prompt at 100 tokens fewer, so the
    retry asks for the room that count leaves, not twice the starved budget."""
    job = spec.with_overrides(max_tokens=4096)
    estimate = estimated_tokens(PromptBuilder(job).request_for(RECORD.fields).messages)
    cut = completion(
        None,
        finish_reason="length",
        reasoning=REASONING,
        completion_tokens=1000 - estimate,
        prompt_tokens=estimate - 100,
    )
    server = ScriptedServer([respond(cut), respond(good_completion())], max_model_len=CONTEXT)
    harness = make_harness(job, server)
    harness.calibration = Calibration()
    harness.calibration.counted(102, 100)  # a rate learned: with its margin, the estimate as it is
    outcome = await harness.extract()
    assert isinstance(outcome, Extracted) and outcome.attempts == 2
    assert [body["max_tokens"] for body in server.bodies] == [CONTEXT - estimate, CONTEXT - estimate + 100]


async def test_behind_a_proxy_the_first_count_teaches_the_records_waiting_for_it(spec: JobSpec) -> None:
    """``sim --no-tokenize``, eight records at once whose estimates are past the context of 700 and whose
    prompts are not: one goes first with what its floor leaves and is refused with its count; the
    others wait for that count instead of each asking the same, and go once, with nearly all the room."""
    records = [SourceRecord(i, {"title": f"Job {i}", "description": "We need SQL. " * 125}) for i in range(8)]
    async with small_context_sim(700, counts=False, lists=True) as (url, seen):
        job = spec.with_overrides(base_url=url, max_tokens=4096, reasoning_effort="low", concurrency=8)
        endpoint = endpoint_for(job)
        outcomes: list[Outcome] = []
        try:
            await endpoint.client.check_server()
            async with running_router([endpoint]) as router:
                extractor = Extractor(
                    router,
                    PromptBuilder(job),
                    job.schema_class,
                    RetryPolicy(job.retry, sleep=no_sleep),
                    BudgetGrowth(job.retry.truncation_growth, job.max_tokens_ceiling),
                    RunStats(pending_at_start=len(records), concurrency=8),
                )

                async def extract(record: SourceRecord) -> None:
                    outcomes.append(await extractor.extract(record))

                async with anyio.create_task_group() as tasks:
                    for record in records:
                        tasks.start_soon(extract, record)
        finally:
            await endpoint.client.aclose()
    assert len(outcomes) == 8 and all(isinstance(outcome, Extracted) for outcome in outcomes)
    assert sorted(outcome.attempts for outcome in outcomes) == [1] * 7 + [2]
    assert [status for _, _, status in seen].count(400) == 1
    answered = [(prompt, budget) for prompt, budget, status in seen if status == 200]
    assert len(answered) == 8
    assert all(0 <= 700 - prompt - budget < prompt * 0.03 for prompt, budget in answered)
