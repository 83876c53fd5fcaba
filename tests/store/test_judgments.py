from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.quality.judgments import Judgment, JudgmentVerdict, model_judge
from pipeline.source.db import open_database
from pipeline.store.judgments import (
    judgments_table,
    read_judgments,
    record_judgments,
    stored_judgment_ids,
    undo_judgment,
)
from pipeline.store.opening import prepare_database
from tests.support.jobs import table_rows
from tests.support.outputs import job_with_outputs, run_scripted

CORRECT, WRONG, MISSING = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING


def judgment(record: str, verdict: JudgmentVerdict, value: str = "Title", judge: str = "ann") -> Judgment:
    return Judgment(record, "main", "title", value, verdict, judge)


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return job_with_outputs(tmp_path)  # records 0 and 8-11 extracted, 1-7 failed


def test_judgments_are_written_with_the_result_they_judged_and_read_back(spec: JobSpec) -> None:
    connection = prepare_database(spec)
    try:
        stored = record_judgments(connection, spec, [judgment("0", CORRECT), judgment("8", WRONG, "x")])
        assert all(j.judgment_id and len(j.result_key) == 32 for j in stored)
        read = read_judgments(connection, spec)
    finally:
        connection.close()
    assert [(j.record_id, j.verdict, j.value, j.stale) for j in read] == [
        ("0", CORRECT, "Title", False),
        ("8", WRONG, "x", False),
    ]
    assert read[0].judged_at is not None and not read[0].by_model


def test_the_latest_judgment_of_a_value_counts_and_undo_brings_back_the_one_before(spec: JobSpec) -> None:
    connection = prepare_database(spec)
    try:
        record_judgments(connection, spec, [judgment("0", CORRECT)])
        (changed,) = record_judgments(connection, spec, [judgment("0", WRONG)])
        record_judgments(connection, spec, [judgment("0", CORRECT, judge=model_judge("m"))])
        latest = {j.judge: j.verdict for j in read_judgments(connection, spec)}
        assert latest == {"ann": WRONG, "model:m": CORRECT}
        assert len(read_judgments(connection, spec, latest_only=False)) == 3
        assert undo_judgment(connection, spec, changed.judgment_id)
        assert not undo_judgment(connection, spec, changed.judgment_id)
        assert {j.judge: j.verdict for j in read_judgments(connection, spec)}["ann"] is CORRECT
    finally:
        connection.close()


def test_a_record_without_a_result_is_refused_and_nothing_of_the_batch_is_written(spec: JobSpec) -> None:
    connection = prepare_database(spec)
    try:
        with pytest.raises(ConfigError, match=r"record '1' has no result of variant 'main' to judge"):
            record_judgments(connection, spec, [judgment("0", CORRECT), judgment("1", MISSING)])
        with pytest.raises(ConfigError, match=r"record '0' has no result of variant 'other'"):
            record_judgments(connection, spec, [Judgment("0", "other", "title", "T", CORRECT, "ann")])
        assert read_judgments(connection, spec) == []
    finally:
        connection.close()


def test_judgments_of_a_redone_record_are_kept_but_stale(spec: JobSpec) -> None:
    connection = prepare_database(spec)
    try:
        record_judgments(connection, spec, [judgment("0", CORRECT), judgment("8", CORRECT)])
    finally:
        connection.close()
    _edit_source(spec, "0")
    run_scripted(spec)  # a plain run redoes the edited record (and retries nothing else)
    connection = prepare_database(spec)
    try:
        assert [j.record_id for j in read_judgments(connection, spec)] == ["8"]
        every = read_judgments(connection, spec, include_stale=True)
        assert [(j.record_id, j.stale) for j in every] == [("0", True), ("8", False)]
    finally:
        connection.close()
    rows = table_rows(spec.database, f"SELECT count(*) FROM {judgments_table(spec)}")
    assert rows == [(2,)]


def _edit_source(spec: JobSpec, record: str) -> None:
    connection = open_database(spec.database)
    try:
        connection.execute("UPDATE postings SET description = 'edited' WHERE id = $id", {"id": int(record)})
    finally:
        connection.close()


def test_an_older_database_gets_the_table_when_opened(spec: JobSpec) -> None:
    connection = open_database(spec.database)
    connection.execute(f"DROP TABLE {judgments_table(spec)}")
    connection.close()
    prepare_database(spec).close()
    assert table_rows(spec.database, f"SELECT count(*) FROM {judgments_table(spec)}") == [(0,)]


def test_a_judgment_naming_the_result_it_saw_keeps_it_and_its_time(spec: JobSpec) -> None:
    """The judging page writes the result key it showed and the time of the key press (a judgment
    journaled while a run held the database is written later, with its own time)."""
    connection = prepare_database(spec)
    try:
        (shown,) = record_judgments(connection, spec, [judgment("0", CORRECT)])
        judged_at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
        seen = dataclasses.replace(judgment("0", WRONG), result_key=shown.result_key, judged_at=judged_at)
        old = dataclasses.replace(judgment("8", CORRECT), result_key="a result since redone")
        record_judgments(connection, spec, [seen, old])
        every = read_judgments(connection, spec, include_stale=True, latest_only=False)
        assert [(j.record_id, j.verdict, j.stale) for j in every] == [
            ("0", WRONG, False),  # its time, before the first one's
            ("0", CORRECT, False),
            ("8", CORRECT, True),  # written, and stale at once: the result it judged is gone
        ]
        assert every[0].judged_at == judged_at.replace(tzinfo=None)
        ids = {j.judgment_id for j in every}
        assert stored_judgment_ids(connection, spec, [*ids, "unknown"]) == ids
    finally:
        connection.close()


def test_judgments_are_read_for_the_judges_asked_for(spec: JobSpec) -> None:
    connection = prepare_database(spec)
    try:
        record_judgments(connection, spec, [judgment("0", CORRECT), judgment("0", WRONG, judge="bob")])
        assert [j.judge for j in read_judgments(connection, spec, judges=["bob"])] == ["bob"]
        assert len(read_judgments(connection, spec, judges=None)) == 2
        assert read_judgments(connection, spec, judges=[]) == []
    finally:
        connection.close()


def test_many_judgments_are_written_in_one_statement_in_order(spec: JobSpec) -> None:
    many = [
        judgment("8", CORRECT if i % 3 else WRONG, f"value {i}", judge=model_judge("m")) for i in range(2000)
    ]
    connection = prepare_database(spec)
    try:
        record_judgments(connection, spec, many)
        read = read_judgments(connection, spec)
    finally:
        connection.close()
    assert [(j.value, j.verdict) for j in read] == [(j.value, j.verdict) for j in many]
