"""Agreement metrics on hand-made gold whose right answers are known exactly (and the matching rules)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from pipeline.errors import ConfigError
from pipeline.quality.agreement import measure_agreement, record_key
from pipeline.quality.matching import MatchSettings, Scores, count_matches, list_scores
from pipeline.quality.normalize import normalize_text, normalize_with_offsets
from pipeline.quality.scores import AgreementReport, FieldDifference, FieldScore, format_table
from tests.support.quality_schemas import posting_fields

Records = Mapping[Any, Mapping[str, Any]]
FULL_WIDTH_SQL = "\uff33\uff31\uff2c"  # "SQL" in full-width letters

FULL: dict[str, Any] = {
    "title": "Data Engineer",
    "company": "Acme",
    "level": "senior",
    "colour": "red",
    "remote": True,
    "headcount": 3,
    "skills": ["SQL", "Python"],
    "tags": ["x"],
    "sizes": [1, 2],
    "parts": [{"name": "dbt", "kind": "tool", "required": True, "weight": None}],
    "pay": {"low": 30000.0, "high": 40000.0, "currency": "GBP", "note": "£30-40k"},
    "extra": {"a": 1},
    "either": 5,
}


def agree(reference: Records, candidate: Records, **options: Any) -> AgreementReport:
    return measure_agreement(reference, candidate, posting_fields(), **options)


def field(report: AgreementReport, path: str) -> FieldScore:
    (score,) = [score for score in report.fields if score.path == path]
    return score


def scores(report: AgreementReport, path: str) -> tuple[float, float, float]:
    micro = field(report, path).micro
    assert micro is not None
    return micro.precision, micro.recall, micro.f1


def test_identical_reference_and_candidate_score_one_everywhere() -> None:
    other = FULL | {"title": "ML Engineer", "skills": [], "parts": [], "pay": None, "company": None}
    reference: Records = {"1": FULL, "2": other}
    report = agree(reference, {"1": dict(FULL), "2": dict(other)})
    assert report.records_scored == 2 and len(report.fields) == 20
    for score in report.fields:
        assert score.scored == 2 and score.agreement == 1.0, score.path
        if score.micro is None:
            assert score.accuracy == score.exact == 1.0, score.path
        else:
            assert score.micro == score.macro == Scores(1.0, 1.0, 1.0), score.path
    assert (report.micro, report.macro, report.macro_fields) == (Scores(1.0, 1.0, 1.0), 1.0, 16)
    # 12 scalar fields x 2 records = 24 values; list items: record 1 skills 2 + tags 1 + sizes 2 + parts 1,
    # record 2 tags 1 + sizes 2 (its skills and parts are empty): 9. 24 + 9 = 33 true positives.
    assert (report.true_positives, report.false_positives, report.false_negatives) == (33, 0, 0)
    assert [(record.record_id, record.agreement, record.differences) for record in report.records] == [
        ("1", 1.0, ()),
        ("2", 1.0, ()),
    ]
    assert report.only_in_reference == report.only_in_candidate == ()


def test_partial_overlap_has_known_precision_recall_f1() -> None:
    report = agree({"1": {"skills": ["a", "b", "c", "d"]}}, {"1": {"skills": ["a", "b", "x"]}})
    assert scores(report, "skills") == pytest.approx((2 / 3, 1 / 2, 4 / 7))
    skills = field(report, "skills")
    assert (skills.true_positives, skills.false_positives, skills.false_negatives) == (2, 1, 2)
    assert [score.path for score in report.fields] == ["skills"]  # only what the reference gives


def test_empty_lists_on_either_side() -> None:
    assert list_scores(0, 0, 0) == Scores(1.0, 1.0, 1.0)  # both empty: a perfect match
    assert list_scores(0, 3, 0) == Scores(0.0, 0.0, 0.0)  # candidate empty: recall 0
    assert list_scores(0, 0, 2) == Scores(0.0, 0.0, 0.0)  # reference empty: precision 0
    reference: Records = {"1": {"skills": []}, "2": {"skills": ["a"]}, "3": {"skills": []}}
    candidate: Records = {"1": {"skills": []}, "2": {"skills": []}, "3": {"skills": ["a"]}}
    report = agree(reference, candidate)
    skills = field(report, "skills")
    assert skills.macro == Scores(1 / 3, 1 / 3, 1 / 3)  # the both-empty record counts in macro
    assert scores(report, "skills") == (0.0, 0.0, 0.0)  # ... and adds no items to micro
    assert skills.agreement == 0.0  # the headline is the micro F1
    assert (skills.true_positives, skills.false_positives, skills.false_negatives) == (0, 1, 1)
    assert report.micro == Scores(0.0, 0.0, 0.0) and report.macro == 0.0
    only_empty = agree({"1": {"skills": []}}, {"1": {"skills": None}})  # null is an empty list
    assert scores(only_empty, "skills") == (1.0, 1.0, 1.0)  # no item on either side anywhere: 1
    assert (only_empty.micro, only_empty.macro) == (Scores(1.0, 1.0, 1.0), 1.0)
    assert (only_empty.true_positives, only_empty.false_positives, only_empty.false_negatives) == (0, 0, 0)


def test_micro_and_macro_differ_on_two_records() -> None:
    reference: Records = {"1": {"skills": ["a", "b", "c", "d"]}, "2": {"skills": ["e"]}}
    candidate: Records = {"1": {"skills": ["a", "b", "x"]}, "2": {"skills": ["e"]}}
    report = agree(reference, candidate)
    skills = field(report, "skills")
    # micro: TP 3, FP 1, FN 2 pooled; macro: the mean of (2/3, 1/2, 4/7) and (1, 1, 1).
    assert scores(report, "skills") == pytest.approx((3 / 4, 3 / 5, 2 / 3))
    macro = skills.macro
    assert macro is not None and (macro.precision, macro.recall, macro.f1) == pytest.approx(
        (5 / 6, 3 / 4, 11 / 14)
    )
    assert skills.agreement == pytest.approx(2 / 3)  # the headline: micro F1 = 2 * 3 / (5 + 4)


def test_items_are_matched_one_to_one() -> None:
    report = agree({"1": {"skills": ["SQL"]}}, {"1": {"skills": ["SQL", " sql"]}})
    assert scores(report, "skills") == (1 / 2, 1.0, 2 / 3)
    report = agree({"1": {"skills": ["SQL", "SQL"]}}, {"1": {"skills": ["sql"]}})
    assert scores(report, "skills") == (1.0, 1 / 2, 2 / 3)


def test_fuzzy_matching_is_greedy_by_best_score() -> None:
    table = {("r1", "c1"): 91.0, ("r1", "c2"): 95.0, ("r2", "c1"): 0.0, ("r2", "c2"): 99.0}
    # r2-c2 (99) first, then r1-c1 (91): two matches, where taking r1's best pair first would give one.
    assert count_matches(["r1", "r2"], ["c1", "c2"], lambda a, b: table[(a, b)], 90.0) == 2
    assert count_matches(["r1", "r2"], ["c1", "c2"], lambda a, b: table[(a, b)], 96.0) == 1
    assert count_matches(["a", "b"], ["b", "a"], None, 100.0) == 2


def test_normalised_matching_of_text() -> None:
    reference: Records = {"1": {"title": "  SQL Developer ", "skills": ["SQL", "ﬁnance", "Straße"]}}
    candidate: Records = {"1": {"title": "sql developer", "skills": [FULL_WIDTH_SQL, "Finance", "STRASSE"]}}
    report = agree(reference, candidate)
    title = field(report, "title")
    assert (title.exact, title.accuracy) == (0.0, 1.0)
    assert scores(report, "skills") == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("  SQL  ", "sql"),
        (FULL_WIDTH_SQL, "sql"),
        ("Straße", "strasse"),
        ('"Python"', "python"),
        ("“Python”.", "python"),
        ("- Team  work\n\tskills;", "team work skills"),
        ("C++", "c++"),
        ("C#", "c#"),
        (".NET", ".net"),
        ("Node.js, ", "node.js"),
        ("it's “quoted” inside", "it's “quoted” inside"),
        ("ﬁnance", "finance"),
        ("a\u00a0b", "a b"),
        ("Cafe\u0301", "café"),
        ("...", ""),
        ("", ""),
    ],
)
def test_normalize_text(text: str, normalised: str) -> None:
    assert normalize_text(text) == normalised
    assert normalize_with_offsets(text).text == normalised


def test_choices_and_booleans_compare_as_values() -> None:
    reference: Records = {"1": {"level": "senior", "remote": True, "colour": None}}
    candidate: Records = {"1": {"level": "Senior", "remote": False, "colour": None}}
    report = agree(reference, candidate)
    assert [(score.path, score.accuracy) for score in report.fields] == [
        ("level", 0.0),
        ("colour", 1.0),  # null equals null
        ("remote", 0.0),
    ]


def test_numeric_tolerance() -> None:
    reference: Records = {
        "1": {"headcount": 100, "sizes": [100, 7]},
        "2": {"headcount": 0},
        "3": {"headcount": None},
    }
    candidate: Records = {
        "1": {"headcount": 104, "sizes": [7, 104]},
        "2": {"headcount": 1e-12},
        "3": {"headcount": 0},
    }
    exact = agree(reference, candidate)
    assert field(exact, "headcount").accuracy == pytest.approx(1 / 3)  # 0 ~ 1e-12 (absolute 1e-9) only
    assert scores(exact, "sizes") == (1 / 2, 1 / 2, 1 / 2)
    tolerant = agree(reference, candidate, numeric_tolerance=0.05)  # |100 - 104| <= 0.05 * 104
    assert field(tolerant, "headcount").accuracy == pytest.approx(2 / 3)  # null vs 0 never matches
    assert scores(tolerant, "sizes") == (1.0, 1.0, 1.0)
    assert field(agree({"1": {"headcount": 3}}, {"1": {"headcount": 3.0}}), "headcount").exact == 1.0


def test_fuzzy_on_and_off() -> None:
    reference: Records = {"1": {"title": "Data Engineer", "skills": ["Kubernetes", "PostgreSQL"]}}
    candidate: Records = {"1": {"title": "Data Enginer", "skills": ["Kubernets", "Postgres"]}}
    off = agree(reference, candidate)
    assert field(off, "title").accuracy == 0.0 and scores(off, "skills") == (0.0, 0.0, 0.0)
    on = agree(reference, candidate, fuzzy_threshold=90)  # ratios: 96, 94.7 and 88.9
    assert field(on, "title").accuracy == 1.0 and field(on, "title").exact == 0.0
    assert scores(on, "skills") == (1 / 2, 1 / 2, 1 / 2)
    assert scores(agree(reference, candidate, fuzzy_threshold=85), "skills") == (1.0, 1.0, 1.0)
    one_to_one = agree(
        {"1": {"skills": ["Kubernetes"]}}, {"1": {"skills": ["Kubernets", "Kubernetess"]}}, fuzzy_threshold=90
    )
    assert scores(one_to_one, "skills") == (1 / 2, 1.0, 2 / 3)


def test_object_lists_as_sets_and_per_sub_field() -> None:
    reference: Records = {
        "1": {
            "parts": [
                {"name": "dbt", "kind": "tool", "required": True},
                {"name": "Airflow", "kind": "tool", "required": False},
            ]
        }
    }
    candidate: Records = {
        "1": {
            "parts": [
                {"name": "DBT ", "kind": "tool", "required": True},
                {"name": "Airflow", "kind": "skill", "required": False},
            ]
        }
    }
    report = agree(reference, candidate)
    assert scores(report, "parts") == (1 / 2, 1 / 2, 1 / 2)  # Airflow's kind differs
    assert scores(report, "parts[].name") == (1.0, 1.0, 1.0)
    assert scores(report, "parts[].kind") == (1 / 2, 1 / 2, 1 / 2)
    assert scores(report, "parts[].required") == (1.0, 1.0, 1.0)
    assert scores(report, "parts[].weight") == (1.0, 1.0, 1.0)  # no weights on either side
    assert [score.path for score in report.fields if score.in_overall] == ["parts"]
    assert (report.macro, report.macro_fields, report.micro) == (1 / 2, 1, Scores(1 / 2, 1 / 2, 1 / 2))
    # parts alone: dbt matched; Airflow once as a wrong object (FP) and once missed (FN)
    assert (report.true_positives, report.false_positives, report.false_negatives) == (1, 1, 1)


def test_nested_object_fields_are_scored_one_by_one() -> None:
    reference: Records = {"1": {"pay": {"low": 30000, "high": None}}, "2": {"pay": None}}
    candidate: Records = {
        "1": {"pay": {"low": 30000.0, "high": 40000, "currency": "GBP", "note": "x"}},
        "2": {"pay": {"low": 1, "high": None, "currency": "GBP", "note": None}},
    }
    report = agree(reference, candidate)
    by_path = {score.path: (score.scored, score.accuracy) for score in report.fields}
    # Record 1 gives only low and high; record 2's null pay gives every sub-field as null.
    assert by_path == {
        "pay.low": (2, 1 / 2),
        "pay.high": (2, 1 / 2),
        "pay.currency": (1, 0.0),
        "pay.note": (1, 1.0),
    }


def overall_case() -> AgreementReport:
    reference: Records = {
        "1": {"title": "A", "skills": ["a", "b"], "remote": True},
        "2": {"title": "B", "remote": True},  # no skills given: not scored for record 2
        "3": {"title": "C"},
    }
    candidate: Records = {
        "1": {"title": "a", "skills": ["a"], "remote": False},
        "2": {"title": "C", "skills": ["z"], "remote": True},
        "4": {"title": "D"},
        "5": {"title": "E"},
    }
    return agree(reference, candidate)


def test_overall_micro_and_macro_by_hand() -> None:
    report = overall_case()
    assert [(score.path, score.scored, score.agreement) for score in report.fields] == [
        ("title", 2, 1 / 2),
        ("remote", 2, 1 / 2),
        ("skills", 1, pytest.approx(2 / 3)),
    ]
    assert report.macro == pytest.approx((1 / 2 + 1 / 2 + 2 / 3) / 3)  # 5/9: every field once
    # title: 1 "A"~"a" TP, 2 "B"/"C" FP+FN; remote: 1 True/False FP+FN, 2 TP; skills: "a" TP, "b" FN.
    # TP 3, FP 2, FN 3: P 3/5, R 3/6, F1 2 * 3 / (6 + 5) = 6/11.
    assert (report.true_positives, report.false_positives, report.false_negatives) == (3, 2, 3)
    micro = report.micro
    assert micro is not None
    assert (micro.precision, micro.recall, micro.f1) == pytest.approx((3 / 5, 1 / 2, 6 / 11))
    assert (report.macro_fields, report.records_scored) == (3, 2)


def test_sparse_gold_rewards_finding_items_over_finding_nothing() -> None:
    """Most records give no items: returning nothing wins on the mean of per-record F1 (both empty counts
    as 1) but scores 0 on pooled counts, which is what the headline and overall scores use."""
    reference: dict[str, dict[str, Any]] = {str(n): {"skills": [], "tags": []} for n in range(1, 11)}
    reference["9"] = {"skills": ["SQL", "Python"], "tags": ["x"]}
    reference["10"] = {"skills": ["Rust"], "tags": []}
    nothing = agree(reference, {str(n): {"skills": [], "tags": []} for n in range(1, 11)})
    finder: dict[str, dict[str, Any]] = {str(n): {"skills": [], "tags": []} for n in range(1, 11)}
    finder["1"] = {"skills": ["Excel"], "tags": []}
    finder["2"] = {"skills": ["Teamwork"], "tags": []}
    finder["3"] = {"skills": [], "tags": ["y"]}
    finder["9"] = {"skills": ["SQL"], "tags": ["x"]}
    finder["10"] = {"skills": ["Rust", "Go"], "tags": []}
    found = agree(reference, finder)
    # Nothing found: TP 0, FP 0, FN 3 + 1; every score 0 although 8 of 10 skills lists agree (empty).
    assert (nothing.true_positives, nothing.false_positives, nothing.false_negatives) == (0, 0, 4)
    assert (nothing.micro, nothing.macro) == (Scores(0.0, 0.0, 0.0), 0.0)
    nothing_skills = field(nothing, "skills")
    assert (nothing_skills.agreement, nothing_skills.macro) == (0.0, Scores(0.8, 0.8, 0.8))
    # skills: SQL, Rust TP; Excel, Teamwork, Go FP; Python FN: F1 2 * 2 / (3 + 5) = 1/2, while the mean of
    # per-record F1 is (6 both empty + 2/3 in 9 + 2/3 in 10) / 10 = 11/15, below nothing's 0.8.
    found_skills = field(found, "skills")
    assert found_skills.agreement == 0.5 and found_skills.macro is not None
    assert found_skills.macro.f1 == pytest.approx(11 / 15)
    # tags: x TP, y FP: F1 2 * 1 / (1 + 2) = 2/3. Overall TP 3, FP 4, FN 1: P 3/7, R 3/4, F1 6/11.
    assert field(found, "tags").agreement == pytest.approx(2 / 3)
    assert (found.true_positives, found.false_positives, found.false_negatives) == (3, 4, 1)
    assert found.micro is not None
    assert (found.micro.precision, found.micro.recall, found.micro.f1) == pytest.approx(
        (3 / 7, 3 / 4, 6 / 11)
    )
    assert found.macro == pytest.approx((1 / 2 + 2 / 3) / 2)  # 7/12


def test_records_that_disagree_most_come_first_with_both_values() -> None:
    report = overall_case()
    assert [(record.record_id, record.fields_scored) for record in report.records] == [("2", 2), ("1", 3)]
    assert report.records[0].disagreement == pytest.approx(1 / 2)
    assert report.records[1].disagreement == pytest.approx(4 / 9)
    assert report.records[0].differences == (FieldDifference("title", "B", "C", 0.0),)
    remote, skills = report.records[1].differences  # in schema order
    assert remote == FieldDifference("remote", True, False, 0.0)
    assert (skills.path, skills.reference, skills.candidate) == ("skills", ["a", "b"], ["a"])
    assert skills.agreement == pytest.approx(2 / 3)


def test_missing_records_are_listed() -> None:
    report = overall_case()
    assert report.only_in_reference == ("3",)
    assert report.only_in_candidate == ("4", "5")
    assert report.to_json()["missing"] == {"reference_only": ["3"], "candidate_only": ["4", "5"]}


def test_record_ids_match_whatever_their_type() -> None:
    assert [record_key(value) for value in (42, "42", 42.0, " 42 ", 4.5, " a b ")] == [
        "42",
        "42",
        "42",
        "42",
        "4.5",
        "a b",
    ]
    report = agree({42: {"title": "A"}, 7.0: {"title": "B"}}, {"42": {"title": "A"}, " 7 ": {"title": "B"}})
    assert report.records_scored == 2 and report.only_in_reference == report.only_in_candidate == ()
    assert field(report, "title").accuracy == 1.0
    with pytest.raises(ConfigError, match=r"^reference record ids 42 and '42' are the same record$"):
        agree({42: {"title": "A"}, "42": {"title": "B"}}, {})


def test_ids_sort_numbers_first_in_numeric_order() -> None:
    report = agree({str(n): {"title": "x"} for n in (10, 9, 100)} | {"b": {"title": "x"}, "a": {}}, {})
    assert report.only_in_reference == ("9", "10", "100", "a", "b")


def test_unknown_fields_are_config_errors() -> None:
    with pytest.raises(
        ConfigError, match=r"^field 'skils' is not in the schema \(did you mean 'skills'\?\)$"
    ):
        agree({"1": {"skills": []}}, {}, fields=["skils"])
    with pytest.raises(
        ConfigError, match="^the reference gives field 'salary', which the schema does not have$"
    ):
        agree({"1": {"salary": 3}}, {})


def test_fields_option_scores_a_subset() -> None:
    report = agree({"1": FULL}, {"1": FULL}, fields=["title", "pay.low"])
    assert [score.path for score in report.fields] == ["title", "pay.low"]
    never_given = agree({"1": {"title": "A"}}, {"1": {"title": "A"}}, fields=["title", "company"])
    assert [(score.path, score.scored, score.agreement) for score in never_given.fields] == [
        ("title", 1, 1.0),
        ("company", 0, None),
    ]
    assert never_given.macro_fields == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fuzzy_threshold": 150}, "^fuzzy threshold 150: must be between 0 and 100$"),
        ({"numeric_tolerance": -0.1}, "^numeric tolerance -0.1: must be a number, 0 or more$"),
        ({"numeric_tolerance": math.nan}, "^numeric tolerance nan: must be a number, 0 or more$"),
    ],
)
def test_bad_settings(options: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MatchSettings(**options)


def test_to_json_keys_and_values() -> None:
    data = overall_case().to_json()
    assert list(data) == [
        "records",
        "fields",
        "micro",
        "macro",
        "intervals",
        "missing",
        "matching",
        "disagreements",
    ]
    assert data["records"] == 2
    assert data["fields"]["title"] == {
        "kind": "text",
        "scored": 2,
        "agreement": 0.5,
        "in_overall": True,
        "accuracy": 0.5,
        "exact": 0.0,
    }
    skills = data["fields"]["skills"]
    assert skills == {
        "kind": "list",
        "scored": 1,
        "agreement": pytest.approx(2 / 3),
        "in_overall": True,
        "precision": 1.0,
        "recall": 0.5,
        "f1": pytest.approx(2 / 3),
        "macro": {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3)},
        "tp": 1,
        "fp": 0,
        "fn": 1,
    }
    assert data["micro"] == {  # see test_overall_micro_and_macro_by_hand
        "precision": pytest.approx(3 / 5),
        "recall": 0.5,
        "f1": pytest.approx(6 / 11),
        "tp": 3,
        "fp": 2,
        "fn": 3,
    }
    assert data["macro"] == {"score": pytest.approx(5 / 9), "fields": 3}
    assert data["matching"]["fuzzy"] == "off" and data["matching"]["numeric_tolerance"] == 0.0
    assert data["matching"]["text"].startswith("Unicode NFKC, casefold, whitespace runs to one space")
    assert [record["id"] for record in data["disagreements"]] == ["2", "1"]
    assert data["disagreements"][0]["fields"] == [
        {"path": "title", "reference": "B", "candidate": "C", "agreement": 0.0}
    ]
    assert orjson.loads(orjson.dumps(data))["records"] == 2  # JSON all the way down


def test_format_table() -> None:
    table = format_table(overall_case())
    assert table.splitlines() == [
        "field   kind     records  accuracy  exact  precision  recall     f1  macro f1",
        "title   text           2     0.500  0.000",
        "remote  boolean        2     0.500  0.500",
        "skills  list           1                       1.000   0.500  0.667     0.667",
        "micro P 0.600  R 0.500  F1 0.545  (pooled over every value: 3 TP, 2 FP, 3 FN; a scalar counts once)",
        "macro 0.556  (mean of each field's F1 or accuracy, 3 fields)",
        "matching: text NFKC + casefold + whitespace squeezed + outer quotes/punctuation stripped; "
        "fuzzy off; numbers within 0 relative; list items one to one",
        "records: 2 on both sides; 1 only in the reference (3); 2 only in the candidate (4, 5)",
    ]
    fuzzy = format_table(agree({"1": {"title": "A"}}, {}, fuzzy_threshold=85, numeric_tolerance=0.01))
    assert "; fuzzy fuzz.ratio >= 85; numbers within 0.01 relative;" in fuzzy
    many = agree({str(n): {"title": "x"} for n in range(12)}, {})
    assert many.only_in_reference[:2] == ("0", "1")
    assert format_table(many).endswith(
        "12 only in the reference (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, …); 0 only in the candidate"
    )


def test_a_reference_object_leaving_a_sub_field_out_matches_whatever_the_candidate_holds_there() -> None:
    dbt = {"name": "dbt", "kind": "tool", "required": True, "weight": None}
    git = {"name": "git", "kind": "tool", "required": False, "weight": 0.5}
    # A gold requirement given by its name alone (a value marked missing on the judging page).
    report = agree({"1": {"parts": [{"name": "dbt"}]}}, {"1": {"parts": [dbt, git]}})
    parts = next(score for score in report.fields if score.path == "parts")
    assert (parts.true_positives, parts.false_positives, parts.false_negatives) == (1, 1, 0)
    # Given, even as null, a sub-field is compared: a null kind is not "tool".
    report = agree({"1": {"parts": [{"name": "dbt", "kind": None}]}}, {"1": {"parts": [dbt]}})
    parts = next(score for score in report.fields if score.path == "parts")
    assert (parts.true_positives, parts.false_positives, parts.false_negatives) == (0, 1, 1)
    # A candidate's object leaving one out says null there, as before: no wildcard on that side.
    report = agree({"1": {"parts": [dbt]}}, {"1": {"parts": [{"name": "dbt"}]}})
    assert next(score for score in report.fields if score.path == "parts").true_positives == 0
