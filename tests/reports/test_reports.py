"""Reading a job's results for eval, compare and review: exact numbers over databases made by real
runs of two variants (tests/support/variants.py says what each variant answers for each record)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.errors import ConfigError, DatabaseLockedError
from pipeline.job.spec import JobSpec
from pipeline.quality.matching import Scores
from pipeline.quality.scores import RecordAgreement
from pipeline.reports import (
    CompareSettings,
    EvalSettings,
    JobOutput,
    Sample,
    StoredResult,
    compare_variants,
    evaluate,
    parse_fields,
    parse_variants,
    read_review,
)
from pipeline.reports.reading import Scope, keys_scope
from pipeline.reports.review_page import ReviewRecord, VariantView
from tests.support.jobs import table_rows
from tests.support.outputs import database_held_by_another_process
from tests.support.variants import (
    LATE_ID,
    PARTIAL_GOLD,
    SAMPLE,
    SAMPLED_IDS,
    approx,
    big_answer,
    main_answer,
    make_postings,
    run_variant,
    stored_extractions,
    two_variant_job,
    variants_job,
    write_gold,
)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """Both variants run over every record; only read by the tests that use it."""
    return two_variant_job(tmp_path_factory.mktemp("variants"))


@pytest.fixture
def own_job(tmp_path: Path) -> JobSpec:
    """The same, for a test that changes the database."""
    return two_variant_job(tmp_path)


def disagreements(records: Sequence[RecordAgreement]) -> list[tuple[str, Any, list[str]]]:
    return [
        (record.record_id, approx(record.disagreement), [d.path for d in record.differences])
        for record in records
        if record.differences
    ]


# --- eval -------------------------------------------------------------------------------------------


def test_eval_against_the_variants_own_answers_scores_one_everywhere(job: JobSpec, tmp_path: Path) -> None:
    gold = write_gold(
        tmp_path / "gold.jsonl",
        [
            {"id": str(number), **answer}
            for number, answer in stored_extractions(job.database, "main").items()
        ],
    )
    report = evaluate(job, gold)
    agreement = report.agreement
    assert agreement.records_scored == 9
    assert {score.path: score.agreement for score in agreement.fields} == {
        "title": 1.0, "skills": 1.0, "years": 1.0, "low": 1.0, "high": 1.0,
    }  # fmt: skip
    skills = next(score for score in agreement.fields if score.path == "skills")
    assert skills.micro is not None and (skills.micro.precision, skills.micro.recall) == (1.0, 1.0)
    assert (agreement.micro, agreement.macro) == (Scores(1.0, 1.0, 1.0), 1.0)
    # 9 records: title, years, low, high once each (36) and 2 skills each (18)
    assert (agreement.true_positives, agreement.false_positives, agreement.false_negatives) == (54, 0, 0)
    assert (dict(report.failed), report.not_extracted, report.not_in_source) == ({}, (), ())


def test_eval_partial_gold_has_the_hand_computed_scores_and_accounts_for_every_record(
    job: JobSpec, tmp_path: Path
) -> None:
    report = evaluate(job, write_gold(tmp_path / "gold.jsonl", PARTIAL_GOLD))
    data = report.to_json()
    assert data["records"] == 3  # 42 (gold id "42"), 1, 2
    fields = data["fields"]
    assert (fields["title"]["scored"], fields["title"]["accuracy"]) == (1, 1.0)
    # skills: TP 2+1+1, gold items 2+2+1, extracted 2+2+2; per record F1 1, 1/2, 2/3
    skills = fields["skills"]
    assert (skills["tp"], skills["fp"], skills["fn"]) == (4, 2, 1)
    assert (skills["precision"], skills["recall"], skills["f1"]) == (
        approx(4 / 6),
        approx(4 / 5),
        approx(8 / 11),
    )
    assert skills["macro"]["f1"] == approx((1 + 1 / 2 + 2 / 3) / 3)
    assert skills["agreement"] == approx(8 / 11)  # the headline is the micro F1
    assert (fields["years"]["scored"], fields["years"]["accuracy"]) == (3, approx(2 / 3))
    # macro: title accuracy 1, skills micro F1 8/11, years accuracy 2/3
    assert data["macro"] == {
        "score": approx((1 + 8 / 11 + 2 / 3) / 3),
        "fields": 3,
        "score_ci": [approx(1 / 3), 1.0],  # 3 records: a wide interval
    }
    # micro: title TP 1; skills TP 4, FP 2, FN 1; years TP 2 and (3 for 2) FP 1, FN 1: TP 7, FP 3, FN 2
    assert data["micro"] == {
        "precision": approx(7 / 10),
        "precision_ci": [approx(1 / 3), 1.0],
        "recall": approx(7 / 9),
        "recall_ci": [0.5, 1.0],
        "f1": approx(14 / 19),
        "f1_ci": [0.4, 1.0],
        "tp": 7,
        "fp": 3,
        "fn": 2,
    }
    assert data["missing"] == {"reference_only": ["9", "50", "77"], "candidate_only": []}
    assert (data["failed"], data["not_extracted"], data["not_in_source"]) == (
        {"9": "schema_invalid"},
        ["50"],
        ["77"],
    )
    assert data["grounding"] == {"skills": {"found": 6, "values": 6, "share": 1.0}}
    assert (data["variant"], data["gold"]) == ("main", {"path": str(tmp_path / "gold.jsonl"), "records": 6})


def test_eval_of_another_variant_with_fields_fuzzy_and_tolerance(job: JobSpec, tmp_path: Path) -> None:
    gold = write_gold(
        tmp_path / "gold.jsonl",
        [{"id": 2, "skills": ["SQLL"], "years": 2}, {"id": 3, "skills": ["SQL"], "years": 31}],
    )
    big = job.for_variant("big")  # big: 2 -> [SQL], years 2; 3 -> [SQL], years 30
    plain = evaluate(big, gold).to_json()["fields"]
    assert (plain["skills"]["f1"], plain["years"]["accuracy"]) == (0.5, 0.5)
    loose = evaluate(big, gold, EvalSettings(fuzzy_threshold=80, numeric_tolerance=0.05)).to_json()
    assert (loose["fields"]["skills"]["f1"], loose["fields"]["years"]["accuracy"]) == (1.0, 1.0)
    only_skills = evaluate(big, gold, EvalSettings(fields=parse_fields("skills"))).to_json()["fields"]
    assert list(only_skills) == ["skills"]


def test_eval_reads_only_the_gold_records_results(
    job: JobSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    original = JobOutput.results

    def counting(
        self: JobOutput, variants: Sequence[str], scope: Scope
    ) -> dict[str, dict[str, StoredResult]]:
        found = original(self, variants, scope)
        read.extend(len(rows) for rows in found.values())
        return found

    monkeypatch.setattr(JobOutput, "results", counting)
    evaluate(job, write_gold(tmp_path / "gold.jsonl", [{"id": 4, "years": 4}, {"id": "42", "years": 1}]))
    assert read == [2]  # of main's 9 results


@pytest.mark.parametrize(
    ("rows", "settings", "message"),
    [
        (
            [{"id": 1, "skils": []}],
            EvalSettings(),
            r"gold\.jsonl: line 1: field 'skils' is not a schema field \(did you mean 'skills'\?\)",
        ),
        ([{"id": 1, "skills": []}], EvalSettings(fields=("nope",)), r"field 'nope' is not in the schema"),
        ([{"skills": []}], EvalSettings(), r"gold\.jsonl: line 1: no id"),
    ],
)
def test_eval_bad_input_is_one_config_error(
    job: JobSpec, tmp_path: Path, rows: list[dict[str, Any]], settings: EvalSettings, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        evaluate(job, write_gold(tmp_path / "gold.jsonl", rows), settings)


def test_a_variant_without_results_is_named_with_the_variants_that_have_some(
    job: JobSpec, tmp_path: Path
) -> None:
    gold = write_gold(tmp_path / "gold.jsonl", [{"id": 1, "years": 1}])
    expected = f"{job.database}: variant 'nope' has no results (variants with results: big, main)"
    with pytest.raises(ConfigError) as raised:
        evaluate(job.for_variant("nope"), gold)
    assert str(raised.value) == expected
    with pytest.raises(ConfigError, match="variant 'nope' has no results"):
        compare_variants(job, "main", "nope")
    with pytest.raises(ConfigError, match="variant 'nope' has no results or failures"):
        read_review(job, ["nope"], Sample(100))


@pytest.mark.process
def test_a_held_database_is_database_locked(tmp_path: Path) -> None:
    spec = two_variant_job(tmp_path)
    with database_held_by_another_process(spec.database), pytest.raises(DatabaseLockedError):
        compare_variants(spec, "main", "big")


def test_gold_keys_match_ids_of_any_type() -> None:
    with duckdb.connect() as connection:
        connection.execute("CREATE TABLE numbers AS SELECT * FROM (VALUES (42.0), (1.5), (7.0)) t(id)")
        connection.execute("CREATE TABLE texts AS SELECT * FROM (VALUES (' 42 '), ('42.0'), ('x')) t(id)")
        scope = keys_scope(["42", "1.5", "x"])
        sql = "SELECT id FROM {} WHERE " + scope.where("id") + " ORDER BY id"
        parameters = dict(scope.parameters)
        assert connection.execute(sql.format("numbers"), parameters).fetchall() == [(1.5,), (42.0,)]
        # "42.0" is read too (an integer key also matches a float id's text); the caller keeps exact keys.
        assert connection.execute(sql.format("texts"), parameters).fetchall() == [
            (" 42 ",),
            ("42.0",),
            ("x",),
        ]


# --- compare ----------------------------------------------------------------------------------------


def test_compare_agreement_tokens_failures_and_grounding(job: JobSpec) -> None:
    report = compare_variants(job, "main", "big")
    data = report.to_json(show=5)
    assert data["records"] == 8  # 9 failed for main, 8 for big
    fields = data["fields"]
    # skills: big drops Python in 2 and 3, adds Rust in 5
    assert (fields["skills"]["tp"], fields["skills"]["fp"], fields["skills"]["fn"]) == (14, 1, 2)
    assert fields["skills"]["f1"] == approx(28 / 31)
    assert fields["skills"]["macro"]["f1"] == approx((5 + 2 * 2 / 3 + 0.8) / 8)
    assert (fields["years"]["accuracy"], fields["title"]["accuracy"]) == (0.875, 1.0)
    # macro: title 1, skills micro F1 28/31, years 7/8, low 1, high 1
    assert data["macro"] | {"score_ci": None} == {
        "score": approx((1 + 28 / 31 + 0.875 + 1 + 1) / 5),
        "fields": 5,
        "score_ci": None,
    }
    low, high = data["macro"]["score_ci"]
    assert low < data["macro"]["score"] < high
    # micro: title, low, high 8 TP each, years 7 TP + 1 FP + 1 FN, skills 14 TP, 1 FP, 2 FN:
    # TP 45, FP 2, FN 3: P 45/47, R 45/48, F1 90/95
    micro = {name: value for name, value in data["micro"].items() if not name.endswith("_ci")}
    assert micro == {
        "precision": approx(45 / 47),
        "recall": approx(45 / 48),
        "f1": approx(90 / 95),
        "tp": 45,
        "fp": 2,
        "fn": 3,
    }
    for name in ("precision", "recall", "f1"):  # each score has its 95% interval beside it
        low, high = data["micro"][f"{name}_ci"]
        assert low <= data["micro"][name] <= high and high - low < 0.2
    main, big = data["variants"]["main"], data["variants"]["big"]
    assert main["tokens_per_record"] == {"prompt": 100.0, "completion": 40.0, "reasoning": 10.0}
    # record 1 took big two attempts: (200 + 7 * 100) / 8 ...
    assert big["tokens_per_record"] == {"prompt": 112.5, "completion": 45.0, "reasoning": 11.25}
    assert (main["failures"], big["failures"]) == ({"schema_invalid": 1}, {"truncated": 1})
    assert data["failures_over"]["records"] == 10
    assert main["grounding"] == {"skills": {"found": 16, "values": 16, "share": 1.0}}
    assert big["grounding"] == {"skills": {"found": 14, "values": 15, "share": 14 / 15}}
    for name, summary in data["variants"].items():
        [(latency,)] = table_rows(
            job.database,
            f"SELECT avg(total_latency_s) FROM results WHERE variant = '{name}' AND record_id NOT IN (8, 9)",
        )
        assert summary["latency_s_per_record"] == approx(latency)
    assert [(d["id"], d["differences"]) for d in data["disagreements"]] == [
        ("3", [{"path": "skills", "a": ["SQL", "Python"], "b": ["SQL"]}, {"path": "years", "a": 3, "b": 30}]),
        ("2", [{"path": "skills", "a": ["SQL", "Python"], "b": ["SQL"]}]),
        ("5", [{"path": "skills", "a": ["SQL", "Python"], "b": ["SQL", "Python", "Rust"]}]),
    ]
    assert data["disagreements"][0]["disagreement"] == approx(1 - (3 + 2 / 3) / 5)
    assert len(report.to_json(show=1)["disagreements"]) == 1


def test_sample_takes_the_records_a_sampled_run_takes_for_every_variant(job: JobSpec, tmp_path: Path) -> None:
    sampled_run = variants_job(tmp_path)
    make_postings(sampled_run.database, [LATE_ID])  # the same source as the job's
    run_variant(sampled_run, "main", main_answer, sample=SAMPLE.size, seed=SAMPLE.seed)
    run_variant(sampled_run, "big", big_answer, sample=SAMPLE.size, seed=SAMPLE.seed)
    for variant in ("main", "big"):
        taken = table_rows(
            sampled_run.database,
            f"SELECT record_id FROM results WHERE variant = '{variant}' "
            f"UNION SELECT record_id FROM failures WHERE variant = '{variant}'",
        )
        assert {str(row[0]) for row in taken} == SAMPLED_IDS

    report = compare_variants(job, "main", "big", CompareSettings(sample=SAMPLE))
    assert {record.record_id for record in report.agreement.records} == {"2", "3", "6"}  # 9 failed for main
    assert (report.agreement.records_scored, report.attempted) == (3, 4)
    assert [summary.failures for summary in report.variants] == [{"schema_invalid": 1}, {}]
    assert disagreements(report.agreement.records) == [
        ("3", approx(1 - (3 + 2 / 3) / 5), ["skills", "years"]),
        ("2", approx(1 - (4 + 2 / 3) / 5), ["skills"]),
    ]
    page = read_review(job, ["main", "big"], SAMPLE)
    assert [record.record_id for record in page.records] == ["2", "3", "6", "9"]

    # eval --sample: only the gold records of the same sample (9 failed: listed, not scored)
    every = [
        {"id": str(number), **answer} for number, answer in stored_extractions(job.database, "main").items()
    ]
    gold = write_gold(tmp_path / "gold.jsonl", [*every, {"id": "9", "title": "x"}])
    sampled = evaluate(job, gold, EvalSettings(sample=SAMPLE))
    assert (sampled.agreement.records_scored, len(sampled.gold.records), dict(sampled.failed)) == (
        3,
        4,
        {"9": "schema_invalid"},
    )


@pytest.mark.parametrize(
    ("text", "least", "names"),
    [("main,big", 2, ("main", "big")), (" main , big ", 2, ("main", "big")), ("main", 1, ("main",))],
)
def test_parse_variants(text: str, least: int, names: tuple[str, ...]) -> None:
    assert parse_variants(text, least=least) == names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("main", r"--variants 'main': give exactly 2 variant names"),
        ("main,main", r"give exactly 2 different variants"),
        ("a,b,c", r"give exactly 2 variant names"),
        ("main,", r"give exactly 2 variant names"),
    ],
)
def test_parse_variants_refuses(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_variants(text)


# --- review -----------------------------------------------------------------------------------------


def views(records: Sequence[ReviewRecord], key: str) -> Mapping[str, VariantView]:
    """The views of record ``key`` on a page."""
    return next(record for record in records if record.record_id == key).variants


def test_review_of_one_variant_shows_its_results_and_failures_in_the_sample(job: JobSpec) -> None:
    page = read_review(job, ["main"], Sample(100))
    assert [record.record_id for record in page.records] == [
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "9",
        "42",
    ]
    assert page.notes == ("sample of 100 source records (seed 0): 10 with a result or a failure of main",)
    record = page.records[0]
    assert record.texts == {"title": "Title 1", "description": "Posting 1 needs SQL and Python."}
    view = record.variants["main"]
    assert (view.extraction, view.failure, view.model) == (
        {"title": "Title 1", "skills": ["SQL", "Python"], "years": 1, "low": 0, "high": 0},
        None,
        "test-model",
    )
    assert [(span.value, span.source_field, span.start, span.end, span.match) for span in view.grounding] == [
        ("SQL", "description", 16, 19, "exact"),
        ("Python", "description", 24, 30, "exact"),
    ]
    failed = views(page.records, "9")["main"]
    assert failed.extraction is None and failed.failure is not None
    assert failed.failure.startswith("schema_invalid: ") and "low is larger than high" in failed.failure
    assert (record.disagreement, tuple(record.differing_fields)) == (None, ())
    assert (tuple(page.fields), tuple(page.grounded_paths)) == (
        ("title", "skills", "years", "low", "high"),
        ("skills",),
    )


def test_review_of_two_variants_has_disagreements_failures_and_ungrounded_values(job: JobSpec) -> None:
    page = read_review(job, ["main", "big"], Sample(100))
    by_id = {record.record_id: record for record in page.records}
    assert list(by_id) == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "42"]
    assert (by_id["3"].disagreement, tuple(by_id["3"].differing_fields)) == (
        approx(1 - (3 + 2 / 3) / 5),
        ("skills", "years"),
    )
    assert (by_id["4"].disagreement, tuple(by_id["4"].differing_fields)) == (0.0, ())
    truncated = by_id["8"]
    assert truncated.disagreement is None and truncated.variants["main"].failure is None
    big_failure = truncated.variants["big"].failure
    assert big_failure is not None and big_failure.startswith("truncated: answer truncated")
    rust = [span for span in by_id["5"].variants["big"].grounding if span.value == "Rust"]
    assert [(span.match, span.source_field) for span in rust] == [("none", None)]
    assert by_id["1"].variants["big"].model == "big-model"


def test_review_grounds_again_results_whose_text_changed_or_that_have_none(
    own_job: JobSpec, tmp_path: Path
) -> None:
    with duckdb.connect(str(own_job.database)) as connection:
        connection.execute("UPDATE postings SET description = 'Only SQL here.' WHERE id = 4")
        connection.execute("UPDATE results SET grounding = NULL WHERE record_id = 6 AND variant = 'main'")
    page = read_review(own_job, ["main"], Sample(100))
    four = views(page.records, "4")["main"].grounding
    assert [(span.value, span.start, span.end, span.match) for span in four] == [
        ("SQL", 5, 8, "exact"),
        ("Python", None, None, "none"),
    ]
    six = views(page.records, "6")["main"].grounding
    assert [(span.value, span.match) for span in six] == [("SQL", "exact"), ("Python", "exact")]
    assert page.notes[-1].startswith("grounding of 2 results located again in the text shown")
    report = evaluate(
        own_job, write_gold(tmp_path / "gold.jsonl", [{"id": 6, "years": 6}, {"id": 7, "years": 7}])
    )
    assert report.grounding.to_json() == {"skills": {"found": 2, "values": 2, "share": 1.0}}
    assert report.grounding.without_grounding == 1


def test_the_page_shows_the_prompt_fields_of_the_variants_shown(tmp_path: Path) -> None:
    spec = variants_job(tmp_path)
    run_variant(spec, "main", main_answer, sample=2)
    run_variant(spec, "titles", main_answer, sample=2)
    alone = read_review(spec, ["titles"], Sample(2))
    assert [list(record.texts) for record in alone.records] == [["title"], ["title"]]
    # its skills are looked for in the title only: not found
    assert {span.match for record in alone.records for span in record.variants["titles"].grounding} == {
        "none"
    }
    both = read_review(spec, ["titles", "main"], Sample(2))
    assert [list(record.texts) for record in both.records] == [["title", "description"]] * 2
