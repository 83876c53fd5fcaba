"""What a run takes: new records, retried failures, changed content, stale results on request, a
seeded sample, a limit over both phases; never a blank record (every prompt field empty). Rows are
written by the real store writer and the source is edited with SQL, as a newer export would."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import duckdb
import orjson
import pytest

from pipeline.errors import FailureClass
from pipeline.extraction.context import RunContext
from pipeline.extraction.outcomes import Extracted, Failed, Outcome, Usage
from pipeline.job.spec import JobSpec
from pipeline.servers.replies import Reply
from pipeline.source.blank import BlankRecords
from pipeline.source.db import bind, open_database
from pipeline.source.pending import PendingQueries, Selection, read_blank, sampled_fields
from pipeline.source.reader import SourceReader, SourceRecord, longest_pending
from pipeline.source.versions import JOB_CAUSES, StaleCause, version_of
from pipeline.store.opening import prepare_database
from pipeline.store.writer import StoreWriter
from tests.support.jobs import make_job, table_rows
from tests.support.runs import WriterRun

pytestmark = pytest.mark.anyio

REPLY = Reply("{}", None, "stop", 10, 5, 1, 0.1)


async def fetch(spec: JobSpec, ids: Sequence[int]) -> dict[int, SourceRecord]:
    """The records as a run would fetch them (with their content hash)."""
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    queries = PendingQueries(spec, version_of(spec))
    sql = queries.records_sql()
    rows = connection.execute(sql, bind(sql, {**queries.parameters(), "ids": list(ids)})).fetchall()
    connection.close()
    names = spec.source.fields
    return {row[0]: SourceRecord(row[0], dict(zip(names, row[1:3], strict=True)), *row[3:]) for row in rows}


async def write(spec: JobSpec, make: Any, ids: Sequence[int]) -> None:
    """Outcomes made by ``spec`` for ``ids`` (``make(record) -> Outcome``), through the real writer."""
    records = await fetch(spec, ids)
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    run = WriterRun(StoreWriter(connection, RunContext.of(spec)), pending=len(ids))
    await run.begin("http://x/v1", concurrency=1)
    await run.write([make(records[record_id]) for record_id in ids])
    connection.close()


def done(record: SourceRecord) -> Outcome:
    return Extracted(
        record.id, orjson.dumps({"n": record.id}).decode(), 1, REPLY, Usage(), 256, record.content_hash
    )


def failing(failure_class: FailureClass, max_tokens: int = 256) -> Any:
    def make(record: SourceRecord) -> Outcome:
        return Failed(record.id, failure_class, "x", 1, None, Usage(), max_tokens, record.content_hash)

    return make


async def pending(spec: JobSpec, selection: Selection | None = None) -> tuple[list[Any], int]:
    """The ids a run would take, in order, and the count it would report."""
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    reader = await SourceReader.open(
        connection, PendingQueries(spec, version_of(spec), selection or Selection())
    )
    count = await reader.count_metadata() + await reader.count_content()
    send, receive = anyio.create_memory_object_stream[SourceRecord](4)
    ids: list[Any] = []
    async with anyio.create_task_group() as group:
        group.start_soon(reader.stream_pending, send)
        async with receive:
            ids.extend([record.id async for record in receive])
    await reader.aclose()
    connection.close()
    return ids, count


def edit(spec: JobSpec, sql: str) -> None:
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(sql)


def with_prompt(spec: JobSpec, **changes: Any) -> JobSpec:
    return spec.model_copy(update={"prompt": spec.prompt.model_copy(update=changes)})


async def test_new_records_and_retried_failures(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    await write(spec, done, [0, 1])
    await write(spec, failing(FailureClass.SCHEMA_INVALID), [2])
    await write(spec, failing(FailureClass.TRANSIENT), [3])
    await write(spec, failing(FailureClass.PERMANENT), [4])
    ids, count = await pending(spec)
    assert (sorted(ids), count) == ([3, 5, 6, 7, 8, 9], 6)
    retry_all = Selection(retry=frozenset(FailureClass))
    assert sorted((await pending(spec, retry_all))[0]) == [2, 3, 4, 5, 6, 7, 8, 9]
    schema_only = Selection(retry=frozenset({FailureClass.TRANSIENT, FailureClass.SCHEMA_INVALID}))
    assert sorted((await pending(spec, schema_only))[0]) == [2, 3, 5, 6, 7, 8, 9]


async def test_only_failed_takes_no_new_records(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    await write(spec, failing(FailureClass.SCHEMA_INVALID), [2])
    await write(spec, failing(FailureClass.TRUNCATED), [3])
    await write(spec, failing(FailureClass.TRANSIENT), [4])
    every = Selection(retry=frozenset(FailureClass), only_failed=True)
    assert sorted((await pending(spec, every))[0]) == [2, 3, 4]
    truncated = Selection(retry=frozenset({FailureClass.TRUNCATED}), only_failed=True)
    assert await pending(spec, truncated) == ([3], 1)


async def test_changed_content_is_redone_and_nothing_else(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=20)
    await write(spec, done, list(range(20)))
    assert await pending(spec) == ([], 0)
    edit(spec, "UPDATE postings SET description = description || ' (edited)' WHERE id IN (3, 7, 11)")
    edit(spec, "UPDATE postings SET title = title WHERE id = 12")  # written again, the same text
    ids, count = await pending(spec)
    assert (sorted(ids), count) == ([3, 7, 11], 3)


async def test_a_failure_whose_content_changed_is_retried(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5)
    await write(spec, failing(FailureClass.PERMANENT), [1, 2])
    edit(spec, "UPDATE postings SET description = 'shorter' WHERE id = 2")
    ids, _ = await pending(spec)
    assert sorted(ids) == [0, 2, 3, 4]


async def test_a_field_the_prompt_does_not_use_is_not_content(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=5, prompt={"user": "{title}"})
    await write(spec, done, list(range(5)))
    edit(spec, "UPDATE postings SET description = 'new text' WHERE id = 1")
    assert await pending(spec) == ([], 0)
    edit(spec, "UPDATE postings SET title = 'new title' WHERE id = 1")
    assert await pending(spec) == ([1], 1)


async def test_a_prompt_edit_is_stale_but_only_redone_on_request(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=6)
    await write(spec, done, list(range(6)))
    edited = with_prompt(spec, system="A better system prompt.")
    assert await pending(edited) == ([], 0)
    ids, count = await pending(edited, Selection(redo=frozenset(JOB_CAUSES)))
    assert (sorted(ids), count) == (list(range(6)), 6)
    assert await pending(edited, Selection(redo=frozenset({StaleCause.SCHEMA}))) == ([], 0)
    assert sorted((await pending(edited, Selection(redo=frozenset({StaleCause.PROMPT}))))[0]) == list(
        range(6)
    )


async def test_the_template_reading_other_fields_is_a_prompt_change_not_content(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=4)
    await write(spec, done, list(range(4)))
    edited = with_prompt(spec, user="Only the title: {title}")
    assert await pending(edited) == ([], 0)
    assert len((await pending(edited, Selection(redo=frozenset({StaleCause.PROMPT}))))[0]) == 4


async def test_model_and_settings_are_their_own_causes(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    await write(spec, done, [0, 1, 2])
    other_model = spec.model_copy(update={"model": "bigger-model"})
    assert await pending(other_model, Selection(redo=frozenset({StaleCause.SETTINGS}))) == ([], 0)
    assert len((await pending(other_model, Selection(redo=frozenset({StaleCause.MODEL}))))[0]) == 3
    hotter = spec.model_copy(update={"temperature": 0.9})
    assert len((await pending(hotter, Selection(redo=frozenset({StaleCause.SETTINGS}))))[0]) == 3


async def test_a_record_that_failed_under_todays_job_is_not_redone_again(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    await write(spec, done, [0, 1, 2])
    edited = with_prompt(spec, system="Edited.")
    await write(edited, failing(FailureClass.SCHEMA_INVALID), [1])  # the redo of 1 failed
    redo = Selection(redo=frozenset(JOB_CAUSES))
    assert sorted((await pending(edited, redo))[0]) == [0, 2]
    retry = Selection(redo=frozenset(JOB_CAUSES), retry=frozenset(FailureClass))
    assert sorted((await pending(edited, retry))[0]) == [0, 1, 2]


async def test_results_without_a_version_key_are_unknown(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    await write(spec, done, [0, 1, 2])
    edit(spec, "UPDATE results SET content_hash = NULL WHERE record_id = 1")
    edit(spec, "UPDATE postings SET description = 'edited' WHERE id = 1")  # unknowable: not content
    assert await pending(spec) == ([], 0)
    assert await pending(spec, Selection(redo=frozenset({StaleCause.PROMPT}))) == ([], 0)
    assert await pending(spec, Selection(redo=frozenset({StaleCause.UNKNOWN}))) == ([1], 1)


async def test_the_limit_holds_over_both_phases_new_records_first(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    await write(spec, done, list(range(6)))
    edit(spec, "UPDATE postings SET title = 'changed' WHERE id IN (0, 1, 2)")
    ids, count = await pending(spec)
    assert (ids[:4], sorted(ids[4:]), count) == ([6, 7, 8, 9], [0, 1, 2], 7)
    ids, _ = await pending(spec, Selection(limit=5))
    assert ids[:4] == [6, 7, 8, 9] and len(ids) == 5 and ids[4] in (0, 1, 2)
    assert len((await pending(spec, Selection(limit=3)))[0]) == 3


async def test_a_limited_retry_takes_the_failures_first_then_new_then_stale(tmp_path: Path) -> None:
    """`--retry-failed --limit N` is for the failures: with 1,000 new records beside them, a LIMIT
    without an order took whichever rows the scan met first (the new ones, in source order)."""
    spec = make_job(tmp_path, records=1000)
    await write(spec, done, [0, 1, 2])
    await write(spec, failing(FailureClass.SCHEMA_INVALID), [997, 998])
    await write(spec, failing(FailureClass.TRANSIENT), [999])

    async def taken(spec: JobSpec, selection: Selection) -> list[Any]:
        return sorted((await pending(spec, selection))[0])  # a batch is fetched in the source's order

    assert await taken(spec, Selection(retry=frozenset(FailureClass), limit=3)) == [997, 998, 999]
    assert await taken(spec, Selection(retry=frozenset(FailureClass), limit=4)) == [3, 997, 998, 999]
    assert await taken(spec, Selection(limit=2)) == [3, 999]  # a plain run: the transient failure first
    edited = with_prompt(spec, system="Edited.")
    redo = Selection(retry=frozenset(FailureClass), redo=frozenset(JOB_CAUSES), limit=5)
    assert await taken(edited, redo) == [3, 4, 997, 998, 999]  # new records before stale redos


async def test_a_sample_is_the_same_records_for_every_variant_and_seed(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=200)
    first, count = await pending(spec, Selection(sample=20, seed=7))
    assert count == 20 and len(set(first)) == 20
    other_variant = spec.model_copy(update={"variant": "b"})
    assert sorted((await pending(other_variant, Selection(sample=20, seed=7)))[0]) == sorted(first)
    assert sorted((await pending(spec, Selection(sample=20, seed=8)))[0]) != sorted(first)
    await write(spec, done, sorted(first)[:15])  # a killed sample run resumes inside the same sample
    rest, _ = await pending(spec, Selection(sample=20, seed=7))
    assert sorted(rest) == sorted(first)[15:]


async def test_variants_do_not_see_each_others_results(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=4)
    await write(spec, done, [0, 1, 2, 3])
    other = spec.model_copy(update={"variant": "b"})
    assert sorted((await pending(other))[0]) == [0, 1, 2, 3]
    await write(other, done, [0])
    assert sorted((await pending(other))[0]) == [1, 2, 3]


async def test_records_carry_their_content_hash_and_a_truncated_budget(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    await write(spec, failing(FailureClass.TRUNCATED, max_tokens=1024), [1])
    await write(spec, failing(FailureClass.SCHEMA_INVALID, max_tokens=2048), [2])
    records = await fetch(spec, [0, 1, 2])
    assert records[1].truncated_at_max_tokens == 1024
    assert records[0].truncated_at_max_tokens is None and records[2].truncated_at_max_tokens is None
    assert len({record.content_hash for record in records.values()}) == 3
    edit(spec, "UPDATE postings SET description = 'x' WHERE id = 0")
    assert (await fetch(spec, [0]))[0].content_hash != records[0].content_hash


def too_long(counted: int, cut_at: int | None = None) -> Any:
    def make(record: SourceRecord) -> Outcome:
        return Failed(
            record.id,
            FailureClass.TOO_LONG,
            "x",
            1,
            None,
            Usage(),
            256,
            record.content_hash,
            counted_prompt_tokens=counted,
            answer_cut_at=cut_at,
        )

    return make


async def test_a_too_long_failure_s_counts_come_with_its_record_only_under_today_s_job_and_text(
    tmp_path: Path,
) -> None:
    """The server's count of a too_long record's prompt, and where its answer was cut off, hold for the
    same prompt from the same text: a later run judges the record by them without sending it. Another
    prompt, or an edit of the record, makes another prompt: nothing is known of it."""
    spec = make_job(tmp_path, records=4)
    await write(spec, too_long(4108), [0])
    await write(spec, too_long(3788, cut_at=308), [1])
    await write(spec, failing(FailureClass.TRUNCATED, max_tokens=1024), [2])
    records = await fetch(spec, [0, 1, 2, 3])
    assert [(r.counted_prompt_tokens, r.answer_cut_at) for r in records.values()] == [
        (4108, None),
        (3788, 308),
        (None, None),
        (None, None),
    ]
    assert records[2].truncated_at_max_tokens == 1024 and records[1].truncated_at_max_tokens is None
    edited = with_prompt(spec, system="Edited.")
    assert {(r.counted_prompt_tokens, r.answer_cut_at) for r in (await fetch(edited, [0, 1])).values()} == {
        (None, None)
    }
    edit(spec, "UPDATE postings SET description = 'x' WHERE id = 1")
    records = await fetch(spec, [0, 1])
    assert (records[0].counted_prompt_tokens, records[1].counted_prompt_tokens) == (4108, None)


async def test_a_rerun_takes_only_the_records_its_variant_has_a_current_result_for(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    await write(spec, done, [0, 1, 2, 3])
    await write(spec, failing(FailureClass.SCHEMA_INVALID), [4])
    rerun = spec.for_variant("main~rerun")
    assert rerun.variant == "main~rerun" and version_of(rerun) == version_of(spec)
    assert sorted((await pending(rerun))[0]) == [0, 1, 2, 3]  # not the failure, not the new records
    sampled = Selection(sample=5, seed=3)
    in_sample = set((await pending(spec, sampled))[0]) | {0, 1, 2, 3, 4}
    assert set((await pending(rerun, sampled))[0]) <= in_sample & {0, 1, 2, 3}
    await write(rerun, done, [0, 1])  # resumable: what the re-run has is not taken again
    assert sorted((await pending(rerun))[0]) == [2, 3]
    # results main made under another prompt are not what a re-run of today's main repeats
    edited = with_prompt(spec, system="Another prompt.")
    assert (await pending(edited.for_variant("main~rerun")))[0] == []


async def test_a_rerun_of_a_declared_variant_repeats_that_variant(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=6, variants={"big": {"model": "big-model", "max_tokens": 512}})
    big = spec.for_variant("big")
    await write(big, done, [1, 2])
    rerun = spec.for_variant("big~rerun")
    assert (rerun.model, rerun.max_tokens, rerun.variant) == ("big-model", 512, "big~rerun")
    assert sorted((await pending(rerun))[0]) == [1, 2]


async def set_aside(spec: JobSpec, selection: Selection | None = None) -> tuple[BlankRecords, BlankRecords]:
    """The blank records a run sets aside (its reader's count over both phases) and those ``status``
    counts (:func:`read_blank`): one number, whichever reads it."""
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    queries = PendingQueries(spec, version_of(spec), selection or Selection())
    reader = await SourceReader.open(connection, queries)
    await reader.count_metadata()
    await reader.count_content()
    by_the_run = reader.blank
    await reader.aclose()
    by_status = read_blank(connection, queries)
    connection.close()
    return by_the_run, by_status


BLANKED = "UPDATE postings SET title = NULL, description = ' \t' WHERE id IN (1, 3)"


async def test_a_blank_record_is_not_taken_but_counted_blank(tmp_path: Path) -> None:
    """Before, a record whose prompt fields were all empty was sent, and the model made an extraction
    up from the system prompt alone."""
    spec = make_job(tmp_path, records=6)
    edit(spec, BLANKED)
    edit(spec, "UPDATE postings SET title = '' WHERE id = 4")  # one field left with text: sent as today
    ids, count = await pending(spec)
    assert (sorted(ids), count) == ([0, 2, 4, 5], 4)
    by_the_run, by_status = await set_aside(spec)
    assert by_the_run == by_status == BlankRecords(("title", "description"), 2, (1, 3))


async def test_a_blank_record_given_text_is_pending_again(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=4)
    edit(spec, BLANKED)
    await write(spec, done, [0, 2])
    assert await pending(spec) == ([], 0)
    edit(spec, "UPDATE postings SET description = 'Now with text' WHERE id = 3")
    assert await pending(spec) == ([3], 1)
    assert (await set_aside(spec))[1].ids == (1,)


async def test_a_record_whose_text_was_emptied_is_blank_and_its_result_kept(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=4)
    await write(spec, done, [0, 1, 2, 3])
    edit(spec, BLANKED)  # changed content: it would be redone, but there is nothing to send
    assert await pending(spec) == ([], 0)
    assert await set_aside(spec) == (BlankRecords(("title", "description"), 2, (1, 3)),) * 2
    assert len(table_rows(spec.database, "SELECT * FROM results WHERE record_id IN (1, 3)")) == 2


async def test_a_failure_to_retry_that_is_blank_is_not_retried(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    edit(spec, BLANKED)
    await write(spec, failing(FailureClass.TRANSIENT), [1])
    every = Selection(retry=frozenset(FailureClass), only_failed=True)
    assert await pending(spec, every) == ([], 0)
    assert (await set_aside(spec, every))[0].ids == (1,)  # an --only-failed run sets it aside too


async def test_the_limit_counts_only_records_that_are_sent(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=8)
    edit(spec, "UPDATE postings SET title = NULL, description = NULL WHERE id < 3")
    ids, _ = await pending(spec, Selection(limit=2))
    assert sorted(ids) == [3, 4]


async def test_a_prompt_that_reads_one_field_judges_that_field_alone(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3, prompt={"user": "{title}"})
    edit(spec, "UPDATE postings SET title = '   ' WHERE id = 0")
    edit(spec, "UPDATE postings SET description = NULL WHERE id = 1")  # the prompt does not read it
    assert sorted((await pending(spec))[0]) == [1, 2]


def test_the_sample_probes_are_made_of_leaves_out_blank_records(tmp_path: Path) -> None:
    """``pipeline check`` probes the server with a sample of the job's records, as a run sends them: a
    blank one is never sent, so it probes nothing a run does."""
    spec = make_job(tmp_path, records=6)
    edit(spec, "UPDATE postings SET title = NULL, description = '' WHERE id < 4")
    connection = open_database(spec.database)
    sampled = sampled_fields(connection, spec, 6, 0)
    connection.close()
    assert sorted(str(fields["title"]) for fields in sampled) == ["Title 4", "Title 5"]


async def test_the_longest_pending_prompts_are_found_over_every_pending_record(tmp_path: Path) -> None:
    """Longest first, by the bytes of the fields the template reads: a done record, however long, is not
    pending; a done one whose text changed is; a field the prompt does not read weighs nothing."""
    spec = make_job(tmp_path, records=500)
    edit(spec, "ALTER TABLE postings ADD COLUMN notes VARCHAR")
    edit(spec, "UPDATE postings SET description = repeat('é', 900) WHERE id = 7")  # 1,800 bytes
    edit(spec, "UPDATE postings SET description = repeat('a', 5000) WHERE id = 3")
    edit(spec, "UPDATE postings SET description = repeat('b', 1000) WHERE id = 400")
    edit(spec, "UPDATE postings SET notes = repeat('n', 9000) WHERE id = 9")
    await write(spec, done, [3, 400])
    edit(spec, "UPDATE postings SET description = repeat('c', 1500) WHERE id = 400")  # changed since
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    try:
        longest = longest_pending(connection, PendingQueries(spec, version_of(spec)), 3)
    finally:
        connection.close()
    assert [record.id for record in longest] == [7, 400, 100]
    assert longest[1].fields == {"title": "Title 400", "description": "c" * 1500}


async def test_the_longest_pending_prompts_leave_out_blank_records(tmp_path: Path) -> None:
    """A blank record is never sent, so ``pipeline check`` must not fit it to the context: one of 9,000
    spaces was the longest by its bytes, and one emptied since its result (changed content) is no
    longer pending either."""
    spec = make_job(tmp_path, records=5)
    await write(spec, done, [4])
    edit(spec, "UPDATE postings SET title = NULL, description = repeat(' ', 9000) WHERE id = 1")
    edit(spec, "UPDATE postings SET title = '', description = repeat(chr(9), 5000) WHERE id = 4")
    edit(spec, "UPDATE postings SET description = repeat('a', 100) WHERE id = 2")
    connection = await anyio.to_thread.run_sync(prepare_database, spec)
    try:
        longest = longest_pending(connection, PendingQueries(spec, version_of(spec)), 5)
    finally:
        connection.close()
    assert [record.id for record in longest] == [2, 0, 3]
