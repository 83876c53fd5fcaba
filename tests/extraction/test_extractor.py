from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest

from pipeline.errors import FailureClass, FatalRunError
from pipeline.extraction.extractor import BudgetGrowth, Extractor
from pipeline.extraction.outcomes import Extracted, Failed
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.retry import RetryPolicy
from pipeline.job.spec import JobSpec, load_job
from pipeline.run.stats import RunStats
from pipeline.servers.endpoint import Endpoint
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
        self._down_for_probes = 0

    async def extract(self, record: SourceRecord = RECORD) -> Extracted | Failed:
        if self.endpoint is None:  # one server and one endpoint over all the records
            await self.loopback.start()
            self.endpoint = endpoint_for(served(self.spec, self.loopback))
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
    assert harness.stats.output_tokens == 40


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
    truncated = completion(None, finish_reason="length", reasoning="thinking " * 100)
    server = ScriptedServer([respond(truncated), respond(truncated), respond(good_completion())])
    outcome = await make_harness(spec, server).extract()
    assert isinstance(outcome, Extracted)
    assert [body["max_tokens"] for body in server.bodies] == [256, 512, 1024]
    assert all(len(body["messages"]) == 2 for body in server.bodies)


async def test_truncation_exhausted_is_recorded_with_the_reason(
    spec: JobSpec, make_harness: MakeHarness
) -> None:
    truncated = completion(None, finish_reason="length", reasoning="thinking " * 100, completion_tokens=256)
    outcome = await make_harness(spec, ScriptedServer([respond(truncated)])).extract()
    assert isinstance(outcome, Failed)
    assert outcome.failure_class is FailureClass.TRUNCATED
    assert outcome.attempts == 3
    assert "raise max_tokens or lower reasoning_effort" in outcome.message
    assert outcome.last_raw_output is not None and outcome.last_raw_output.startswith("thinking")


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
    steps = [error(400), error(400), respond(good_completion()), error(400), error(400)]
    harness = make_harness(spec, ScriptedServer(steps), abort_after=3)
    for _ in range(5):
        await harness.extract()


async def test_bad_output_failures_do_not_stop_the_run(spec: JobSpec, make_harness: MakeHarness) -> None:
    harness = make_harness(spec, ScriptedServer([respond(completion("not json"))]), abort_after=2)
    for _ in range(4):
        assert isinstance(await harness.extract(), Failed)


async def test_timeouts_are_counted(spec: JobSpec, make_harness: MakeHarness) -> None:
    quick = spec.with_overrides(request_timeout_s=0.5)
    harness = make_harness(quick, ScriptedServer([HANG, respond(good_completion())]))
    assert isinstance(await harness.extract(), Extracted)
    assert harness.stats.timeouts == 1
    assert harness.stats.requests == 2


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
    assert harness.stats.retries == {}
    assert harness.stats.requests == 3 and harness.stats.in_flight == 0  # one of them refused
