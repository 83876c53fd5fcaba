"""Importing judgments (a good file whole, a bad line refused with its line and nothing imported) and
exporting the judged records as a gold file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.judging.exchange import export_gold, import_judgments
from pipeline.quality.gold import read_gold
from pipeline.quality.judgments import JUDGED_WRONG, Judgment, model_judge
from pipeline.reports.reading import open_output
from pipeline.store.judgments import Merged, read_judgments
from tests.support.judging import judging_job, judgment_rows

GOOD: list[dict[str, Any]] = [
    {"record_id": 1, "field": "title", "value": "Title 1", "verdict": "correct"},
    {"record_id": "1", "field": "skills", "value": "SQL", "verdict": "correct", "judge": "bob"},
    {"record_id": 1, "field": "skills", "value": "Python", "verdict": "wrong"},
    {"record_id": 1, "field": "skills", "value": "Excel", "verdict": "missing"},
    {"record_id": 1.0, "variant": "main", "field": "years", "value": 1, "verdict": "correct"},
    {"record_id": 1, "field": "low", "value": 0, "verdict": "correct"},
    {"record_id": 1, "field": "high", "value": 0, "verdict": "wrong"},
    {"record_id": 2, "field": "skills", "value": "SQL", "verdict": "correct"},
]


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return judging_job(tmp_path)


@pytest.fixture(scope="module")
def untouched(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """One job for the tests that must leave it as it is (they check they did)."""
    return judging_job(tmp_path_factory.mktemp("untouched"))


def test_a_good_file_is_imported_whole(spec: JobSpec, tmp_path: Path) -> None:
    imported = import_judgments(spec, write_lines(tmp_path / "judgments.jsonl", GOOD), judge="ann")
    assert imported.count == 8 and dict(imported.judges) == {"ann": 7, "bob": 1}
    assert imported.merged == Merged(added=8, replaced=0, unchanged=0)
    rows = judgment_rows(spec.database)
    assert rows[1] == ("1", "main", "skills", "SQL", "correct", "bob")
    assert ("1", "main", "years", "1", "correct", "ann") in rows


def test_an_import_counts_once_per_value_and_judge_and_says_what_it_added_replaced_and_left(
    spec: JobSpec, tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "judgments.jsonl", GOOD)
    import_judgments(spec, path, judge="ann")
    rows = judgment_rows(spec.database)
    again = import_judgments(spec, path, judge="ann")
    assert again.merged == Merged(added=0, replaced=0, unchanged=8)
    assert judgment_rows(spec.database) == rows  # nothing written the second time
    # Another judge's same verdicts are theirs: added. A changed verdict replaces the one that counts.
    changed = [{**GOOD[2], "verdict": "correct"}, {**GOOD[0], "judge": "cy"}, GOOD[5]]
    merged = import_judgments(spec, write_lines(tmp_path / "changed.jsonl", changed), judge="ann").merged
    assert merged == Merged(added=1, replaced=1, unchanged=1)
    latest = {(j.field, j.value, j.judge): j.verdict for j in read_judgments_of(spec)}
    assert (
        latest[("skills", "Python", "ann")] == "correct" and latest[("title", "Title 1", "cy")] == "correct"
    )
    assert len(judgment_rows(spec.database)) == len(rows) + 2
    # The same line twice in one file counts once.
    twice = import_judgments(spec, write_lines(tmp_path / "twice.jsonl", [GOOD[0], GOOD[0]]), judge="ann")
    assert (twice.count, twice.merged) == (1, Merged(added=0, replaced=0, unchanged=1))


def test_one_value_given_two_verdicts_in_one_file_is_refused_naming_both_lines(
    untouched: JobSpec, tmp_path: Path
) -> None:
    path = write_lines(tmp_path / "judgments.jsonl", [GOOD[2], GOOD[0], {**GOOD[2], "verdict": "correct"}])
    with pytest.raises(
        ConfigError,
        match=r"judgments\.jsonl: line 3: correct for 'Python' of skills in record '1' by ann, which line 1 "
        r"judged wrong: give each value one verdict$",
    ):
        import_judgments(untouched, path, judge="ann")
    assert judgment_rows(untouched.database) == []


def read_judgments_of(spec: JobSpec) -> list[Judgment]:
    with open_output(spec) as output:
        return read_judgments(output.connection, spec)


def test_a_json_list_is_imported_as_its_lines_are_and_its_errors_name_the_line(
    spec: JobSpec, tmp_path: Path
) -> None:
    listed = tmp_path / "judgments.json"
    listed.write_text("[\n" + ",\n".join(json.dumps(line) for line in [*GOOD, {"record_id": 1}]) + "\n]")
    with pytest.raises(ConfigError, match=rf"judgments\.json: line {len(GOOD) + 2}: 'field' must be"):
        import_judgments(spec, listed, judge="ann")
    listed.write_text(json.dumps(GOOD, indent=2))
    assert import_judgments(spec, listed, judge="ann").count == len(GOOD)
    assert len(judgment_rows(spec.database)) == len(GOOD)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("{not json", r"judgments.jsonl: line 3: invalid JSON \("),
        ("[1, 2]", r"judgments.jsonl: line 3: expected a JSON object"),
        (
            {"record_id": 1, "field": "skils", "value": "SQL", "verdict": "correct"},
            r"judgments.jsonl: line 3: unknown field 'skils' \(did you mean 'skills'\?\)$",
        ),
        (
            {"record_id": 1, "field": "skills", "value": "SQL", "verdict": "right"},
            r"judgments.jsonl: line 3: unknown verdict 'right' \(one of correct, wrong, missing\)$",
        ),
        (
            {"record_id": 1, "field": "skills", "value": "SQL", "verdict": "correct", "verdcit": "x"},
            r"judgments.jsonl: line 3: unknown key 'verdcit' \(did you mean 'verdict'\?\)$",
        ),
        (
            {"record_id": 9, "field": "skills", "value": "SQL", "verdict": "correct"},
            r"judgments.jsonl: line 3: record '9' has no result of variant 'main' \(not extracted, failed",
        ),
        (
            {"record_id": 77, "field": "skills", "value": "SQL", "verdict": "correct"},
            r"judgments.jsonl: line 3: record '77' has no result of variant 'main'",
        ),
        (
            {"record_id": 1, "variant": "big", "field": "skills", "value": "SQL", "verdict": "correct"},
            r"judgments.jsonl: line 3: record '1' has no result of variant 'big'",
        ),
        (
            {"record_id": 1, "field": "skills", "value": "Go", "verdict": "wrong"},
            r"judgments.jsonl: line 3: 'Go' is not a value of skills in record '1' of variant main "
            r"\(its values: 'SQL', 'Python'\)$",
        ),
        (
            {"record_id": 1, "field": "skills", "value": "SQL", "verdict": "missing"},
            r"judgments.jsonl: line 3: the answer gives 'SQL' for skills: it is not missing",
        ),
        (
            {"record_id": 1, "field": "years", "value": "a few", "verdict": "missing"},
            r"judgments.jsonl: line 3: missing years: 'a few' has no number in it$",
        ),
        (
            {"field": "skills", "value": "SQL", "verdict": "correct"},
            r"judgments.jsonl: line 3: 'record_id' must be",
        ),
        ({"record_id": 1, "field": "skills", "verdict": "correct"}, r"judgments.jsonl: line 3: no value"),
    ],
)
def test_a_bad_line_is_one_error_with_its_line_and_nothing_of_the_file_is_imported(
    untouched: JobSpec, tmp_path: Path, line: Any, said: str
) -> None:
    path = write_lines(tmp_path / "judgments.jsonl", [GOOD[0], "", line, GOOD[1]])
    with pytest.raises(ConfigError, match=said):
        import_judgments(untouched, path, judge="ann")
    assert judgment_rows(untouched.database) == []


def test_the_gold_file_holds_the_settled_fields_of_each_judged_record(spec: JobSpec, tmp_path: Path) -> None:
    model_says = {
        "record_id": 2,
        "field": "title",
        "value": "Title 2",
        "verdict": "wrong",
        "judge": model_judge("m"),
    }
    import_judgments(spec, write_lines(tmp_path / "judgments.jsonl", [*GOOD, model_says]), judge="ann")
    gold_path = tmp_path / "gold.jsonl"
    export = export_gold(spec, gold_path)
    assert (export.records, export.judged_records, export.judges) == (1, 2, ("ann", "bob"))
    lines = [orjson.loads(line) for line in gold_path.read_text().splitlines()]
    # Record 2: its Python was not judged (skills not settled), the model's title does not count.
    # Record 1's high was judged wrong, and nothing right is known of it: not null, but what it is not.
    assert lines == [
        {
            "id": "1",
            "title": "Title 1",
            "skills": ["SQL", "Excel"],
            "years": 1,
            "low": 0,
            JUDGED_WRONG: {"high": [0]},
        }
    ]
    gold = read_gold(gold_path, spec.source.id_column, spec.schema_class)
    assert set(gold.records) == {"1"} and gold.records["1"][JUDGED_WRONG] == {"high": [0]}
    with pytest.raises(ConfigError, match="no judged record has a field every value of which is judged"):
        export_gold(spec, tmp_path / "bob.jsonl", judges=["bob"])  # bob judged SQL, not Python
    by_model = export_gold(spec, tmp_path / "model.jsonl", judges=[model_judge("m")])
    assert by_model.judges == ("model:m",)
    assert orjson.loads((tmp_path / "model.jsonl").read_text()) == {
        "id": "2",
        JUDGED_WRONG: {"title": ["Title 2"]},
    }


def test_nothing_to_export_or_a_file_eval_cannot_read_is_refused(untouched: JobSpec, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no judgments by a person to export"):
        export_gold(untouched, tmp_path / "gold.jsonl")
    with pytest.raises(ConfigError, match=r"--export-gold .*gold.csv: a gold file is JSON lines"):
        export_gold(untouched, tmp_path / "gold.csv")
    assert not (tmp_path / "gold.jsonl").exists()
