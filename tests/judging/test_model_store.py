"""The model judge's side of the database: which results of a sample it judges, and writing verdicts
only about the answers it read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.job.commands import command
from pipeline.job.spec import JobSpec
from pipeline.judging.model_store import JudgedRecord, read_sample_to_judge, write_judged
from pipeline.quality.judgments import Judgment, JudgmentVerdict, model_judge
from pipeline.reports.reading import Sample
from pipeline.source.db import open_database
from pipeline.store.judgments import read_judgments, record_judgments
from tests.support.jobs import make_job
from tests.support.outputs import job_with_outputs

JUDGE = model_judge("judge-model")


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return job_with_outputs(tmp_path)  # records 0 and 8-11 extracted, 1-7 failed


def sql(spec: JobSpec, statement: str) -> None:
    connection = open_database(spec.database)
    try:
        connection.execute(statement)
    finally:
        connection.close()


def test_a_sample_gives_each_result_with_its_values_text_and_key(spec: JobSpec) -> None:
    found = read_sample_to_judge(spec, ["main"], None, JUDGE)
    assert (found.records, found.skipped, found.empty) == (5, 0, 0)
    assert [task.record_id for task in found.tasks] == ["0", "10", "11", "8", "9"]
    task = found.tasks[-1]
    assert dict(task.texts) == {"title": "Title 9", "description": "Description of posting 9"}
    assert [(value.field, value.value) for value in task.values] == [
        ("title", "Title 9"),
        ("skills", "SQL"),
        ("skills", "Python"),
        ("years", "9"),
        ("low", "1"),
        ("high", "2"),
    ]
    assert len(task.result_key) == 32
    smaller = read_sample_to_judge(spec, ["main"], Sample(6), JUDGE)
    assert {t.record_id for t in smaller.tasks} < {t.record_id for t in found.tasks}


def test_records_judged_by_this_model_and_results_without_values_are_counted_not_sent(spec: JobSpec) -> None:
    sql(spec, "UPDATE results SET extracted = '{\"skills\": []}' WHERE record_id = 11")
    connection = open_database(spec.database)
    try:
        verdict = JudgmentVerdict.CORRECT
        record_judgments(connection, spec, [Judgment("8", "main", "title", "Title 8", verdict, JUDGE)])
        record_judgments(connection, spec, [Judgment("9", "main", "title", "Title 9", verdict, "ann")])
    finally:
        connection.close()
    found = read_sample_to_judge(spec, ["main"], None, JUDGE)
    assert (found.records, found.skipped, found.empty) == (5, 1, 1)
    assert [task.record_id for task in found.tasks] == [
        "0",
        "10",
        "9",
    ]  # a person's judgment is not the model's


def test_verdicts_about_a_result_redone_since_it_was_read_are_not_written(spec: JobSpec) -> None:
    tasks = read_sample_to_judge(spec, ["main"], None, JUDGE).tasks
    sql(spec, "UPDATE results SET run_id = run_id + 1 WHERE record_id = 8")  # as a redo changes it
    judged = [JudgedRecord(task, (JudgmentVerdict.WRONG,) * len(task.values)) for task in tasks]
    kept = write_judged(spec, JUDGE, judged)
    assert sorted(item.task.record_id for item in kept) == ["0", "10", "11", "9"]
    connection = open_database(spec.database, read_only=True)
    try:
        stored = read_judgments(connection, spec)
    finally:
        connection.close()
    assert len(stored) == 24 and {j.record_id for j in stored} == {"0", "9", "10", "11"}
    assert {(j.judge, j.verdict) for j in stored} == {(JUDGE, JudgmentVerdict.WRONG)}


def test_a_verdict_is_stored_on_its_own_value(spec: JobSpec) -> None:
    task = read_sample_to_judge(spec, ["main"], None, JUDGE).tasks[0]
    verdicts = tuple(
        JudgmentVerdict.WRONG if v.value == "SQL" else JudgmentVerdict.CORRECT for v in task.values
    )
    judgments = JudgedRecord(task, verdicts).judgments(JUDGE)
    assert [(j.field, j.value, j.verdict) for j in judgments][1:3] == [
        ("skills", "SQL", JudgmentVerdict.WRONG),
        ("skills", "Python", JudgmentVerdict.CORRECT),
    ]
    with pytest.raises(ValueError, match="zip"):
        JudgedRecord(task, verdicts[:-1]).judgments(JUDGE)
    assert dataclasses.replace(judgments[0], result_key="") != judgments[0]  # tied to the result it judged


def test_no_database_yet_is_one_line(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=0)
    with pytest.raises(ConfigError) as missing:
        read_sample_to_judge(spec, ["main"], None, JUDGE)
    run = command("run", str(spec.source_file))  # the program by its path, the job as given
    assert str(missing.value) == f"{spec.database}: database does not exist yet (run `{run}` first)"
    assert not spec.database.exists()
