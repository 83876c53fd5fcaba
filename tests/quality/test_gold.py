"""Reading gold files: JSON lines, JSON and CSV, partial records, and one-line errors for bad input."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.quality.agreement import measure_agreement
from pipeline.quality.fields import schema_fields
from pipeline.quality.gold import read_gold
from tests.support.quality_schemas import Posting


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_json_lines_keyed_by_id_with_partial_records(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "gold.jsonl",
        '{"posting_id": 42, "title": "Data Engineer", "skills": ["SQL", "dbt"]}\n'
        "\n"
        '{"posting_id": " 43 ", "company": null, "pay": {"low": 30000}}\n'
        '{"id": 44.0, "remote": true}\n',
    )
    gold = read_gold(path, "posting_id", Posting)
    assert gold.path == path
    assert gold.records == {
        "42": {"title": "Data Engineer", "skills": ["SQL", "dbt"]},
        "43": {"company": None, "pay": {"low": 30000}},
        "44": {"remote": True},  # no posting_id: the id is under "id"
    }
    assert gold.fields == ("title", "company", "remote", "skills", "pay")  # schema order


def test_a_line_separator_inside_a_json_string_is_not_a_new_line(tmp_path: Path) -> None:
    path = write(tmp_path, "gold.ndjson", '{"id": 1, "title": "a\u2028b"}\n')
    assert read_gold(path, "id", Posting).records == {"1": {"title": "a\u2028b"}}


def test_json_list(tmp_path: Path) -> None:
    path = write(tmp_path, "gold.json", '[{"id": "a", "level": "senior"}, {"id": "b", "tags": ["x"]}]')
    gold = read_gold(path, "id", Posting)
    assert gold.records == {"a": {"level": "senior"}, "b": {"tags": ["x"]}}
    assert gold.fields == ("level", "tags")


def test_csv_cells_are_parsed_by_field_kind(tmp_path: Path) -> None:
    path = tmp_path / "gold.csv"
    path.write_text(
        "\ufeffid,title,skills,headcount,remote,sizes,parts,pay,level\n"
        '1, Data Engineer ,"[""SQL"", ""dbt""]",3,yes,1;2.5,"[{""name"": ""dbt""}]","{""low"": 1}",senior\n'
        "2,,SQL; Python ;,,False,,[],,\n"
        "3,Analyst,,,,,,,\n",
        encoding="utf-8",
    )
    gold = read_gold(path, "record_id", Posting)  # no record_id column: "id"
    assert gold.records == {
        "1": {
            "title": "Data Engineer",
            "skills": ["SQL", "dbt"],
            "headcount": 3,
            "remote": True,
            "sizes": [1, 2.5],
            "parts": [{"name": "dbt"}],
            "pay": {"low": 1},
            "level": "senior",
        },
        "2": {"skills": ["SQL", "Python"], "remote": False, "parts": []},  # empty cells: not given
        "3": {"title": "Analyst"},
    }
    assert gold.fields == ("title", "level", "remote", "headcount", "skills", "sizes", "parts", "pay")


def test_gold_against_extractions_matches_ids_across_types(tmp_path: Path) -> None:
    path = write(tmp_path, "gold.csv", "id,title,skills\n1,Data Engineer,SQL;dbt\n2,Analyst,\n3,Chef,\n")
    gold = read_gold(path, "id", Posting)
    extractions = {
        1: {"title": "data engineer", "skills": ["SQL"]},
        2: {"title": "Analyst", "skills": ["Excel"]},
    }
    report = measure_agreement(gold.records, extractions, schema_fields(Posting))
    assert report.records_scored == 2 and report.only_in_reference == ("3",)
    by_path = {score.path: score for score in report.fields}
    assert by_path["title"].accuracy == 1.0 and by_path["skills"].scored == 1  # record 2 gives no skills
    micro = by_path["skills"].micro
    assert micro is not None and (micro.precision, micro.recall) == (1.0, 0.5)
    # overall: 2 titles right (TP 2), SQL found (TP 1), dbt missed (FN 1): P 1, R 3/4, F1 6/7
    assert (report.true_positives, report.false_positives, report.false_negatives) == (3, 0, 1)
    assert report.micro is not None and report.micro.f1 == pytest.approx(6 / 7)
    assert report.macro == pytest.approx((1 + 2 / 3) / 2)  # title accuracy 1, skills F1 2/3


BAD_FILES = [
    ("gold.txt", "id,title\n", "unknown gold file type ('.txt'); use .jsonl, .ndjson, .json, .csv"),
    ("gold", "id,title\n", "unknown gold file type (no extension); use .jsonl, .ndjson, .json, .csv"),
    ("gold.jsonl", '{"id": 1}\n{"id": 2,\n', "line 2: invalid JSON (unexpected end of data, column 10)"),
    ("gold.jsonl", "[1, 2]\n", "line 1: expected a JSON object, got list"),
    ("gold.jsonl", '{"id": 1}\n{"title": "x"}\n', "line 2: no id (expected 'posting_id' or 'id')"),
    ("gold.jsonl", '{"id": 1}\n{"id": ""}\n', "line 2: no id (expected 'posting_id' or 'id')"),
    ("gold.jsonl", '{"id": [1]}\n', "line 1: the id must be a string or a number, got list"),
    ("gold.jsonl", '{"id": 1}\n\n{"id": 2}\n{"id": "1"}\n', "line 4: duplicate id '1' (first on line 1)"),
    (
        "gold.jsonl",
        '{"id": 1, "titel": "x"}\n',
        "line 1: field 'titel' is not a schema field (did you mean 'title'?)",
    ),
    ("gold.jsonl", '{"id": 1, "skills": "SQL"}\n', "line 1: field 'skills' must be a list, got str"),
    ("gold.jsonl", '{"id": 1, "skills": null}\n', "line 1: field 'skills' must be a list, got null"),
    (
        "gold.jsonl",
        '{"id": 1, "parts": ["dbt"]}\n',
        "line 1: field 'parts' must be a list of objects, got list",
    ),
    ("gold.jsonl", '{"id": 1, "pay": 3}\n', "line 1: field 'pay' must be an object or null, got int"),
    ("gold.jsonl", "\n\n", "no gold records"),
    ("gold.json", '{"id": 1}', "expected a JSON list of objects, got dict"),
    ("gold.json", '[{"id": 1},\n 2]', "line 2: expected a JSON object, got int"),
    ("gold.json", '[{"id": 1},\n{"id": 2]', "line 2: invalid JSON (expecting ',' delimiter, column 9)"),
    ("gold.json", '[\n  {"id": 1},\n  {"id": 1}\n]', "line 3: duplicate id '1' (first on line 2)"),
    ("gold.csv", "", "no header row"),
    ("gold.csv", "title,skills\nA,B\n", "no id column (expected 'posting_id' or 'id')"),
    ("gold.csv", "id,titel\n1,x\n", "column 'titel' is not a schema field (did you mean 'title'?)"),
    ("gold.csv", "id,title,title\n1,x,y\n", "column 'title' appears twice in the header"),
    ("gold.csv", "id,title\n1,x\n2,y,z\n", "line 3: more cells than the header has columns"),
    ("gold.csv", "id,title\n1,x\n,y\n", "line 3: no id (expected 'posting_id' or 'id')"),
    ("gold.csv", "id,headcount\n1,3\n2,many\n", "line 3: column 'headcount': 'many' is not a number"),
    (
        "gold.csv",
        "id,remote\n1,maybe\n",
        "line 2: column 'remote': 'maybe' is not a boolean (true/false, yes/no, 1/0)",
    ),
    ("gold.csv", "id,sizes\n1,1;x\n", "line 2: column 'sizes': 'x' is not a number"),
    ("gold.csv", "id,parts\n1,dbt\n", "line 2: column 'parts': invalid JSON (unexpected character"),
    ("gold.csv", 'id,skills\n1,"[""a"""\n', "line 2: column 'skills': invalid JSON"),
    ("gold.csv", "id,pay\n1,[1]\n", "line 2: field 'pay' must be an object or null, got list"),
    (
        "gold.jsonl",
        '{"id": 1, "_judged_wrong": ["x"]}\n',
        "line 1: '_judged_wrong' must be an object of field paths to lists of values judged wrong, got list",
    ),
    (
        "gold.jsonl",
        '{"id": 1, "_judged_wrong": {"pay.lo": [1]}}\n',
        "line 1: _judged_wrong: 'pay.lo' is not a judged field path (did you mean 'pay.low'?)",
    ),
    (
        "gold.jsonl",
        '{"id": 1, "_judged_wrong": {"company": "Acme"}}\n',
        "line 1: '_judged_wrong' must be an object of field paths to lists of values judged wrong: "
        "'company' holds str",
    ),
    ("gold.csv", "id,_judged_wrong\n1,x\n", "column '_judged_wrong' is not a schema field"),
]


@pytest.mark.parametrize(("name", "text", "problem"), BAD_FILES)
def test_bad_gold_files_name_the_file_and_the_line(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError, match="^" + re.escape(f"{path}: {problem}")) as caught:
        read_gold(path, "posting_id", Posting)
    assert "\n" not in str(caught.value)


def test_values_judged_wrong_are_read_and_scored_as_wrong_only_where_an_answer_gives_them(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "gold.jsonl",
        '{"id": 1, "title": "A", "_judged_wrong": {"company": ["Hays"], "skills": ["Go"]}}\n'
        '{"id": 2, "_judged_wrong": {"company": ["Hays"], "pay.low": [30000]}}\n',
    )
    gold = read_gold(path, "id", Posting)
    assert gold.records["2"] == {"_judged_wrong": {"company": ["Hays"], "pay.low": [30000]}}
    assert gold.fields == ("title", "company", "skills", "pay")
    # Record 1: Hays and Go are known wrong, SQL unknown. Record 2: Acme unknown, 30000 known wrong.
    candidate: dict[str, dict[str, Any]] = {
        "1": {"title": "A", "company": "Hays", "skills": ["Go", "SQL"]},
        "2": {"company": "Acme", "pay": {"low": 30000.0}},
    }
    report = measure_agreement(gold.records, candidate, schema_fields(Posting))
    scores = {score.path: score for score in report.fields}
    counts = {
        path: (score.scored, score.true_positives, score.false_positives, score.false_negatives)
        for path, score in scores.items()
    }
    assert counts["company"] == (1, 0, 1, 0) and scores["company"].accuracy == 0.0
    assert counts["skills"] == (1, 0, 1, 0)
    assert counts["pay.low"] == (1, 0, 1, 0)
    assert counts["pay.high"] == (0, 0, 0, 0)  # nothing known of it: not scored
    # Pooled: title right, three values known wrong, nothing known missing.
    assert (report.true_positives, report.false_positives, report.false_negatives) == (1, 3, 0)
    worst = {d.path: d.reference for record in report.records for d in record.differences}
    assert worst["company"] == {"judged wrong": ["Hays"]}


def test_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(
        ConfigError, match="^" + re.escape(f"{missing}: cannot read the gold file (No such file")
    ):
        read_gold(missing, "id", Posting)
    latin1 = tmp_path / "gold.csv"
    latin1.write_bytes("id,title\n1,caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="^" + re.escape(f"{latin1}: not UTF-8 text (byte 14)") + "$"):
        read_gold(latin1, "id", Posting)
