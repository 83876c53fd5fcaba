"""``eval --judged`` over a real database: a real run's results (records 0 and 8-11 of variant main;
1-7 failed), judgments written with the store's own ``record_judgments``."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.job.commands import command
from pipeline.job.spec import JobSpec, load_job
from pipeline.quality.intervals import Verdict
from pipeline.quality.judgments import Judgment, JudgmentVerdict, model_judge
from pipeline.quality.ppi import NoInterval
from pipeline.reports import (
    JudgedSettings,
    evaluate_judged,
    evaluate_judged_pair,
    format_judged_eval,
    format_paired_judged,
)
from pipeline.reports.judged_report import margin_line
from pipeline.store.judgments import record_judgments
from pipeline.store.opening import prepare_database
from tests.support.outputs import job_with_outputs, run_scripted

CORRECT, WRONG, MISSING = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG, JudgmentVerdict.MISSING
EXTRACTED = ("0", "8", "9", "10", "11")  # each: title "Title N", skills [SQL, Python], years N
MODEL = model_judge("judge-model")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    spec = job_with_outputs(tmp_path_factory.mktemp("judged"))
    run_scripted(spec.for_variant("b"))  # variant b: the same answers, run again
    return spec


@pytest.fixture
def spec(made: JobSpec, tmp_path: Path) -> JobSpec:
    """A copy of the job and its database, for one test's judgments."""
    folder = shutil.copytree(made.source_file.parent, tmp_path / "job")
    return load_job(folder / made.source_file.name)


def judge(spec: JobSpec, judgments: Sequence[Judgment]) -> None:
    connection = prepare_database(spec)
    try:
        record_judgments(connection, spec, judgments)
    finally:
        connection.close()


def judged(
    records: Sequence[str], judge_name: str = "ann", *, python: JudgmentVerdict = WRONG, variant: str = "main"
) -> list[Judgment]:
    """Per record: its title and SQL right, Python as ``python`` says."""
    made = []
    for record in records:
        made += [
            Judgment(record, variant, "title", f"Title {record}", CORRECT, judge_name),
            Judgment(record, variant, "skills", "SQL", CORRECT, judge_name),
            Judgment(record, variant, "skills", "Python", python, judge_name),
        ]
    return made


def test_precision_and_recall_of_a_variant_hold_for_its_whole_run(spec: JobSpec) -> None:
    judge(spec, [*judged(["0", "8", "9"]), Judgment("0", "main", "skills", "Excel", MISSING, "ann")])
    report = evaluate_judged(spec)
    assert (report.population, report.scores.records, report.judges.table) == (5, 3, ("ann",))
    title, skills = report.scores.field("title"), report.scores.field("skills")
    assert (title.precision.value, title.precision.judged, title.recall) == (1.0, 3, None)
    assert (skills.precision.value, skills.precision.correct, skills.precision.judged) == (0.5, 3, 6)
    assert skills.recall is not None and skills.recall.value == 0.75  # 3 right SQL, 1 Excel missed
    data = report.to_json()
    assert data["fields"]["skills"]["precision"]["value"] == 0.5
    assert set(data["fields"]["skills"]["precision"]) >= {"value", "ci", "judged", "correct"}
    assert data["overall"]["precision"]["correct"] == 6 and data["overall"]["precision"]["judged"] == 9
    assert data["fields"]["title"]["recall"] is None and data["recall_fields"] == ["skills"]
    assert data["population"]["records"] == 5 and data["model"] is None
    text = format_judged_eval(report)
    assert text.splitlines()[0] == "variant main: 3 records judged by person (ann)"
    assert "the 5 records of variant main with a result" in text
    assert "misses not marked" in next(line for line in text.splitlines() if line.startswith("title "))


def test_judgments_of_a_result_redone_since_no_longer_count(spec: JobSpec) -> None:
    judge(spec, judged(["0", "8", "9"]))
    connection = prepare_database(spec)
    try:  # record 8's result changes, as a redo changes it
        connection.execute('UPDATE results SET extracted = \'{"title": "Other"}\' WHERE record_id = 8')
    finally:
        connection.close()
    report = evaluate_judged(spec)
    assert (report.scores.records, report.stale) == (2, 3)
    assert "3 judgments of results redone since: kept, not counted" in format_judged_eval(report)


def test_a_model_judge_beside_people_is_calibrated_by_them(spec: JobSpec) -> None:
    # the model judges all five records and calls Python right: biased up against the people
    judge(spec, [*judged(["0", "8", "9"]), *judged(EXTRACTED, MODEL, python=CORRECT)])
    report = evaluate_judged(spec)
    assert report.judges.table == ("ann",) and report.model is not None
    model = report.model
    assert (model.judge, model.records) == (MODEL, 5)
    assert (model.agreement.values, model.agreement.agreeing) == (9, 6)  # Python: 3 pairs disagree
    overall = model.combined["overall"]
    assert (overall.human_records, overall.model_records, overall.model_alone) == (3, 5, 1.0)
    # the model says 1.0 everywhere, so it tells nothing apart: the people's 6 of 9 stands
    assert overall.value == pytest.approx(6 / 9)
    data = report.to_json()["model"]
    assert set(data) == {"judge", "records", "agreement", "combined"}
    assert set(data["combined"]) == {"fields", "overall"} and set(data["combined"]["fields"]) == {
        "title",
        "skills",
    }
    text = format_judged_eval(report)
    assert f"model judge {MODEL} on 5 records (people on 3 of them)" in text
    assert "prediction-powered inference" in text
    # People found the same precision in each record (title all right, skills half), so the combined
    # precision is theirs, with no interval of its own; the table says so in place of one, and the
    # line under it why and what would give one.
    title = model.combined["title"]
    assert (title.value, title.ci, title.power, title.no_interval) == (1.0, None, 0.0, NoInterval.NO_SPREAD)
    assert data["combined"]["fields"]["title"]["ci_note"] == "no_spread"
    row = next(line for line in text.splitlines() if line.startswith("title ") and "no interval*" in line)
    assert row.split()[:6] == ["title", "1.000", "[0.292-1.000]", "1.000", "[no", "interval*]"]
    why = next(line for line in text.splitlines() if line.startswith("* no combined interval for "))
    assert why.startswith(
        "* no combined interval for title, skills, overall: people found the same precision"
    )
    assert "the 3 records the model judged too" in why and "a larger `judge --sample`" in why


def test_counts_read_right_for_one_and_a_margin_already_reached_says_so(spec: JobSpec) -> None:
    judge(spec, judged(["0"]))
    text = format_judged_eval(evaluate_judged(spec))
    assert text.splitlines()[0] == "variant main: 1 record judged by person (ann)"
    assert margin_line(1, 1) == (
        "±0.05 on the overall precision: reached with the 1 record judged (about 1 would do, from their "
        "spread)"
    )
    assert margin_line(40, 3) == (
        "±0.05 on the overall precision: about 40 judged records, 37 more than the 3 judged (from their "
        "spread)"
    )
    assert margin_line(12, 30).startswith(
        "±0.05 on the overall precision: reached with the 30 records judged"
    )


def test_a_model_judge_alone_is_said_to_be_uncalibrated(spec: JobSpec) -> None:
    judge(spec, judged(EXTRACTED, MODEL))
    report = evaluate_judged(spec)
    assert report.judges.by_model_only and report.judges.table == (MODEL,) and report.model is None
    assert report.scores.records == 5
    assert "not calibrated by people" in format_judged_eval(report)


def test_judge_chooses_whose_judgments_count(spec: JobSpec) -> None:
    judge(spec, [*judged(["0", "8"]), *judged(["0", "8"], "bob", python=CORRECT)])
    both = evaluate_judged(spec)
    assert both.judges.table == ("ann", "bob")
    assert both.scores.field("skills").precision.value == 0.75  # Python: half right for each record
    bob = evaluate_judged(spec, JudgedSettings(judge="bob"))
    assert bob.judges.table == ("bob",) and bob.scores.field("skills").precision.value == 1.0


def test_bad_input_is_one_line_naming_what_to_do(spec: JobSpec) -> None:
    with pytest.raises(ConfigError) as no_judgments:
        evaluate_judged(spec)
    assert str(no_judgments.value) == (  # the program by its path: pasted outside the virtualenv too
        f"no judgments for variant main yet: run `{command('judge', str(spec.source_file))}` first"
    )

    with pytest.raises(ConfigError, match="variant 'nothing' has no results"):
        evaluate_judged(spec.for_variant("nothing"))
    judge(spec, judged(["0"]))
    with pytest.raises(
        ConfigError, match=r"--judge 'cy': no judgment of variant main by that judge \(judges: ann\)"
    ):
        evaluate_judged(spec, JudgedSettings(judge="cy"))
    # On another database (--database) the command names it, and the variant without judgments.
    trial = spec.with_overrides(database=spec.database.with_name("trial db.duckdb"))
    shutil.copy(spec.database, trial.database)
    with pytest.raises(ConfigError) as of_b:
        evaluate_judged_pair(trial, ["main", "b"])
    asked = ("judge", str(spec.source_file), "--database", str(trial.database), "--variant", "b")
    assert str(of_b.value) == f"no judgments for variant b yet: run `{command(*asked)}` first"


def test_two_variants_judged_on_the_same_records_are_paired(spec: JobSpec) -> None:
    judge(spec, [*judged(EXTRACTED), *judged([*EXTRACTED[:4]], python=CORRECT, variant="b")])
    report = evaluate_judged_pair(spec, ["main", "b"])
    comparison = report.comparison
    assert (comparison.records, report.populations) == (4, (5, 5))  # record 11: judged in main only
    assert comparison.a.overall.precision.value == pytest.approx(8 / 12)
    assert comparison.b.overall.precision.value == 1.0
    assert comparison.overall.value == pytest.approx(1 / 3)
    # B is right on Python on every record, but 4 records are too few to tell that from chance (the
    # sign-flip randomization: each record's two sides swapped at random); about 11 would
    assert comparison.overall.verdict is Verdict.NONE
    assert comparison.overall.records_needed == 11
    data = report.to_json()
    assert set(data["fields"]["skills"]["difference"]) >= {
        "metric",
        "value",
        "ci",
        "verdict",
        "records_needed",
    }
    assert data["fields"]["title"]["difference"]["value"] == 0.0
    text = format_paired_judged(report)
    assert (
        text.splitlines()[0]
        == "b (B) against main (A): precision judged by person (ann) on the 4 records judged in both"
    )


def test_variants_judged_on_different_records_cannot_be_paired(spec: JobSpec) -> None:
    judge(spec, [*judged(["0"]), *judged(["8"], variant="b")])
    with pytest.raises(ConfigError, match="no record has judgments of both main and b"):
        evaluate_judged_pair(spec, ["main", "b"])


def test_the_page_shows_the_judged_records_under_the_scores(spec: JobSpec) -> None:
    judge(spec, [*judged(["0", "8"]), *judged(EXTRACTED, MODEL)])
    report = evaluate_judged(spec, JudgedSettings(review=True))
    assert report.review is not None
    assert [record.record_id for record in report.review.records] == ["0", "8"]
    rows = {(row.path, row.metric) for row in report.review.scores}
    assert {
        ("title", "precision"),
        ("overall", "precision"),
        ("overall", f"precision (people + {MODEL})"),
    } <= rows
    assert any("the whole run the sample was drawn from" in note for note in report.review.notes)
