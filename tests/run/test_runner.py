from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import duckdb
import httpx2
import orjson
import pytest
from structlog.testing import capture_logs

from pipeline.errors import (
    EXIT_ABORTED,
    EXIT_CONFIG,
    ConfigError,
    EndpointUnreachableError,
    FatalRunError,
    ModelNotServedError,
    exit_code_for,
)
from pipeline.extraction.context import RunContext
from pipeline.reports.status import job_status
from pipeline.run.runner import CANCELLED, RunStatus, _opened_source, opened_run, run_job
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.knee_search import KneeMemory
from pipeline.source.reader import SourceReader
from tests.support.fakes import (
    GOOD_ITEM,
    LoopbackServer,
    ScriptedServer,
    completion,
    dead_url,
    error,
    good_completion,
    respond,
    serving,
)
from tests.support.jobs import make_job, table_rows
from tests.support.outputs import record_number
from tests.support.runs import QuietProgress, options, run_served, served

pytestmark = pytest.mark.anyio


def title_of(request: httpx2.Request) -> str:
    return str(orjson.loads(request.content)["messages"][1]["content"].split("\n")[0])


class WaveServer:
    """Holds every request until ``concurrency`` are waiting (or all that can still come), then answers
    them together. If the pipeline ever failed to refill a free slot, the wave would never fill."""

    def __init__(self, concurrency: int, total: int) -> None:
        self.concurrency, self.total = concurrency, total
        self.waiting: list[asyncio.Event] = []
        self.answered = 0
        self.in_flight = 0
        self.peak = 0
        self.waves = 0

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        released = asyncio.Event()
        self.waiting.append(released)
        if len(self.waiting) == min(self.concurrency, self.total - self.answered):
            self.waves += 1
            for event in self.waiting:
                event.set()
            self.waiting = []
        await released.wait()
        self.in_flight -= 1
        self.answered += 1
        return respond(good_completion(title=title_of(request)))


async def test_slots_are_kept_full_and_never_exceeded(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=500, concurrency=16)
    server = WaveServer(concurrency=16, total=500)
    with anyio.fail_after(30):
        summary = await run_served(spec, server)
    assert server.peak == 16
    assert server.waves == 32  # 31 full waves of 16, then the last 4
    assert summary.status is RunStatus.COMPLETED and summary.exit_code == 0
    assert (summary.done, summary.failed, summary.pending_at_start) == (500, 0, 500)
    rows = table_rows(
        spec.database,
        "SELECT count(*), count(DISTINCT record_id), min(record_id), max(record_id) FROM results",
    )
    assert rows == [(500, 500, 0, 499)]
    mapped = table_rows(
        spec.database, "SELECT extracted->>'title' = 'Title: Title ' || record_id FROM results"
    )
    assert all(row[0] for row in mapped)  # each result belongs to its record
    assert table_rows(spec.database, "SELECT status, done, failed FROM runs") == [("completed", 500, 0)]


async def test_failures_are_recorded_and_retried_only_when_asked(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=20)
    fixed = False

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        if title_of(request).endswith(("3", "7")) and not fixed:
            return respond(completion("this is not JSON"))
        return respond(good_completion())

    summary = await run_served(spec, answer)
    assert summary.status is RunStatus.COMPLETED_WITH_FAILURES and summary.exit_code == 1
    assert (summary.done, summary.failed) == (16, 4)
    failures = table_rows(spec.database, "SELECT record_id, failure_class, attempts FROM failures ORDER BY 1")
    assert failures == [
        (3, "invalid_json", 3),
        (7, "invalid_json", 3),
        (13, "invalid_json", 3),
        (17, "invalid_json", 3),
    ]

    again = await run_served(spec, answer)
    assert again.status is RunStatus.NOTHING_TO_DO and again.exit_code == 0

    fixed = True
    retried = await run_served(spec, answer, retry_failed=True)
    assert (retried.done, retried.failed) == (4, 0)
    assert table_rows(spec.database, "SELECT count(*) FROM failures") == [(0,)]
    assert table_rows(spec.database, "SELECT count(*) FROM results") == [(20,)]


async def test_transient_failures_are_retried_by_a_plain_rerun(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5, retry={"transient_retries": 1})
    server = ScriptedServer([respond(good_completion())] * 3 + [error(503)])
    first = await run_served(spec, server, limit=5)
    assert first.failed == 2
    second = await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert (second.pending_at_start, second.done) == (2, 2)


async def test_limit_then_resume_extracts_each_record_once(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=100)
    server = ScriptedServer([respond(good_completion())])
    first = await run_served(spec, server, limit=30)
    assert first.done == 30
    second = await run_served(spec, server)
    assert (second.pending_at_start, second.done) == (70, 70)
    assert len(server.bodies) == 100
    assert table_rows(spec.database, "SELECT count(*), count(DISTINCT record_id) FROM results") == [
        (100, 100)
    ]
    assert table_rows(spec.database, "SELECT run_id, count(*) FROM results GROUP BY 1 ORDER BY 1") == [
        (1, 30),
        (2, 70),
    ]


async def test_auto_starts_at_the_knee_an_earlier_run_found_and_keeps_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`concurrency: auto` ramps from 8 only the first time: a run stores each server's knee and the
    next starts there (waves of 24 fill only if 24 are sent at once)."""
    first = LoopbackServer(ScriptedServer([respond(good_completion())]))
    await first.start()
    spec = served(make_job(tmp_path, records=120, concurrency="auto"), first)
    await run_job(spec, options(limit=24))
    await first.stop()
    key = spec.endpoint_configs()[0].knee_key
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE runs SET knees = ?", [orjson.dumps({key: 24, "other m": 5}).decode()])
    server = WaveServer(concurrency=24, total=96)
    learned = KneeMemory(30, bracketed=True)
    monkeypatch.setattr(Endpoint, "found_knee", property(lambda endpoint: learned))
    same_address = LoopbackServer(server)  # the knee is the server's: the same address again
    same_address.port = first.port
    await same_address.start()
    with capture_logs() as logs, anyio.fail_after(30):
        summary = await run_job(spec, options())
    await same_address.stop()
    assert summary.done == 96 and server.peak == 24
    started = [entry for entry in logs if entry["event"].startswith("concurrency auto starts")]
    assert [entry["level"] for entry in started] == [24]
    stored = table_rows(spec.database, "SELECT knees FROM runs ORDER BY run_id")
    assert [orjson.loads(row[0]) for row in stored] == [
        {key: 24, "other m": 5},  # as an earlier version wrote it: a plain level, read as a knee
        {key: {"level": 30, "bracketed": True}},
    ]


def refuse(request: httpx2.Request) -> httpx2.Response:
    raise AssertionError("no request expected")


async def test_nothing_to_do_sends_no_record_and_is_kept_as_a_quiet_run(tmp_path: Path) -> None:
    """Issue 29: a quiet night left no trace, so `report --fail-on-drift` judged the night before again
    and the metrics textfile aged past the alert of docs/running.md."""
    spec = make_job(tmp_path, records=3)
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    textfile = tmp_path / "pipeline.prom"
    server = ScriptedServer([refuse])  # its model list only: the check a run makes before its first request
    summary = await run_served(spec, server, metrics_textfile=textfile, variant_options=("--model", "m"))
    assert summary.status is RunStatus.NOTHING_TO_DO and summary.run_id == 2 and summary.exit_code == 0
    assert server.bodies == []
    row = table_rows(
        spec.database,
        "SELECT status, done, failed, pending_at_start, concurrency, ended_at >= started_at, profile, "
        "series, message, options, base_url LIKE 'http://127.0.0.1:%/v1' FROM runs WHERE run_id = 2",
    )
    nothing_done = ("nothing_to_do", 0, 0, 0, None, True, None, None)
    said = ("nothing pending of 3 source records", '["--model","m"]', True)  # the server it would ask
    assert row == [(*nothing_done, *said)]
    assert "pipeline_run_active{job=" in textfile.read_text()
    # The quiet night is no last run: status's rate and ETA stay those of the run that did something.
    last = job_status(spec).last_run
    assert last is not None and (last["run_id"], last["status"], last["done"]) == (1, "completed", 3)


async def test_a_blank_record_is_never_sent_and_counted_blank_everywhere(tmp_path: Path) -> None:
    """Before, a record whose prompt fields were all empty was sent, and its extraction was the model's
    invention. Now the run sets it aside: not sent, no result, no failure; its row, summary and
    status count it as blank, and it is taken once it has text."""
    spec = make_job(tmp_path, records=5)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE postings SET title = NULL, description = '  ' WHERE id IN (1, 3)")
    server = ScriptedServer([respond(good_completion())])
    with capture_logs() as logs:
        summary = await run_served(spec, server)
    assert (len(server.bodies), summary.done, summary.failed, summary.numbers.blank) == (3, 3, 0, 2)
    assert summary.numbers.pending_at_start == 3 and summary.status is RunStatus.COMPLETED
    assert summary.blank is not None and summary.blank.ids == (1, 3)
    said = [entry["event"] for entry in logs if entry["log_level"] == "warning"]
    assert "2 records have empty title and description: ids 1, 3; they are not sent" in said
    assert table_rows(spec.database, "SELECT blank FROM runs") == [(2,)]
    assert table_rows(spec.database, "SELECT count(*) FROM results WHERE record_id IN (1, 3)") == [(0,)]
    assert table_rows(spec.database, "SELECT count(*) FROM failures") == [(0,)]
    status = job_status(spec)
    assert (status.done, status.pending, status.blank.count, status.blank.ids) == (3, 0, 2, (1, 3))
    checked = ScriptedServer([refuse])  # its model list only: a quiet night checks its servers too
    quiet = await run_served(spec, checked)  # a night with nothing else: nothing sent, the blank said
    assert quiet.status is RunStatus.NOTHING_TO_DO and quiet.numbers.blank == 2 and checked.bodies == []
    assert table_rows(spec.database, "SELECT blank FROM runs WHERE run_id = 2") == [(2,)]
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE postings SET description = 'Now it has text' WHERE id = 3")
    again = await run_served(spec, server)
    assert (len(server.bodies), again.done, again.numbers.blank) == (4, 1, 1)


async def test_nothing_to_do_with_a_model_the_server_does_not_serve_is_the_same_error_as_with_work(
    tmp_path: Path,
) -> None:
    """A nightly job whose model name went wrong said "nothing to do" and exit 0 until records came."""
    spec = make_job(tmp_path, records=2)
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    served_models = "does not serve model 'nosuch/model'; it serves: test-model"
    with pytest.raises(ModelNotServedError, match=f"^--model nosuch/model: .* {served_models}$") as caught:
        await run_served(spec.with_overrides(model="nosuch/model"), ScriptedServer([refuse]))
    assert exit_code_for(caught.value) == EXIT_CONFIG
    assert table_rows(spec.database, "SELECT run_id, status FROM runs") == [(1, "completed")]


async def test_a_night_quiet_because_every_record_left_is_blank_checks_its_servers_too(
    tmp_path: Path,
) -> None:
    """Blank records are no work, but the night is a quiet one all the same: a model the server does not
    serve fails it as it fails a run with records, and keeps no quiet run."""
    spec = make_job(tmp_path, records=3)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE postings SET title = NULL, description = NULL WHERE id = 2")
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    with pytest.raises(ModelNotServedError, match="does not serve model 'nosuch/model'") as caught:
        await run_served(spec.with_overrides(model="nosuch/model"), ScriptedServer([refuse]))
    assert exit_code_for(caught.value) == EXIT_CONFIG
    assert table_rows(spec.database, "SELECT run_id, status, blank FROM runs") == [(1, "completed", 1)]


async def test_nothing_to_do_against_a_server_that_is_down_is_exit_3_and_keeps_no_quiet_run(
    tmp_path: Path,
) -> None:
    """Tomorrow's records would fail the same way: the quiet night says so now."""
    spec = make_job(tmp_path, records=2)
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    url = dead_url()
    with pytest.raises(EndpointUnreachableError, match=f"cannot connect to {url}") as caught:
        await run_job(spec.with_overrides(base_url=url), options())
    assert exit_code_for(caught.value) == EXIT_ABORTED
    assert table_rows(spec.database, "SELECT run_id, status FROM runs") == [(1, "completed")]


async def test_nothing_to_do_with_a_textfile_in_a_missing_folder_is_exit_2_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    spec = make_job(tmp_path, records=2)
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    textfile = tmp_path / "absent" / "pipeline.prom"
    with pytest.raises(ConfigError, match=f"^--metrics-textfile {textfile}: folder"):
        await run_served(spec, ScriptedServer([refuse]), metrics_textfile=textfile)
    assert table_rows(spec.database, "SELECT run_id, status FROM runs") == [(1, "completed")]


async def test_a_run_whose_every_record_failed_keeps_a_profile_for_drift(tmp_path: Path) -> None:
    """A night that finished records, all failed, is judged (its failure rate), not passed over."""
    spec = make_job(tmp_path, records=3)
    summary = await run_served(
        spec, ScriptedServer([error(400, "This model's maximum context length is 10")])
    )
    assert (summary.done, summary.failed) == (0, 3)
    ((profile,),) = table_rows(spec.database, "SELECT profile FROM runs")
    assert orjson.loads(profile)["failures"] == {"too_long": 3}


async def test_fatal_error_mid_run_keeps_finished_results(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=200, concurrency=4)
    server = ScriptedServer([respond(good_completion())] * 50 + [error(401, "bad key")])
    with pytest.raises(FatalRunError, match="refused the request"):
        await run_served(spec, server)
    done = table_rows(spec.database, "SELECT count(*) FROM results")[0][0]
    assert 46 <= done <= 50  # everything answered before the 401 was committed (less what was in flight)
    run = table_rows(spec.database, "SELECT status, done, message FROM runs")
    assert run[0][0] == "aborted" and run[0][1] == done and "refused" in run[0][2]


async def test_a_failed_content_count_aborts_the_run_with_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count of changed records runs beside the stream: its error (DuckDB out of memory under a
    small duckdb_memory_limit) ends the run as aborted, one error, not a group escaping the run."""
    spec = make_job(tmp_path, records=60)
    server = ScriptedServer([respond(good_completion())])
    await run_served(spec, server, limit=20)

    async def out_of_memory(self: SourceReader) -> int:
        raise FatalRunError("cannot read the pending records (Out of Memory Error)")

    monkeypatch.setattr(SourceReader, "count_content", out_of_memory)
    with pytest.raises(FatalRunError, match="Out of Memory"):
        await run_served(spec, server)
    assert table_rows(spec.database, "SELECT status FROM runs ORDER BY run_id") == [
        ("completed",),
        ("aborted",),
    ]
    assert table_rows(spec.database, "SELECT count(*) FROM results")[0][0] >= 20


async def test_server_down_from_the_start_is_fatal_before_any_record(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5)

    url = dead_url()
    with pytest.raises(FatalRunError, match=f"cannot connect to {url}"):
        await run_job(spec.with_overrides(base_url=url), options())
    assert table_rows(spec.database, "SELECT count(*) FROM runs") == [(0,)]


async def test_model_not_served_is_fatal(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5, model="gpt-oss-120b")
    with pytest.raises(
        FatalRunError,
        match="job.yaml: key 'model': .* does not serve model 'gpt-oss-120b'; it serves: test-model",
    ):
        await run_served(spec, ScriptedServer([respond(good_completion())]))


async def test_sigint_stops_cleanly_and_saves_what_finished(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=300, concurrency=8)
    answered = 0

    async def answer(request: httpx2.Request) -> httpx2.Response:
        nonlocal answered
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        answered += 1
        if answered == 40:
            os.kill(os.getpid(), signal.SIGINT)
        await anyio.lowlevel.checkpoint()
        return respond(good_completion())

    summary = await run_served(spec, answer, handle_signals=True)
    assert summary.status is RunStatus.INTERRUPTED and summary.exit_code == 130
    saved = table_rows(spec.database, "SELECT count(*) FROM results")[0][0]
    assert saved == summary.done and 30 <= saved < 300
    assert table_rows(spec.database, "SELECT status FROM runs") == [("interrupted",)]
    resumed = await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert resumed.done == 300 - saved
    assert table_rows(spec.database, "SELECT count(*), count(DISTINCT record_id) FROM results") == [
        (300, 300)
    ]


async def test_progress_reporter_and_snapshot(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    progress = QuietProgress()
    await run_served(spec, ScriptedServer([respond(good_completion())]), progress=progress)
    assert progress.closed_with is not None and progress.closed_with["done"] == 10
    snapshot = orjson.loads(spec.database.with_name(spec.database.name + ".progress.json").read_bytes())
    assert snapshot["status"] == "completed" and snapshot["done"] == 10 and snapshot["run_id"] == 1


async def test_logs_never_contain_record_text_or_the_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_SECRET_KEY", "sk-very-secret")
    spec = make_job(tmp_path, records=0, endpoint={"api_key_env": "TEST_SECRET_KEY"})
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            "CREATE TABLE postings AS SELECT i AS id, 'CONFIDENTIAL-' || i AS title, "
            "'PRIVATE-BODY' AS description FROM range(6) t(i)"
        )

    def echo_record(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        assert request.headers["authorization"] == "Bearer sk-very-secret"
        title = title_of(request)
        if title.endswith(("1", "2")):  # schema-invalid output that quotes the record
            return respond(completion(orjson.dumps({"title": title, "skills": title}).decode()))
        if title.endswith("3"):
            return error(400, "context too long")
        return respond(good_completion())

    with capture_logs() as logs:
        summary = await run_served(spec, echo_record)
    assert summary.failed == 3
    text = orjson.dumps(logs).decode()
    assert "record failed" in text
    assert "CONFIDENTIAL" not in text and "PRIVATE-BODY" not in text and "sk-very-secret" not in text


async def test_duckdb_is_never_called_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    class Guarded:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            attribute = getattr(self._inner, name)
            if not callable(attribute):
                return attribute

            def guarded(*args: Any, **kwargs: Any) -> Any:
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    calls.append(name)
                    result = attribute(*args, **kwargs)
                    return Guarded(result) if name in ("cursor", "execute") else result
                raise AssertionError(f"DuckDB {name}() called on the event loop thread")

            return guarded

    spec = make_job(tmp_path, records=50)
    connect = duckdb.connect  # every connection the boundary makes is guarded, and every call on it
    monkeypatch.setattr(duckdb, "connect", lambda *a, **k: Guarded(connect(*a, **k)))
    summary = await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert summary.done == 50
    assert {"execute", "fetchall", "begin", "commit", "appender", "close"} <= set(calls)


async def test_short_timeout_at_high_concurrency_is_warned(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2, concurrency=256, request_timeout_s=180)
    with capture_logs() as logs:
        await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert any("timeout is short" in entry["event"] for entry in logs)


async def test_result_json_is_the_validated_model(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=1)
    duplicate_skills = {**GOOD_ITEM, "years": None}
    await run_served(spec, ScriptedServer([respond(completion(orjson.dumps(duplicate_skills).decode()))]))
    stored = orjson.loads(table_rows(spec.database, "SELECT extracted FROM results")[0][0])
    assert stored == duplicate_skills


async def test_grounded_values_are_located_and_stored_with_the_result(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0, schema="tests.support.schemas:GroundedItem")
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            "CREATE TABLE postings AS SELECT 1 AS id, 'Analyst' AS title, "
            "'You know  sql and Excel.' AS description"
        )
    server = ScriptedServer([respond(good_completion(skills=["SQL", "Excel", "Python"]))])
    await run_served(spec, server)
    stored = orjson.loads(table_rows(spec.database, "SELECT grounding FROM results")[0][0])
    assert [(item["value"], item["match"], item["source_field"]) for item in stored] == [
        ("SQL", "normalised", "description"),
        ("Excel", "exact", "description"),
        ("Python", "none", None),
    ]
    sql = stored[0]
    assert "You know  sql and Excel."[sql["start"] : sql["end"]] == "sql"
    assert job_status(spec).grounding == {"skills": {"found": 2, "values": 3, "share": 2 / 3}}


async def test_a_run_its_caller_cancels_is_recorded_interrupted_and_keeps_what_it_finished(
    tmp_path: Path,
) -> None:
    """``asyncio.wait_for(run_job(...), timeout)``: the run row said ``running`` (then ``abandoned``)
    and the outcomes not yet committed were dropped."""
    spec = make_job(tmp_path, records=300, concurrency=8)
    enough = asyncio.Event()
    answered = 0

    async def answer(request: httpx2.Request) -> httpx2.Response:
        nonlocal answered
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        if answered == 60:
            enough.set()
            await asyncio.Event().wait()  # the rest hangs: only the caller's timeout ends the run
        answered += 1
        return respond(good_completion())

    async with serving(answer) as server:
        run = asyncio.ensure_future(run_job(served(spec, server), options()))
        await enough.wait()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run, timeout=0.05)
    kept = table_rows(spec.database, "SELECT count(*) FROM results")[0][0]
    assert kept >= 60 - 8  # every answer the client had read when cancelled (8 at most were not)
    assert table_rows(spec.database, "SELECT status, done, message FROM runs") == [
        ("interrupted", kept, CANCELLED)
    ]
    resumed = await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert resumed.done == 300 - kept
    assert table_rows(spec.database, "SELECT count(*), count(DISTINCT record_id) FROM results") == [
        (300, 300)
    ]


async def test_a_server_failing_every_record_is_said_in_the_progress_line(tmp_path: Path) -> None:
    spec = make_job(
        tmp_path, records=40, retry={"transient_retries": 1, "abort_after_consecutive_failures": 5}
    )
    progress = QuietProgress()
    with pytest.raises(FatalRunError, match="5 records in a row failed on the server side"):
        await run_served(spec, ScriptedServer([error(503, "Service Unavailable")]), progress=progress)
    assert progress.closed_with is not None
    said = progress.closed_with["server_failing"]
    assert said.startswith(
        "server failing: 5 of 5 records in a row failed on the server side before the run stops"
    )
    assert "last: " in said and "503" in said


def marginal_records(database: Path) -> None:
    """Records 0 and 1 long (the server counts their prompts at 900 tokens of a context of 1,000: 100
    left for an answer), 2-11 short (300)."""
    with duckdb.connect(str(database)) as connection:
        connection.execute(
            "CREATE TABLE postings AS SELECT i AS id, 'Title ' || i AS title, "
            "CASE WHEN i < 2 THEN 'LONG posting' ELSE 'short posting' END AS description FROM range(12) t(i)"
        )


def counted(messages: list[dict[str, Any]]) -> int:
    return 900 if "LONG" in str(messages[-1]["content"]) else 300


def answered_by_size(request: httpx2.Request) -> httpx2.Response:
    """A short record's answer takes 200 tokens and its number more; a long one's is cut off at the
    budget it was given."""
    number, body = record_number(request), orjson.loads(request.content)
    prompt = counted(body["messages"])  # as the server's reply says it
    if number < 2:
        cut = completion('{"title": "Tit', finish_reason="length", prompt_tokens=prompt)
        return respond({**cut, "usage": {**cut["usage"], "completion_tokens": body["max_tokens"]}})
    answer = orjson.dumps(GOOD_ITEM).decode()
    return respond(completion(answer, completion_tokens=200 + number, prompt_tokens=prompt))


async def test_a_retry_of_failures_starts_from_what_the_earlier_runs_answers_took(tmp_path: Path) -> None:
    """Before, what an answer needs started from nothing each run: a --only-failed run of the two records
    whose prompts leave 100 tokens started from the schema's floor (5 tokens), sent both with a budget
    of 100 and had them cut off, though every answer measured so far took 202 tokens or more."""
    spec = make_job(tmp_path, records=0, max_tokens=4096)
    marginal_records(spec.database)
    server = ScriptedServer([answered_by_size], max_model_len=1000, count_tokens=counted)
    first = await run_served(spec, server)
    assert (first.done, first.failed) == (10, 2)
    sent = len(server.bodies)
    again = await run_served(spec, server, only_failed=True)
    assert (again.done, again.failed) == (0, 2) and len(server.bodies) == sent  # neither was sent
    messages = table_rows(spec.database, "SELECT failure_class, message FROM failures ORDER BY record_id")
    need = (
        "leaves 100 tokens for the answer, and an answer needs 202 tokens (what 99% of the 10 answers "
        "measured took at least, all of them by earlier runs)"
    )
    assert [failure_class for failure_class, _ in messages] == ["too_long", "too_long"]
    assert all(need in message for _, message in messages), messages


async def test_a_run_s_parts_open_as_one_value_with_the_context_it_runs_with(tmp_path: Path) -> None:
    """One value, built once its servers are up and from their context (the one the run runs with),
    no part of it assigned later."""
    spec = make_job(tmp_path, records=3)
    async with serving(ScriptedServer([respond(good_completion())])) as server:
        context = RunContext.of(served(spec, server))
        async with (
            _opened_source(context, options()) as (connection, reader),
            opened_run(context, options(), connection, reader, selected=3) as run,
        ):
            assert [endpoint.config.base_url for endpoint in run.router.endpoints] == [server.url]
            assert run.writer.spec is run.context.spec and run.stats.numbers.pending_at_start == 3
            with pytest.raises(dataclasses.FrozenInstanceError):
                run.stats = run.stats  # type: ignore[misc]  # frozen: the test is that it refuses
