"""Judgments written at once, or journaled while another process holds the database (a real one)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest

from pipeline.job.spec import JobSpec
from pipeline.judging.journal import Journal, JudgmentWriter, Saved, journal_path
from pipeline.judging.session import JudgingSession, SessionOptions, load_session
from pipeline.judging.state import Action
from pipeline.quality.judgments import JudgmentVerdict
from pipeline.reports import Sample
from pipeline.source.lock import RunLock
from tests.support.judging import blind_judgment_rows, judging_job, judgment_rows, write_read_copy
from tests.support.outputs import database_held_by_another_process

CORRECT, WRONG = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return judging_job(tmp_path)


def session_of(spec: JobSpec) -> JudgingSession:
    writer = JudgmentWriter(spec)
    pending = writer.pending()
    return load_session(
        spec, SessionOptions(("main",), Sample(50), "ann", sample_given=False), pending.added, pending.undone
    )


def judged(session: JudgingSession, item: int, verdict: JudgmentVerdict = CORRECT, index: int = 0) -> Action:
    return session.judge(index, item, verdict)


@pytest.mark.process
def test_a_judgment_is_in_the_table_when_save_returns_and_the_database_is_closed(spec: JobSpec) -> None:
    writer = JudgmentWriter(spec)
    action = judged(session_of(spec), 0)
    assert writer.save(action.judgments) is Saved.WRITTEN
    assert judgment_rows(spec.database) == [("1", "main", "title", "Title 1", "correct", "ann")]
    # Nothing holds the file: another process may open it for writing at once.
    with database_held_by_another_process(spec.database):
        pass


@pytest.mark.process
def test_while_a_run_holds_the_database_judgments_are_journaled_then_written_in_order(spec: JobSpec) -> None:
    writer = JudgmentWriter(spec)
    session = session_of(spec)
    first, second = judged(session, 0), judged(session, 1, WRONG)
    write_read_copy(spec)
    with database_held_by_another_process(spec.database, as_run=True):
        assert writer.save(first.judgments) is Saved.JOURNALED
        session.saved(first)
        assert writer.save(second.judgments) is Saved.JOURNALED
        session.saved(second)
        assert writer.flush() is False
        # The page reopened, or the command restarted, while the run goes on: the state includes them.
        assert session_of(spec).progress().judged == 2
    assert journal_path(spec.database).exists()
    assert writer.flush() is True
    assert not journal_path(spec.database).exists()
    assert [row[2:5] for row in judgment_rows(spec.database)] == [
        ("title", "Title 1", "correct"),
        ("skills", "SQL", "wrong"),
    ]
    assert session_of(spec).progress().judged == 2


@pytest.mark.process
def test_a_database_held_by_anything_else_journals_too(spec: JobSpec) -> None:
    writer = JudgmentWriter(spec)
    session = session_of(spec)
    with database_held_by_another_process(spec.database):
        assert writer.save(judged(session, 0).judgments) is Saved.JOURNALED
    next_one = judged(session, 1)
    assert writer.save(next_one.judgments) is Saved.WRITTEN  # the journal goes first
    assert [row[3] for row in judgment_rows(spec.database)] == ["Title 1", "SQL"]


def test_undo_of_a_journaled_judgment_removes_it_from_the_journal(spec: JobSpec) -> None:
    writer = JudgmentWriter(spec)
    session = session_of(spec)
    kept, undone = judged(session, 0), judged(session, 1)
    with RunLock(spec.database):  # a run is starting: the writer leaves the file to it
        writer.save(kept.judgments)
        writer.save(undone.judgments)
        assert writer.undo(undone.judgments) is Saved.JOURNALED
        assert [j.value for j in writer.pending().added] == ["Title 1"]
    writer.flush()
    assert [row[3] for row in judgment_rows(spec.database)] == ["Title 1"]


@pytest.mark.process
def test_undo_of_a_written_judgment_while_the_database_is_held_is_journaled(spec: JobSpec) -> None:
    writer = JudgmentWriter(spec)
    action = judged(session_of(spec), 0)
    writer.save(action.judgments)
    write_read_copy(spec)
    with database_held_by_another_process(spec.database, as_run=True):
        assert writer.undo(action.judgments) is Saved.JOURNALED
        assert session_of(spec).progress().judged == 0  # read from the run's copy, less the undo
    writer.flush()
    assert judgment_rows(spec.database) == []


def test_a_replay_cut_short_is_not_written_twice(spec: JobSpec) -> None:
    writer = JudgmentWriter(spec)
    action = judged(session_of(spec), 0)
    writer.save(action.judgments)
    Journal(journal_path(spec.database)).append(added=action.judgments)  # as if the journal outlived it
    writer.flush()
    assert len(judgment_rows(spec.database)) == 1


def test_a_last_line_cut_short_by_a_kill_is_left_out_and_others_are_kept(spec: JobSpec) -> None:
    journal = Journal(journal_path(spec.database))
    journal.append(added=judged(session_of(spec), 0).judgments)
    with journal.path.open("ab") as file:
        file.write(b'{"add": [{"record_id": "1", "var')  # killed while writing: never confirmed
    assert [j.value for j in journal.read().added] == ["Title 1"]
    JudgmentWriter(spec).flush()
    assert [row[3] for row in judgment_rows(spec.database)] == ["Title 1"]


def test_a_session_takes_only_its_own_judges_journaled_judgments(spec: JobSpec) -> None:
    writer = JudgmentWriter(spec)
    others = load_session(spec, SessionOptions(("main",), Sample(50), "bob", sample_given=False))
    with RunLock(spec.database):
        writer.save(judged(others, 0).judgments)
        assert session_of(spec).progress().judged == 0  # ann's session: bob's judgment is not hers


def test_a_blind_judgment_keeps_its_pair_through_the_journal_and_one_of_an_earlier_version_is_seen(
    spec: JobSpec,
) -> None:
    journal = Journal(journal_path(spec.database))
    action = judged(session_of(spec), 0)
    journal.append(added=[dataclasses.replace(j, blind_between="big,main") for j in action.judgments])
    earlier = orjson.loads(journal.path.read_bytes().splitlines()[0])  # as an earlier version wrote it:
    for judgment in earlier["add"]:  # the same line without blind_between
        del judgment["blind_between"]
        judgment["judgment_id"] = "written-by-an-earlier-version"
    with journal.path.open("ab") as file:
        file.write(orjson.dumps(earlier) + b"\n")
    assert [j.blind_between for j in journal.read().added] == ["big,main", ""]
    JudgmentWriter(spec).flush()
    assert [row[6] for row in blind_judgment_rows(spec.database)] == ["big,main", ""]
