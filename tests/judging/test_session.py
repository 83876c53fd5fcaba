"""The judging session over databases made by real runs: the sample, the blind order, items and
missing values, progress, and going on where the judge stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.judging.journal import JudgmentWriter
from pipeline.judging.session import JudgingSession, SessionOptions, answer_order, load_session
from pipeline.quality.judgments import JudgmentVerdict
from pipeline.reports import Sample
from pipeline.reports.reading import open_output
from pipeline.store.judgments import read_judgments
from tests.support.judging import EXTRACTED_RECORDS, judging_job
from tests.support.variants import SAMPLE, SAMPLED_IDS, two_variant_job

CORRECT, WRONG, MISSING = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING
FIFTY = Sample(50)


@pytest.fixture(scope="module")
def one_variant(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    return judging_job(tmp_path_factory.mktemp("judging"))


@pytest.fixture(scope="module")
def two_variants(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    return two_variant_job(tmp_path_factory.mktemp("blind"))


KEY = b"the session's own key"


def options(
    *variants: str, sample: Sample = FIFTY, judge: str = "ann", given: bool = False, key: bytes = KEY
) -> SessionOptions:
    return SessionOptions(tuple(variants), sample, judge, sample_given=given, order_key=key)


def saved(spec: JobSpec, session: JudgingSession, *actions: tuple[int, int, JudgmentVerdict]) -> None:
    """Judge ``(record, item, verdict)`` as the server does: written, then applied."""
    writer = JudgmentWriter(spec)
    for index, item, verdict in actions:
        action = session.judge(index, item, verdict)
        writer.save(action.judgments)
        session.saved(action)


def test_the_default_sample_is_every_sampled_record_with_a_result_in_id_order(one_variant: JobSpec) -> None:
    session = load_session(one_variant, options("main"))
    assert [record.record_id for record in session.records] == [str(n) for n in EXTRACTED_RECORDS]
    first = session.records[0]
    assert [(item.field, item.value) for item in first.items] == [
        ("title", "Title 1"),
        ("skills", "SQL"),
        ("skills", "Python"),
        ("years", "1"),
        ("low", "0"),
        ("high", "0"),
    ]
    assert [span.value for span in first.answers[0].view.grounding] == ["SQL", "Python"]
    assert first.texts == {"title": "Title 1", "description": "Posting 1 needs SQL and Python."}


def test_the_seeded_sample_is_the_projects_sample_restricted_to_records_both_variants_extracted(
    two_variants: JobSpec,
) -> None:
    session = load_session(two_variants, options("main", "big", sample=SAMPLE, given=True))
    # 9 is in the sample but failed for both variants.
    assert {record.record_id for record in session.records} == SAMPLED_IDS - {"9"}


def test_two_variants_are_shown_in_an_order_drawn_per_record_with_the_sessions_secret_key(
    two_variants: JobSpec,
) -> None:
    session = load_session(two_variants, options("main", "big"))
    orders = {record.record_id: tuple(a.variant for a in record.answers) for record in session.records}
    assert set(orders.values()) == {("main", "big"), ("big", "main")}  # both orders occur
    assert all(tuple(a.answer_id for a in record.answers) == ("1", "2") for record in session.records)
    again = load_session(two_variants, options("big", "main"))  # the same key: the same order
    assert {r.record_id: tuple(a.variant for a in r.answers) for r in again.records} == orders
    other_key = [answer_order(("main", "big"), b"another key", record_id) for record_id in orders]
    assert other_key != list(orders.values())
    # Without a key given, each session draws its own: the seed and the ids shown do not tell the order.
    drawn = {SessionOptions(("main", "big"), SAMPLE, "ann").order_key for _ in range(3)}
    assert len(drawn) == 3 and all(len(key) == 16 for key in drawn)


def test_a_value_both_answers_give_is_one_item_and_judging_it_judges_both(two_variants: JobSpec) -> None:
    session = load_session(two_variants, options("main", "big", judge="both"))
    index = next(n for n, record in enumerate(session.records) if record.record_id == "5")
    record = session.records[index]
    shared = [item for item in record.items if item.field == "skills"]
    # big gives Rust besides SQL and Python; main does not
    assert {item.value: len(item.answers) for item in shared} == {"SQL": 2, "Python": 2, "Rust": 1}
    sql = next(n for n, item in enumerate(record.items) if item.value == "SQL")
    action = session.judge(index, sql, CORRECT)
    assert {(j.variant, j.value, j.verdict) for j in action.judgments} == {
        ("main", "SQL", CORRECT),
        ("big", "SQL", CORRECT),
    }
    assert len({j.judged_at for j in action.judgments}) == 1  # one action: one time


def test_a_missing_value_is_missing_for_each_answer_that_lacks_it(two_variants: JobSpec) -> None:
    session = load_session(two_variants, options("main", "big", judge="miss"))
    index = next(n for n, record in enumerate(session.records) if record.record_id == "5")
    excel = session.mark_missing(index, "skills", "  Excel ")
    assert {(j.variant, j.value, j.verdict) for j in excel.judgments} == {
        ("main", "Excel", MISSING),
        ("big", "Excel", MISSING),
    }
    rust = session.mark_missing(index, "skills", "rust")  # big gives it (as normalised text)
    assert [j.variant for j in rust.judgments] == ["main"]
    with pytest.raises(ValueError, match="judge it instead"):
        session.mark_missing(index, "skills", "SQL")
    with pytest.raises(ValueError, match="not a judged field"):
        session.mark_missing(index, "skils", "Excel")
    with pytest.raises(ValueError, match="select the missing value"):
        session.mark_missing(index, "skills", "   ")


def test_progress_counts_values_per_field_and_resume_starts_at_the_first_unjudged(tmp_path: Path) -> None:
    spec = judging_job(tmp_path)
    session = load_session(spec, options("main"))
    assert session.start() == 0
    values = session.progress()
    assert (values.records, values.records_done, values.values) == (9, 0, 9 * 6)
    saved(spec, session, *((0, item, CORRECT) for item in range(6)), (1, 0, WRONG))
    progress = session.progress()
    by_field = {field.field: field for field in progress.fields}
    assert (by_field["title"].judged, by_field["title"].correct, by_field["title"].wrong) == (2, 1, 1)
    assert (by_field["skills"].values, by_field["skills"].judged) == (18, 2)
    assert progress.records_done == 1 and session.start() == 1
    # Started again (the page reopened, the command restarted): the same state, from the table.
    again = load_session(spec, options("main"))
    assert again.progress() == progress and again.start() == 1
    assert again.unjudged(1) == [1, 2, 3, 4, 5]
    # Another judge starts from nothing.
    assert load_session(spec, options("main", judge="bob")).progress().judged == 0


def test_undo_takes_back_the_last_action_and_the_verdict_before_it_counts_again(tmp_path: Path) -> None:
    spec = judging_job(tmp_path)
    session = load_session(spec, options("main"))
    saved(spec, session, (0, 0, CORRECT), (0, 0, WRONG))
    record = session.records[0]
    assert session.item_verdict(record, record.items[0]) is WRONG
    last = session.last_action()
    assert last is not None and session.where(last) == (0, 0)
    session.taken_back(last)
    assert session.item_verdict(record, record.items[0]) is CORRECT


def test_bad_samples_and_variants_are_one_line_each(one_variant: JobSpec) -> None:
    with pytest.raises(ConfigError, match=r"--sample 500: variant main has 9 results$"):
        load_session(one_variant, options("main", sample=Sample(500), given=True))
    with pytest.raises(ConfigError, match=r"variant 'big' has no results \(variants with results: main\)"):
        load_session(one_variant, options("big"))
    with pytest.raises(ConfigError, match="none of the sampled records has a result of main"):
        load_session(one_variant, options("main", sample=Sample(1, 20), given=True))  # draws record 9


def test_a_blind_session_shows_and_counts_only_what_was_judged_blind_between_its_two_variants(
    tmp_path: Path,
) -> None:
    spec = two_variant_job(tmp_path)
    seen = load_session(spec, options("main"))  # main judged on its own page, knowing it is main
    saved(spec, seen, (0, 0, WRONG), (0, 1, CORRECT), (1, 0, CORRECT))
    missing = seen.mark_missing(0, "skills", "Excel")
    JudgmentWriter(spec).save(missing.judgments)
    seen.saved(missing)
    blind = load_session(spec, options("main", "big"))
    assert blind.progress().judged == 0 and blind.start() == 0 and blind.last_action() is None
    for index, record in enumerate(blind.records):
        assert [blind.item_verdict(record, item) for item in record.items] == [None] * len(record.items)
        assert blind.missing(index) == [] and blind.unjudged(index) == list(range(len(record.items)))
    # What it shows is what a judge who never judged main sees.
    fresh = load_session(spec, options("main", "big", judge="bob"))
    assert blind.progress() == fresh.progress()
    # Judged blind: a new judgment beside the earlier one, and only it counts on the blind page.
    title = next(n for n, item in enumerate(blind.records[0].items) if item.field == "title")
    action = blind.judge(0, title, CORRECT)
    assert {j.blind_between for j in action.judgments} == {"big,main"}
    JudgmentWriter(spec).save(action.judgments)
    again = load_session(spec, options("big", "main"))  # the same pair, whatever its order
    assert again.progress().judged == 1
    assert again.item_verdict(again.records[0], again.records[0].items[title]) is CORRECT
    # Both kept; on main's own page (and in eval) the latest counts: the blind verdict.
    with open_output(spec) as output:
        every = read_judgments(output.connection, spec, ["main"], latest_only=False)
        latest = read_judgments(output.connection, spec, ["main"])
    first_title = [(j.verdict, j.blind_between) for j in every if (j.record_id, j.field) == ("1", "title")]
    assert first_title == [(WRONG, ""), (CORRECT, "big,main")]
    assert [j.verdict for j in latest if (j.record_id, j.field) == ("1", "title")] == [CORRECT]
    reopened = load_session(spec, options("main"))
    assert reopened.item_verdict(reopened.records[0], reopened.records[0].items[0]) is CORRECT
