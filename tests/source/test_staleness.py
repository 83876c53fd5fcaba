"""Results over months: a prompt edit makes results stale without redoing them; --redo-stale redoes
them and keeps every old one in the history; edited source rows are redone by a plain run; settings
that do not shape the answer change nothing; --only-failed; a truncated record starts bigger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from structlog.testing import capture_logs

from pipeline.errors import FailureClass
from pipeline.job.commands import command
from pipeline.job.spec import JobSpec, load_job
from pipeline.reports.status import job_status
from pipeline.run.runner import RunStatus, RunSummary, run_job
from pipeline.source.versions import JOB_CAUSES, StaleCause
from tests.support.fakes import ScriptedServer, completion, good_completion, respond, serving
from tests.support.jobs import make_job, table_rows, write_job
from tests.support.runs import options, run_served

pytestmark = pytest.mark.anyio


def record_number(body: dict[str, Any]) -> int:
    """The record a request was about: its user message starts ``Title: Title N``."""
    return int(str(body["messages"][-1]["content"]).split("\n")[0].rsplit(" ", 1)[1])


async def run(spec: JobSpec, server: ScriptedServer, **options: Any) -> RunSummary:
    return await run_served(spec, server, **options)


def good_server() -> ScriptedServer:
    return ScriptedServer([respond(good_completion())])


def edited(tmp_path: Path, **overrides: Any) -> JobSpec:
    """The same job file, rewritten with ``overrides`` (the database stays)."""
    return load_job(write_job(tmp_path, **overrides))


async def test_prompt_edit_makes_all_stale_a_plain_run_keeps_them_redo_stale_redoes_them(
    tmp_path: Path,
) -> None:
    spec = make_job(tmp_path, records=8)
    await run(spec, good_server())
    old = dict(table_rows(spec.database, "SELECT record_id, created_at FROM results"))
    new_prompt = edited(tmp_path, prompt={"system": "Extract the posting, carefully."})

    report = job_status(new_prompt)
    assert report.stale == {
        "total": 8, "prompt": 8, "schema": 0, "model": 0, "settings": 0, "unknown": 0,
    }  # fmt: skip
    server = good_server()
    with capture_logs() as logs:
        summary = await run(new_prompt, server)
    assert summary.status is RunStatus.NOTHING_TO_DO and server.bodies == []
    assert summary.stale_kept == {"total": 8, "prompt": 8}
    (said,) = [entry for entry in logs if entry["event"].startswith("results are stale")]
    redo = command("run", str(spec.source_file), "--redo-stale")  # the job as given, not a JOB to fill in
    assert said["event"].endswith(f"a plain run keeps them, `{redo}` redoes them") and said["prompt"] == 8

    server = good_server()
    summary = await run(new_prompt, server, redo_stale=frozenset(JOB_CAUSES))
    assert (summary.done, len(server.bodies)) == (8, 8)
    assert server.bodies[0]["messages"][0]["content"].startswith("Extract the posting, carefully.")
    assert summary.stale_kept == {}
    history = table_rows(
        spec.database,
        "SELECT record_id, created_at, run_id, superseded_by_run FROM results_history ORDER BY record_id",
    )
    assert [(row[0], row[1], row[2], row[3]) for row in history] == [
        (record_id, old[record_id], 1, 3)
        for record_id in sorted(old)  # run 2 had nothing to do
    ]
    assert job_status(new_prompt).stale["total"] == 0
    assert await run(new_prompt, good_server(), redo_stale=frozenset(JOB_CAUSES)) is not None
    assert len(table_rows(spec.database, "SELECT * FROM results_history")) == 8  # nothing redone twice


async def test_edited_source_rows_are_redone_by_a_plain_run_exactly(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=1000, concurrency=32)
    await run(spec, good_server())
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            "UPDATE postings SET description = description || ' Now hybrid.' WHERE id % 100 = 7"
        )
    edited = job_status(spec)  # pending for their changed content, and no stale count holds them too
    assert (edited.content_changed, edited.pending, edited.stale["total"]) == (10, 10, 0)
    server = good_server()
    summary = await run(spec, server)
    assert (summary.done, summary.pending_at_start, len(server.bodies)) == (10, 10, 10)
    sent = sorted(record_number(body) for body in server.bodies)
    assert sent == list(range(7, 1000, 100))
    assert "Now hybrid." in server.bodies[0]["messages"][1]["content"]
    history = table_rows(spec.database, "SELECT count(*) FROM results_history")
    assert history == [(10,)]
    assert job_status(spec).stale["total"] == 0


@pytest.mark.parametrize(
    "overrides",
    [
        {"concurrency": 3},
        {"request_timeout_s": 7},
        {"retry": {"reasks": 0, "transient_retries": 1}},
        {"operations": {"stall_warning_s": 30}},
    ],
)
async def test_settings_that_do_not_matter_make_nothing_stale(tmp_path: Path, overrides: Any) -> None:
    spec = make_job(tmp_path, records=5)
    await run(spec, good_server())
    changed = edited(tmp_path, **overrides)
    assert job_status(changed).stale["total"] == 0
    server = good_server()
    summary = await run(changed, server, redo_stale=frozenset(JOB_CAUSES))
    assert (summary.status, server.bodies) == (RunStatus.NOTHING_TO_DO, [])


async def test_redo_stale_can_be_limited_to_causes(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=4)
    await run(spec, good_server())
    both = edited(tmp_path, prompt={"system": "Other."}, max_tokens=300)
    assert job_status(both).stale == {
        "total": 4, "prompt": 4, "schema": 0, "model": 0, "settings": 4, "unknown": 0,
    }  # fmt: skip
    server = good_server()
    summary = await run(both, server, redo_stale=frozenset({StaleCause.SCHEMA}))
    assert (summary.status, server.bodies) == (RunStatus.NOTHING_TO_DO, [])
    summary = await run(both, server, redo_stale=frozenset({StaleCause.SETTINGS}))
    assert summary.done == 4


async def test_an_endpoint_serving_its_own_model_makes_current_results(tmp_path: Path) -> None:
    server = ScriptedServer([respond(good_completion())], models=("test-model", "own-model"))
    async with serving(server) as loopback:
        endpoint = {"endpoint": {"base_url": None}}
        spec = make_job(
            tmp_path, records=6, **endpoint, endpoints=[{"base_url": loopback.url, "model": "own-model"}]
        )
        summary = await run_job(spec, options())
        assert summary.done == 6
        assert table_rows(spec.database, "SELECT DISTINCT model FROM results") == [("own-model",)]
        assert job_status(spec).stale["total"] == 0
        again = await run_job(spec, options(redo_stale=frozenset(JOB_CAUSES)))
        assert (again.status, again.stale_kept, len(server.bodies)) == (RunStatus.NOTHING_TO_DO, {}, 6)
        other = edited(tmp_path, **endpoint, endpoints=[{"base_url": loopback.url, "model": "test-model"}])
    report = job_status(other)
    assert (report.stale["total"], report.stale["model"], report.stale_models) == (6, 6, {"own-model": 6})


async def test_tokens_of_every_attempt_are_counted(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2, concurrency=1)
    # record 0: invalid JSON, then a good answer (a re-ask); record 1: invalid three times -> failure
    answers = [
        completion("nope"),
        good_completion(),
        completion("nope"),
        completion("nope"),
        completion("no"),
    ]
    server = ScriptedServer([respond(answer) for answer in answers])
    await run(spec, server)
    runs = table_rows(
        spec.database, "SELECT attempts, prompt_tokens, completion_tokens, reasoning_tokens FROM runs"
    )
    assert runs == [(5, 500, 200, 50)]  # the fake server: 100 prompt, 40 completion, 10 reasoning each
    results = table_rows(
        spec.database,
        "SELECT attempts, prompt_tokens, total_prompt_tokens, total_completion_tokens, "
        "total_reasoning_tokens, total_latency_s >= latency_s FROM results",
    )
    assert results == [(2, 100, 200, 80, 20, True)]
    failures = table_rows(
        spec.database, "SELECT attempts, prompt_tokens, completion_tokens, reasoning_tokens FROM failures"
    )
    assert failures == [(3, 300, 120, 30)]
    tokens = job_status(spec).tokens_per_done
    assert tokens == {"prompt": 500.0, "completion": 200.0, "reasoning": 50.0}  # one record done


async def test_only_failed_retries_failures_and_takes_nothing_new(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=6, retry={"reasks": 0})
    bad = ScriptedServer([respond(completion("nope"))])
    await run(spec, bad, limit=2)  # two invalid_json failures, four records never tried
    server = good_server()
    summary = await run(spec, server, only_failed=True)
    assert (summary.done, len(server.bodies)) == (2, 2)
    assert job_status(spec).pending == 4
    assert job_status(spec).failed == {}


async def test_only_failed_with_a_class(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=4, retry={"reasks": 0, "truncation_retries": 0})
    answers = [completion("nope"), completion('{"title": "Da', finish_reason="length")]
    await run(spec, ScriptedServer([respond(answer) for answer in answers]), limit=2)
    assert job_status(spec).failed == {"invalid_json": 1, "truncated": 1}
    server = good_server()
    summary = await run(spec, server, only_failed=True, retry_classes=frozenset({FailureClass.TRUNCATED}))
    assert (summary.done, len(server.bodies)) == (1, 1)
    assert job_status(spec).failed == {"invalid_json": 1}


async def test_a_truncated_record_retried_later_starts_from_the_failed_budget_grown_once(
    tmp_path: Path,
) -> None:
    spec = make_job(
        tmp_path, records=1, max_tokens=100, retry={"truncation_retries": 1, "max_tokens_ceiling": 10000}
    )
    truncated = respond(completion('{"title": "Da', finish_reason="length"))
    first = ScriptedServer([truncated])
    await run(spec, first)
    assert [body["max_tokens"] for body in first.bodies] == [100, 200]
    assert table_rows(spec.database, "SELECT failure_class, last_max_tokens FROM failures") == [
        ("truncated", 200)
    ]
    later = good_server()
    await run(spec, later, retry_failed=True)
    assert [body["max_tokens"] for body in later.bodies] == [400]
    assert table_rows(spec.database, "SELECT max_tokens FROM results") == [(400,)]


async def test_a_sample_run_takes_the_same_records_for_every_variant(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=100)
    server = good_server()
    summary = await run(spec, server, sample=10, seed=3)
    assert summary.done == 10
    other = spec.model_copy(update={"variant": "b"})
    again = good_server()
    await run(other, again, sample=10, seed=3)
    assert sorted(map(record_number, server.bodies)) == sorted(map(record_number, again.bodies))
