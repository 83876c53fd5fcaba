from __future__ import annotations

from pathlib import Path

import duckdb
import orjson
import pytest

from pipeline.errors import ConfigError
from pipeline.job.commands import Asked, command
from pipeline.job.spec import JobSpec, load_job
from pipeline.reports.status import job_status
from pipeline.run.options import VariantOptions
from pipeline.servers.knee_search import KneeMemory
from pipeline.store.opening import prepare_database, seed_knee
from pipeline.store.read_copy import write_copy
from pipeline.store.snapshot import write_snapshot
from tests.support.cli import cli_run
from tests.support.fakes import GOOD_ITEM, ScriptedServer, completion, good_completion, respond
from tests.support.jobs import make_job, make_source, table_rows, write_job
from tests.support.outputs import database_held_by_another_process, job_with_outputs
from tests.support.runs import run_served

pytestmark = pytest.mark.anyio


async def test_status_counts_failures_by_class_and_pending(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=12, retry={"reasks": 0})
    server = ScriptedServer([respond(good_completion())] * 8 + [respond(completion("nope"))])
    await run_served(spec, server, limit=10)
    report = job_status(spec)
    assert (report.source_records, report.done, report.pending) == (12, 8, 2)
    assert report.failed == {"invalid_json": 2}
    assert report.last_run is not None and report.last_run["status"] == "completed_with_failures"
    assert report.rate_per_min is not None and report.rate_per_min > 0
    assert report.eta_s is not None
    assert report.live is None


async def test_answers_recovered_from_the_reasoning_are_done_and_counted(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=6)
    in_reasoning = completion(None, reasoning=orjson.dumps(GOOD_ITEM).decode())  # vLLM issue 23694
    server = ScriptedServer([respond(in_reasoning)] * 2 + [respond(good_completion())])
    await run_served(spec, server)
    report = job_status(spec)
    assert (report.done, report.failed, report.answers_from_reasoning) == (6, {}, 2)
    assert len(server.bodies) == 6  # none asked again


def test_the_counts_add_up_to_the_source_records_each_record_counted_once(tmp_path: Path) -> None:
    """A transient failure is pending (a plain run retries it), not failed as well; a record whose text
    changed is pending, not done as well; a failure of a record no longer in the source is in no count.
    Before, 5 done + 7 failed + 6 pending were reported of 14 records."""
    spec = job_with_outputs(tmp_path)  # 0, 8-11 done; 1-3 invalid_json, 4 truncated, 5-6 schema, 7 400
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE failures SET failure_class = 'transient' WHERE record_id = 1")
        connection.execute("UPDATE postings SET description = 'edited' WHERE id IN (0, 2)")
        connection.execute("DELETE FROM postings WHERE id = 6")
        connection.execute(  # a redo of 8 that failed: its older result is kept
            "INSERT INTO failures SELECT * REPLACE (8 AS record_id, (SELECT content_hash FROM results "
            "WHERE record_id = 8) AS content_hash) FROM failures WHERE record_id = 5"
        )
        connection.execute("INSERT INTO postings SELECT i, 'Title ' || i, 'new' FROM range(12, 15) t(i)")
    report = job_status(spec)
    assert report.source_records == 14
    assert report.done == 4 and report.redo_failed == 1  # 8, 9, 10, 11
    assert report.failed == {"invalid_json": 1, "permanent": 1, "schema_invalid": 1, "truncated": 1}
    assert report.pending == 6 and report.content_changed == 2  # 0 and 2
    assert report.pending_new == 3 and report.pending_retried == {"transient": 1}
    assert report.done + sum(report.failed.values()) + report.pending == report.source_records
    failures = Asked(spec.source_file).command("failures")  # pasted as it is, it says why
    assert f"done:     4 (1 of them kept after a redo failed: `{failures}` says why)\n" in (
        cli_run("status", str(spec.source_file)).stdout
    )


def test_status_before_any_run(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5)
    report = job_status(spec)
    assert (report.source_records, report.done, report.pending, report.last_run) == (5, 0, 5, None)


def test_blank_records_before_any_run_are_blank_not_pending(tmp_path: Path) -> None:
    """Found by the state machine: before the first run, status counted every record pending, blank
    ones too, while load had just said they would not be sent."""
    spec = make_job(tmp_path, records=5)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE postings SET title = NULL, description = ' ' WHERE id IN (1, 3)")
    report = job_status(spec)
    assert (report.source_records, report.pending, report.pending_new) == (5, 3, 3)
    assert (report.blank.count, report.blank.ids) == (2, (1, 3))


async def test_the_json_has_the_same_stale_keys_before_a_run_and_after(tmp_path: Path) -> None:
    """Found by the property tests: before any result was stored, --json said "stale": {}, and after
    a run {"total": 0, "prompt": 0, ...}; a script reading ["stale"]["total"] failed on a new job."""
    spec = make_job(tmp_path, records=2)
    before = orjson.loads(cli_run("status", str(spec.source_file), "--json").stdout)["stale"]
    await run_served(spec, ScriptedServer([respond(good_completion())] * 2))
    after = orjson.loads(cli_run("status", str(spec.source_file), "--json").stdout)["stale"]
    assert before == dict.fromkeys(after, 0) and "total" in after


def test_status_without_a_database(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    with pytest.raises(ConfigError, match="does not exist yet"):
        job_status(spec)


async def test_a_killed_run_shows_as_abandoned(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    await run_served(spec, ScriptedServer([respond(good_completion())]), limit=1)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE runs SET status = 'running'")  # what kill -9 leaves behind
    report = job_status(spec)
    assert report.last_run is not None and report.last_run["status"] == "abandoned"


def test_a_missing_source_table_is_said_and_what_is_stored_still_shown(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("DROP TABLE postings")
    report = job_status(spec)
    assert report.source_problem is not None
    assert f"source in {spec.database}: table 'postings' does not exist (key source.table)" in (
        report.source_problem
    )
    assert f"`{command('load', 'FILE', '--job', str(spec.source_file))}`" in report.source_problem
    assert (report.source_records, report.done, report.pending) == (None, None, None)
    assert report.results == 5 and sum(report.failed.values()) == 7
    assert report.last_run is not None and report.last_run["done"] == 5
    assert report.eta_s is None


def test_a_missing_seeded_table_says_a_run_loads_it(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0, source={"seed_file": "seed.jsonl"})
    duckdb.connect(str(spec.database)).close()
    report = job_status(spec)
    assert report.source_problem is not None
    run = command("run", str(spec.source_file))
    assert f"`{run}` loads key source.seed_file, {tmp_path / 'seed.jsonl'}" in report.source_problem
    assert (report.results, report.failed, report.last_run) == (0, {}, None)


def test_a_failing_source_query_names_the_key(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3, source={"table": None, "query": "SELECT * FROM nothere"})
    report = job_status(spec)
    assert report.source_problem is not None
    assert "key source.query fails: Catalog Error: Table with name nothere does not exist" in (
        report.source_problem
    )


def add_records(spec: JobSpec, count: int) -> None:
    """``count`` new records after the 12 of :func:`job_with_outputs`: pending."""
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(
            f"INSERT INTO postings SELECT i, 'Title ' || i, 'new' FROM range(12, {12 + count}) t(i)"
        )


def test_a_run_the_server_ended_gives_no_eta_and_nothing_pending_none(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    add_records(spec, 8)
    assert job_status(spec).eta_s is not None
    for ended in ("aborted", "stalled"):  # its rate says nothing of how fast the next run goes
        with duckdb.connect(str(spec.database)) as connection:
            connection.execute("UPDATE runs SET status = ?", [ended])
        report = job_status(spec)
        assert report.rate_per_min is not None and report.eta_s is None
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE runs SET status = 'completed'")
        connection.execute("DELETE FROM postings WHERE id >= 12")  # nothing pending: no ETA
    assert job_status(spec).pending == 0 and job_status(spec).eta_s is None


def test_the_last_runs_json_columns_are_values_not_text(tmp_path: Path) -> None:
    spec = job_with_outputs(tmp_path)
    run = job_status(spec).last_run
    assert run is not None
    assert isinstance(run["profile"], dict) and run["profile"]["records"] == 5
    assert isinstance(run["series"], list) and run["series"][-1]["done"] == 5
    assert run["knees"] is None


@pytest.mark.process
def test_during_a_run_every_count_is_the_copys_and_the_live_numbers_only_rates(tmp_path: Path) -> None:
    """One consistent set: the copy's counts, as of when it was taken; of the run's progress snapshot
    only what the copy cannot have (in flight, rates, ETA), as of its own time. Before, the snapshot's
    done (a later moment) stood beside the copy's."""
    spec = job_with_outputs(tmp_path)
    add_records(spec, 8)
    connection = prepare_database(spec)
    try:
        connection.execute("UPDATE runs SET status = 'running', ended_at = NULL")  # run 1 goes on
        write_copy(connection, spec, 1)
    finally:
        connection.close()
    live = {"done": 11, "failed": 8, "in_flight": 4, "remaining": 1, "records_per_min": 60.0, "eta_s": 1}
    write_snapshot(spec.database, 1, live, "running")
    with database_held_by_another_process(spec.database, as_run=True):
        report = job_status(spec)
    assert report.read_copy is not None and report.last_run is not None
    assert (report.done, sum(report.failed.values()), report.pending) == (5, 7, 8)
    assert (report.last_run["status"], report.last_run["done"]) == ("running", 5)
    assert report.live is not None
    assert not {"done", "failed", "remaining"} & set(report.live)
    assert report.live["in_flight"] == 4 and report.live["as_of"]
    assert report.eta_s == 1  # the run's own, from its live rate


async def test_records_whose_text_changed_are_pending_not_stale_too(tmp_path: Path) -> None:
    """One story: a plain run redoes an edited record, so it is pending (changed content), and no stale
    count of a result a plain run keeps holds it too. Before, both said 2 of the same 2 records."""
    spec = make_job(tmp_path, records=6)
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE postings SET description = 'edited' WHERE id IN (0, 1)")
    report = job_status(spec)
    assert (report.pending, report.content_changed, report.stale["total"]) == (2, 2, 0)
    assert "content" not in report.stale
    edited = write_job(tmp_path, prompt={"system": "Extract the posting, carefully."})  # the prompt too
    report = job_status(load_job(edited))
    assert (report.pending, report.content_changed) == (2, 2)
    assert report.stale["total"] == report.stale["prompt"] == 4  # the 4 a plain run keeps
    text = cli_run("status", str(edited)).stdout
    assert "pending:  2 (2 with changed content)\n" in text
    assert "stale:    4 (prompt 4; a plain run keeps them, `" in text
    assert " --redo-stale` redoes them and takes the 2 pending too)" in text


async def test_a_last_run_the_server_ended_says_why_and_an_abandoned_one_what_it_means(
    tmp_path: Path,
) -> None:
    spec = make_job(tmp_path, records=3)
    await run_served(spec, ScriptedServer([respond(good_completion())]), limit=1)
    why = "the server stayed unreachable for 300 s: http://gpu:8000/v1"
    for ended in ("aborted", "stalled"):
        with duckdb.connect(str(spec.database)) as connection:
            connection.execute("UPDATE runs SET status = ?, message = ?", [ended, why])
        lines = cli_run("status", str(spec.source_file)).stdout.splitlines()
        assert lines[-2].startswith(f"last run: #1 {ended}, started ") and lines[-1] == f"why:      {why}"
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE runs SET status = 'running', message = NULL")  # what kill -9 leaves
    last = cli_run("status", str(spec.source_file)).stdout.splitlines()[-1]
    assert last.startswith("why:      it ended without a word (killed, or the machine stopped)")
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("UPDATE runs SET status = 'completed'")
    assert "why:" not in cli_run("status", str(spec.source_file)).stdout


async def test_a_variant_made_with_a_prompt_file_is_judged_with_it(tmp_path: Path) -> None:
    """Before, `status --variant v2` judged v2's results with the job's prompt: all stale for the
    prompt, and its --redo-stale hint would have redone them with the job's prompt."""
    spec = make_job(tmp_path, records=5)
    prompt = tmp_path / "v2 prompt.yaml"
    prompt.write_text("system: Extract the posting, carefully.\n")
    made = VariantOptions(prompt_file=prompt)
    v2 = spec.for_variant("v2")
    await run_served(
        made.applied(v2), ScriptedServer([respond(good_completion())]), variant_options=made.words()
    )
    result = cli_run("status", str(spec.source_file), "--variant", "v2")
    assert result.exit_code == 0 and "stale" not in result.stdout and "done:     5" in result.stdout
    assert result.stderr == (
        "note: variant v2 is judged with the options it was made with, kept with its last run: "
        f"--prompt-file '{prompt}' (give --model, --prompt-file or --local for others)\n"
    )
    judged = orjson.loads(cli_run("status", str(spec.source_file), "--variant", "v2", "--json").stdout)
    assert judged["judged_with"] == ["--prompt-file", str(prompt)] and judged["stale"]["total"] == 0
    other = tmp_path / "other.txt"
    other.write_text("Another prompt.")
    given = cli_run("status", str(spec.source_file), "--variant", "v2", "--prompt-file", str(other))
    assert given.stderr == "" and "stale:    5 (prompt 5; a plain run keeps them, `" in given.stdout
    assert f"--redo-stale --prompt-file {other} --variant v2` redoes them)" in given.stdout


async def test_a_quiet_night_after_the_last_run_is_said_with_its_date_and_goes_with_the_next_run(
    tmp_path: Path,
) -> None:
    """The last run passes over quiet nights (their rate says nothing of the next run), so status said
    nothing of them: a nightly run that ran and found nothing looked like one that never ran."""
    spec = make_job(tmp_path, records=3)
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert job_status(spec).quiet_run is None  # the newest run did something
    await run_served(spec, ScriptedServer([]))  # a quiet night: nothing is sent
    report = job_status(spec)
    assert report.last_run is not None and report.last_run["run_id"] == 1
    assert report.quiet_run is not None and report.quiet_run["run_id"] == 2
    (started,) = table_rows(spec.database, "SELECT started_at FROM runs WHERE run_id = 2")[0]
    text = cli_run("status", str(spec.source_file)).stdout.splitlines()
    last = next(index for index, line in enumerate(text) if line.startswith("last run: #1 completed"))
    assert text[last + 1] == f"quiet:    run 2 ({started:%Y-%m-%d %H:%M} UTC) had nothing to do"
    data = orjson.loads(cli_run("status", str(spec.source_file), "--json").stdout)
    assert data["quiet_run"] == {"run_id": 2, "started_at": started.isoformat()}
    assert data["last_run"]["run_id"] == 1
    make_source(spec.database, 5)  # two new records: the next night does something, and is the last run
    await run_served(spec, ScriptedServer([respond(good_completion())]))
    after = job_status(spec)
    assert after.quiet_run is None and after.last_run is not None and after.last_run["run_id"] == 3
    assert "quiet:" not in cli_run("status", str(spec.source_file)).stdout


async def test_quiet_nights_alone_are_said_without_a_last_run(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    make_source(spec.database, 0)  # an empty source: every night so far had nothing to do
    for _ in range(2):
        await run_served(spec, ScriptedServer([]))
    report = job_status(spec)
    assert report.last_run is None and report.quiet_run is not None and report.quiet_run["run_id"] == 2
    lines = cli_run("status", str(spec.source_file)).stdout.splitlines()
    assert lines[-1].startswith("quiet:    run 2 (") and lines[-1].endswith(" UTC) had nothing to do")


async def test_a_bench_sweep_kept_after_the_last_run_is_not_the_last_run_and_the_eta_stays(
    tmp_path: Path,
) -> None:
    """`pipeline bench --seed-knee` keeps its knee as a runs row of status 'bench'; status took it for
    the last run (0 done, no rate), and lost the ETA of the records still pending."""
    spec = make_job(tmp_path, records=5)
    await run_served(spec, ScriptedServer([respond(good_completion())]), limit=3)
    before = job_status(spec)
    knee = KneeMemory(8, bracketed=True)
    assert seed_knee(spec, spec.endpoint_configs()[0], knee, "pipeline bench: c=8") == 2
    report = job_status(spec)
    assert report.last_run is not None and report.last_run["run_id"] == 1
    assert report.eta_s is not None and report.eta_s == before.eta_s
    assert report.rate_per_min == before.rate_per_min and report.quiet_run is None
    assert "last run: #1 completed" in cli_run("status", str(spec.source_file)).stdout
