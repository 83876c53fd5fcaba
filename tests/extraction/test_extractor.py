from __future__ import annotations

import copy
from pathlib import Path

import httpx2
import orjson
import pytest

from pipeline.errors import FailureClass, FatalRunError
from pipeline.extraction.extractor import BudgetGrowth, Extractor
from pipeline.extraction.outcomes import Extracted, Failed
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.retry import RetryPolicy
from pipeline.job.spec import JobSpec, load_job
from pipeline.run.stats import RunStats
from pipeline.source.reader import SourceRecord
from tests.support.endpoints import endpoint_for, running_router
from tests.support.fakes import GOOD_ITEM, ScriptedServer, completion, error, good_completion, respond
from tests.support.jobs import write_job

pytestmark = pytest.mark.anyio

RECORD = SourceRecord(7, {"title": "Data Engineer", "description": "We need SQL."})


async def noop_sleep(_: float) -> None:
    return None


class Harness:
    def __init__(self, spec: JobSpec, server: ScriptedServer, abort_after: int = 50) -> None:
        self.spec = spec.model_copy(
            update={"retry": spec.retry.model_copy(update={"abort_after_consecutive_failures": abort_after})}
        )
        self.server = server
        self.stats = RunStats(pending_at_start=1, concurrency=1)
        self.prompts = PromptBuilder(spec)
        self.endpoint = endpoint_for(self.spec, server.transport)  # one server over all the records

    async def extract(self, record: SourceRecord = RECORD) -> Extracted | Failed:
        spec = self.spec
        async with running_router([self.endpoint]) as router:
            extractor = Extractor(
                router,
                self.prompts,
                spec.schema_class,
                RetryPolicy(spec.retry, sleep=noop_sleep),
                BudgetGrowth(spec.retry.truncation_growth, spec.max_tokens_ceiling),
                self.stats,
            )
            return await extractor.extract(record)


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return load_job(
        write_job(
            tmp_path,
            retry={"transient_retries": 3, "reasks": 2, "truncation_retries": 2, "max_tokens_ceiling": 1024},
        )
    )


async def test_ok_first_time(spec: JobSpec) -> None:
    harness = Harness(spec, ScriptedServer([respond(good_completion())]))
    outcome = await harness.extract()
    assert isinstance(outcome, Extracted)
    assert outcome.record_id == 7
    assert orjson.loads(outcome.data_json) == GOOD_ITEM
    assert outcome.attempts == 1
    assert outcome.reply.completion_tokens == 40
    assert harness.stats.in_flight == 0
    assert harness.stats.output_tokens == 40


async def test_first_request_puts_the_static_system_prompt_first_and_the_record_last(spec: JobSpec) -> None:
    server = ScriptedServer([respond(good_completion())])
    await Harness(spec, server).extract()
    system, user = server.bodies[0]["messages"]
    assert system["role"] == "system" and system["content"].startswith("Extract the posting.")
    assert '"skills"' in system["content"]  # the schema (with its descriptions) is in the prompt
    assert user == {"role": "user", "content": "Title: Data Engineer\n\nWe need SQL."}


async def test_transient_then_ok(spec: JobSpec) -> None:
    server = ScriptedServer([error(503), httpx2.ReadError("reset"), respond(good_completion())])
    outcome = await Harness(spec, server).extract()
    assert isinstance(outcome, Extracted)
    assert outcome.attempts == 3
    assert server.bodies[0] == server.bodies[2]  # a transient retry resends the same request


async def test_invalid_json_is_reasked_with_the_error(spec: JobSpec) -> None:
    server = ScriptedServer([respond(completion('{"title": "x", ')), respond(good_completion())])
    harness = Harness(spec, server)
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


async def test_schema_invalid_reask_carries_field_errors(spec: JobSpec) -> None:
    bad = orjson.dumps({**GOOD_ITEM, "skills": "SQL"}).decode()
    server = ScriptedServer([respond(completion(bad)), respond(good_completion())])
    assert isinstance(await Harness(spec, server).extract(), Extracted)
    assert "skills: Input should be a valid list" in server.bodies[1]["messages"][3]["content"]


async def test_truncated_retries_with_a_larger_budget(spec: JobSpec) -> None:
    truncated = completion(None, finish_reason="length", reasoning="thinking " * 100)
    server = ScriptedServer([respond(truncated), respond(truncated), respond(good_completion())])
    outcome = await Harness(spec, server).extract()
    assert isinstance(outcome, Extracted)
    assert [body["max_tokens"] for body in server.bodies] == [256, 512, 1024]
    assert all(len(body["messages"]) == 2 for body in server.bodies)


async def test_truncation_exhausted_is_recorded_with_the_reason(spec: JobSpec) -> None:
    truncated = completion(None, finish_reason="length", reasoning="thinking " * 100, completion_tokens=256)
    outcome = await Harness(spec, ScriptedServer([respond(truncated)])).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.TRUNCATED
    assert outcome.attempts == 3
    assert "raise max_tokens or lower reasoning_effort" in outcome.message
    assert outcome.last_raw_output is not None and outcome.last_raw_output.startswith("thinking")


async def test_bad_output_exhausted_keeps_the_last_raw_output(spec: JobSpec) -> None:
    server = ScriptedServer(
        [respond(completion("nope 1")), respond(completion("nope 2")), respond(completion("nope 3"))]
    )
    outcome = await Harness(spec, server).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.INVALID_JSON
    assert outcome.attempts == 3
    assert outcome.last_raw_output == "nope 3"


async def test_empty_output_exhausted(spec: JobSpec) -> None:
    outcome = await Harness(spec, ScriptedServer([respond(completion(""))])).extract()
    assert isinstance(outcome, Failed) and outcome.failure_class is FailureClass.EMPTY


async def test_permanent_error_fails_at_once(spec: JobSpec) -> None:
    server = ScriptedServer([error(400, "This model's maximum context length is 4096 tokens.")])
    outcome = await Harness(spec, server).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.PERMANENT
    assert outcome.attempts == 1
    assert "maximum context length" in outcome.message


async def test_transient_exhausted_is_a_transient_failure(spec: JobSpec) -> None:
    outcome = await Harness(spec, ScriptedServer([error(502)])).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.TRANSIENT
    assert outcome.attempts == 4


async def test_fatal_error_escapes(spec: JobSpec) -> None:
    with pytest.raises(FatalRunError, match="refused"):
        await Harness(spec, ScriptedServer([error(401)])).extract()


async def test_many_server_side_failures_in_a_row_stop_the_run(spec: JobSpec) -> None:
    harness = Harness(spec, ScriptedServer([error(400, "bad request")]), abort_after=3)
    assert isinstance(await harness.extract(), Failed)
    assert isinstance(await harness.extract(), Failed)
    with pytest.raises(FatalRunError, match="3 records in a row failed on the server side"):
        await harness.extract()


async def test_a_success_resets_the_failure_streak(spec: JobSpec) -> None:
    steps = [error(400), error(400), respond(good_completion()), error(400), error(400)]
    harness = Harness(spec, ScriptedServer(steps), abort_after=3)
    for _ in range(5):
        await harness.extract()


async def test_bad_output_failures_do_not_stop_the_run(spec: JobSpec) -> None:
    harness = Harness(spec, ScriptedServer([respond(completion("not json"))]), abort_after=2)
    for _ in range(4):
        assert isinstance(await harness.extract(), Failed)


async def test_timeouts_are_counted(spec: JobSpec) -> None:
    harness = Harness(spec, ScriptedServer([httpx2.ReadTimeout("slow"), respond(good_completion())]))
    assert isinstance(await harness.extract(), Extracted)
    assert harness.stats.timeouts == 1
    assert harness.stats.requests == 2


async def test_refused_connections_wait_for_the_server_and_cost_no_attempt(spec: JobSpec) -> None:
    """A server restart: connections refused after the server had answered are not the record's fault."""
    refused = httpx2.ConnectError("Connection refused")
    good = respond(good_completion())
    server = ScriptedServer([good, refused, refused, refused, good])
    harness = Harness(spec, server)
    first = await harness.extract(SourceRecord(1, RECORD.fields))
    second = await harness.extract(SourceRecord(2, RECORD.fields))
    assert isinstance(first, Extracted) and isinstance(second, Extracted)
    assert second.attempts == 1  # three refusals, no attempt spent, no transient retry used
    assert harness.stats.retries == {}
    assert harness.stats.requests == 5 and harness.stats.in_flight == 0
