"""The model judge against fake servers on 127.0.0.1, through the production client: one request per
record, each verdict on its value, re-asks and retries under the one policy, failures counted, and
judging resumed without judging anything twice."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import orjson
import pytest

from pipeline.errors import AlreadyRunningError, ConfigError, EndpointUnreachableError, FatalRunError
from pipeline.job.commands import command
from pipeline.job.spec import JobSpec
from pipeline.judging import model
from pipeline.judging.model import JudgingFailure, ModelJudging, Progress, judge_by_model
from pipeline.judging.model_prompt import ANSWER_INSTRUCTION, VALUES_HEADING
from pipeline.quality.judgments import JudgmentVerdict
from pipeline.reports.reading import Sample
from pipeline.source.db import open_database
from pipeline.store.judgments import read_judgments
from tests.support.fakes import HANG, Answer, ScriptedServer, completion, dead_url, error, respond, serving
from tests.support.jobs import make_job, table_rows
from tests.support.outputs import database_held_by_another_process, run_scripted

JUDGE = "judge-model"
JUDGED_RECORDS = {"0", "8", "9", "10", "11"}  # the others failed extraction (tests.support.outputs)
VALUES_PER_RECORD = 6  # title, skills SQL and Python, years, low, high
_VALUE = re.compile(r"^(\d+)\. ([^:]+): (.*)$", re.MULTILINE)
Rule = Callable[[str, str, str], str]


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    spec = make_job(tmp_path, records=12)
    run_scripted(spec)
    return spec


def python_is_wrong(record: str, field: str, value: str) -> str:
    return "wrong" if value == "Python" else "correct"


def record_of(body: dict[str, Any]) -> str:
    found = re.search(r"\[title\]\nTitle (\d+)", str(body["messages"][1]["content"]))
    assert found is not None
    return found.group(1)


def verdicts(body: dict[str, Any], rule: Rule = python_is_wrong) -> httpx2.Response:
    """What a judge following ``rule`` answers: a verdict for each numbered value of the request."""
    values = _VALUE.findall(str(body["messages"][1]["content"]).split(VALUES_HEADING)[1])
    answer = {number: rule(record_of(body), field, value) for number, field, value in values}
    return respond(completion(orjson.dumps(answer).decode()))


def judge_answering(rule: Rule = python_is_wrong) -> Callable[[httpx2.Request], Answer]:
    return lambda request: verdicts(orjson.loads(request.content), rule)


def judge_sync(
    spec: JobSpec,
    handler: Callable[[httpx2.Request], Answer],
    sample: Sample | None = None,
    *,
    judge: dict[str, Any] | None = None,
    progress: Progress | None = None,
    sleeps: list[float] | None = None,
) -> tuple[ModelJudging, ScriptedServer]:
    """Judge the variant main of ``spec`` by model ``judge-model`` served by ``handler`` (its chat
    requests kept in the server's ``bodies``); the retry policy's waits go to ``sleeps``."""
    server = ScriptedServer([handler], models=(JUDGE,))

    async def record_sleep(seconds: float) -> None:
        (sleeps if sleeps is not None else []).append(seconds)

    async def judging() -> ModelJudging:
        async with serving(server) as served:
            section = {"model": JUDGE, "endpoint": {"base_url": served.url}, **(judge or {})}
            judged = spec.with_overrides(judge=section)
            return await judge_by_model(judged, ["main"], sample, progress=progress, sleep=record_sleep)

    return anyio.run(judging), server


def stored(spec: JobSpec) -> dict[tuple[str, str, str], JudgmentVerdict]:
    """The current judgments, by record, field and value (each once: nothing was judged twice)."""
    connection = open_database(spec.database, read_only=True)
    try:
        judgments = read_judgments(connection, spec, latest_only=False)
    finally:
        connection.close()
    assert all(judgment.judge == f"model:{JUDGE}" for judgment in judgments)
    keys = Counter((j.record_id, j.field, j.value) for j in judgments)
    assert set(keys.values()) <= {1}, "a value was judged twice"
    return {(j.record_id, j.field, j.value): j.verdict for j in judgments}


def rows(spec: JobSpec) -> int:
    return int(table_rows(spec.database, "SELECT count(*) FROM judgments")[0][0])


def test_each_value_gets_the_verdict_given_for_its_number_in_one_request_per_record(spec: JobSpec) -> None:
    seen: list[ModelJudging] = []
    outcome, server = judge_sync(spec, judge_answering(), progress=seen.append)
    assert (outcome.records, outcome.judged, outcome.values, outcome.correct) == (5, 5, 30, 25)
    assert (outcome.requests, outcome.failed, outcome.skipped, outcome.judge) == (5, (), 0, f"model:{JUDGE}")
    assert outcome.correct_share == pytest.approx(25 / 30)
    assert seen and seen[-1].judged == 5 and seen[-1].left == 0
    judged = stored(spec)
    assert len(judged) == 30
    assert judged[("8", "skills", "Python")] is JudgmentVerdict.WRONG
    assert judged[("8", "skills", "SQL")] is JudgmentVerdict.CORRECT
    assert judged[("8", "title", "Title 8")] is JudgmentVerdict.CORRECT
    assert judged[("8", "years", "8")] is JudgmentVerdict.CORRECT
    assert sorted(record_of(body) for body in server.bodies) == sorted(JUDGED_RECORDS)
    body = server.bodies[0]
    schema = body["response_format"]["json_schema"]["schema"]
    assert list(schema["properties"]) == schema["required"] == ["1", "2", "3", "4", "5", "6"]
    assert schema["properties"]["1"]["enum"] == ["correct", "wrong"] and not schema["additionalProperties"]
    # The judge's model on the judge's server; the job's budget, effort and temperature.
    assert (body["model"], body["max_tokens"], body["reasoning_effort"], body["temperature"]) == (
        JUDGE,
        256,
        "low",
        0.0,
    )
    assert body["messages"][0] == server.bodies[-1]["messages"][0]  # one shared prefix
    assert "1. title: Title" in body["messages"][1]["content"]


def test_the_judge_sections_own_budget_effort_and_concurrency_are_sent(spec: JobSpec) -> None:
    judge = {"max_tokens": 77, "reasoning_effort": None, "concurrency": 1}
    _, server = judge_sync(spec, judge_answering(), judge=judge)
    assert {body["max_tokens"] for body in server.bodies} == {77}
    assert not any("reasoning_effort" in body for body in server.bodies)
    assert [record_of(body) for body in server.bodies] == ["0", "10", "11", "8", "9"]  # one at a time


def test_a_bad_answer_is_asked_again_with_what_was_wrong(spec: JobSpec) -> None:
    asked: Counter[str] = Counter()

    def answer(request: httpx2.Request) -> Answer:
        body = orjson.loads(request.content)
        asked[record_of(body)] += 1
        if record_of(body) == "8" and asked["8"] == 1:
            return respond(
                completion('{"1": "correct", "2": "maybe"}')
            )  # a word it may not use, and 4 missing
        return verdicts(body)

    outcome, server = judge_sync(spec, answer)
    assert (outcome.judged, outcome.values, outcome.requests, outcome.failed) == (5, 30, 6, ())
    again = [body for body in server.bodies if record_of(body) == "8"][1]
    assert again["messages"][3]["content"].startswith("Your previous reply was rejected")
    assert again["response_format"]["json_schema"]["schema"]["required"] == ["1", "2", "3", "4", "5", "6"]
    assert len(stored(spec)) == 30


def test_a_record_that_keeps_failing_is_counted_and_the_others_are_judged(spec: JobSpec) -> None:
    def answer(request: httpx2.Request) -> Answer:
        body = orjson.loads(request.content)
        return respond(completion("no JSON here")) if record_of(body) == "9" else verdicts(body)

    outcome, _ = judge_sync(spec, answer)
    assert (outcome.judged, outcome.values, outcome.failures) == (4, 24, {"invalid_json": 1})
    (failure,) = outcome.failed
    assert failure == JudgingFailure("9", "main", "invalid_json", failure.message)
    assert outcome.requests == 4 + 3  # the first request and the job's two re-asks
    assert {record for record, _, _ in stored(spec)} == JUDGED_RECORDS - {"9"}


def test_a_server_error_is_retried_after_the_policys_backoff(spec: JobSpec) -> None:
    failed_once: set[str] = set()

    def answer(request: httpx2.Request) -> Answer:
        body = orjson.loads(request.content)
        if record_of(body) == "10" and "10" not in failed_once:
            failed_once.add("10")
            return error(503, "loading")
        return verdicts(body)

    sleeps: list[float] = []
    outcome, _ = judge_sync(spec, answer, sleeps=sleeps)
    assert (outcome.judged, outcome.requests) == (5, 6)
    assert len(sleeps) == 1 and 1.0 <= sleeps[0] <= 2.0  # the job's first backoff: 2 s, half of it jittered


def test_a_server_without_guided_decoding_is_asked_without_response_format(spec: JobSpec) -> None:
    def answer(request: httpx2.Request) -> Answer:
        body = orjson.loads(request.content)
        if "response_format" in body:
            return error(400, "response_format is not supported by this server")
        return verdicts(body)

    outcome, server = judge_sync(spec, answer, judge={"concurrency": 1})
    assert (outcome.judged, outcome.values, outcome.requests) == (5, 30, 6)  # the refused one cost nothing
    assert not any("response_format" in body for body in server.bodies[1:])
    assert ANSWER_INSTRUCTION in server.bodies[-1]["messages"][0]["content"]  # the answer's shape is said


def test_judging_stops_with_one_line_when_every_record_fails(spec: JobSpec) -> None:
    with pytest.raises(
        FatalRunError, match=r"^the model judge stopped: every record could not be judged"
    ) as raised:
        judge_sync(spec, lambda request: error(400, "bad\nrequest"))
    assert "\n" not in str(raised.value) and "(permanent: HTTP 400: bad request)" in str(raised.value)


def test_judging_stops_after_the_jobs_failures_in_a_row(spec: JobSpec) -> None:
    spec = spec.with_overrides(retry={"abort_after_consecutive_failures": 2})
    server = ScriptedServer([error(400, "bad request")], models=(JUDGE,))
    with pytest.raises(FatalRunError, match=r"the model judge stopped: 2 records in a row could not"):
        judge_sync(spec, server, judge={"concurrency": 1})
    assert len(server.bodies) == 2
    assert rows(spec) == 0


def test_a_dead_judge_server_is_said_before_anything_is_judged(spec: JobSpec) -> None:
    judged = spec.with_overrides(judge={"endpoint": {"base_url": dead_url()}})
    with pytest.raises(EndpointUnreachableError, match="cannot connect"):
        anyio.run(functools.partial(judge_by_model, judged, ["main"], None))


@pytest.mark.process
def test_a_run_holding_the_database_is_refused_before_anything_is_sent(spec: JobSpec) -> None:
    server = ScriptedServer([judge_answering()])
    with database_held_by_another_process(spec.database, as_run=True), pytest.raises(AlreadyRunningError):
        judge_sync(spec, server)
    assert server.bodies == [] and rows(spec) == 0


def test_a_variant_without_results_is_refused(spec: JobSpec) -> None:
    async def judging() -> ModelJudging:
        return await judge_by_model(spec, ["main", "nope"], None)

    with pytest.raises(ConfigError, match=r"variant 'nope' has no results \(variants with results: main\)"):
        anyio.run(judging)


def test_a_judge_on_the_jobs_local_server_is_told_the_command_that_serves_one(spec: JobSpec) -> None:
    local = spec.with_overrides(base_url="local")  # the judge takes the job's server, not served now

    async def judging() -> ModelJudging:
        return await judge_by_model(local, ["main"], None)

    with pytest.raises(ConfigError) as raised:
        anyio.run(judging)
    assert str(raised.value).endswith(f"URL (`{command('serve-local')}` prints one)")  # pasted anywhere


def test_a_judging_cut_short_resumes_where_it_stopped(spec: JobSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """As after Ctrl-C: what was judged is kept; the next judging asks only for the rest."""
    monkeypatch.setattr(model, "FLUSH_INTERVAL_S", 0.01)

    def answer(request: httpx2.Request) -> Answer:
        body = orjson.loads(request.content)
        return HANG if record_of(body) in ("10", "11") else verdicts(body)

    async def judge_until_stopped() -> None:
        with anyio.CancelScope() as scope:

            def stop_when_three_are_written(progress: ModelJudging) -> None:
                if progress.judged == 3:
                    scope.cancel()

            await _judging(spec, answer, stop_when_three_are_written)

    anyio.run(judge_until_stopped)
    assert {record for record, _, _ in stored(spec)} == {"0", "8", "9"}
    outcome, server = judge_sync(spec, judge_answering())
    assert (outcome.skipped, outcome.judged, outcome.requests) == (3, 2, 2)
    assert sorted(record_of(body) for body in server.bodies) == ["10", "11"]
    assert len(stored(spec)) == 30


async def _judging(spec: JobSpec, handler: Callable[[httpx2.Request], Answer], progress: Progress) -> None:
    server = ScriptedServer([handler], models=(JUDGE,))
    async with serving(server) as served:
        judged = spec.with_overrides(judge={"model": JUDGE, "endpoint": {"base_url": served.url}})
        await judge_by_model(judged, ["main"], None, progress=progress)


def test_a_smaller_sample_is_inside_the_larger_and_is_not_judged_again(spec: JobSpec) -> None:
    first, _ = judge_sync(spec, judge_answering(), Sample(6))
    second, server = judge_sync(spec, judge_answering(), Sample(12))
    assert first.records < second.records == 5
    assert second.skipped == first.judged and second.judged == 5 - first.judged
    assert len(server.bodies) == second.judged


def test_a_redone_record_is_judged_again_and_its_old_judgments_are_stale(spec: JobSpec) -> None:
    judge_sync(spec, judge_answering())
    connection = open_database(spec.database)
    try:
        connection.execute("UPDATE postings SET description = 'edited' WHERE id = 8")
    finally:
        connection.close()
    run_scripted(spec)  # a plain run redoes the edited record
    outcome, server = judge_sync(spec, judge_answering())
    assert (outcome.skipped, outcome.judged, [record_of(body) for body in server.bodies]) == (4, 1, ["8"])
    assert len(stored(spec)) == 30 and rows(spec) == 36  # the six of the old answer kept, stale
