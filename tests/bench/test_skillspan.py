"""The SkillSpan job: the CoNLL converter, the schema, the job file and the few-shot examples."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from pydantic import ValidationError

from pipeline.bench.skillspan import ConvertReport, collect, convert, file_key, is_skipped, main, read_conll
from pipeline.errors import ConfigError
from pipeline.job.commands import command
from pipeline.job.spec import load_job, template_fields
from schemas.linkedin import JobPosting
from schemas.skillspan import SkillMentions
from tests.support.processes import REPO
from tests.support.skillspan_fixture import POSTINGS_CONLL, SENTENCES_CONLL

DATASET = REPO.parent / "shared" / "datasets" / "skillspan"
DEV_FILES = [DATASET / "skillspan_house_dev.conll", DATASET / "skillspan_tech_dev.conll"]

EXPECTED_RECORDS = [
    {"id": "toy_dev-000000", "text": "We offer a friendly team in <LOCATION> ."},
    {"id": "toy_dev-000001", "text": "You will design data pipelines and work in a team ."},
    {"id": "toy_dev-000004", "text": "Knowledge of Python , SQL and Python ."},
    {"id": "toy_dev-000005", "text": "Motivated hardworking people who manage budgets communicate clearly ."},
    {"id": "toy_dev-000006", "text": "Experience with Linux"},
]
EXPECTED_GOLD = [
    {"id": "toy_dev-000000", "skills": [], "knowledge": []},
    {
        "id": "toy_dev-000001",
        "skills": ["design data pipelines", "work in a team"],
        "knowledge": ["data pipelines"],
    },
    {"id": "toy_dev-000004", "skills": [], "knowledge": ["Python", "SQL"]},
    {
        "id": "toy_dev-000005",
        "skills": ["Motivated", "hardworking", "manage budgets", "communicate clearly"],
        "knowledge": [],
    },
    {"id": "toy_dev-000006", "skills": [], "knowledge": ["Linux"]},
]


def write(folder: Path, text: str, name: str = "skillspan_toy_dev.conll") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_converts_the_fixture_to_exact_records_and_gold(tmp_path: Path) -> None:
    report = convert([write(tmp_path, SENTENCES_CONLL)], tmp_path / "out")
    assert report == ConvertReport(
        records_path=tmp_path / "out" / "records.jsonl",
        gold_path=tmp_path / "out" / "gold.jsonl",
        unit="sentence",
        records=5,
        skills=6,
        knowledge=5,  # 'Python' twice in sentence 4 counts twice: spans, not distinct strings
        skipped=2,
        skipped_skills=0,
        skipped_knowledge=1,
        repaired=0,
    )
    assert read_jsonl(report.records_path) == EXPECTED_RECORDS
    assert read_jsonl(report.gold_path) == EXPECTED_GOLD
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["gold.jsonl", "records.jsonl"]


def test_windows_line_ends_read_the_same(tmp_path: Path) -> None:
    conversion = collect([write(tmp_path, SENTENCES_CONLL.replace("\n", "\r\n"))])
    assert [record.text for record in conversion.records] == [row["text"] for row in EXPECTED_RECORDS]
    assert [list(record.skills) for record in conversion.records] == [row["skills"] for row in EXPECTED_GOLD]


def test_postings_are_the_units_between_separator_lines(tmp_path: Path) -> None:
    report = convert([write(tmp_path, POSTINGS_CONLL)], tmp_path / "out", unit="posting")
    assert read_jsonl(report.records_path) == [
        {"id": "toy_dev-000000", "text": "You will write reports\nExcel is used to write reports"},
        {"id": "toy_dev-000001", "text": "We use Excel\nWelcome"},
    ]
    assert read_jsonl(report.gold_path) == [
        {"id": "toy_dev-000000", "skills": ["write reports"], "knowledge": ["Excel"]},
        {"id": "toy_dev-000001", "skills": [], "knowledge": ["Excel"]},
    ]
    assert (report.records, report.skills, report.knowledge, report.skipped) == (2, 2, 2, 0)


def test_separator_lines_also_end_sentences(tmp_path: Path) -> None:
    conversion = collect([write(tmp_path, POSTINGS_CONLL)])
    assert [(record.id, record.text) for record in conversion.records] == [
        ("toy_dev-000000", "You will write reports"),
        ("toy_dev-000001", "Excel is used to write reports"),
        ("toy_dev-000002", "We use Excel"),
    ]
    assert conversion.skipped == 1  # 'Welcome'


def test_a_token_row_starting_with_hashes_is_a_token(tmp_path: Path) -> None:
    conversion = collect([write(tmp_path, "###\tO\tO\nC#\tO\tB-Knowledge\nrocks\tO\tO\n")], unit="sentence")
    assert [(record.text, record.knowledge) for record in conversion.records] == [("### C# rocks", ("C#",))]


def test_postings_need_separator_lines(tmp_path: Path) -> None:
    path = write(tmp_path, SENTENCES_CONLL)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: no '###' lines separate its postings"):
        convert([path], tmp_path / "out", unit="posting")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "We\tO\tO\nneed\tO\n",
            2,
            "expected 3 tab-separated columns (token, skill tag, knowledge tag), got 2",
        ),
        ("We\tO\tO\tO\n", 1, "expected 3 tab-separated columns (token, skill tag, knowledge tag), got 4"),
        ("We\tO\tO\nneed\tI-Skill\tO\n", 2, "I-Skill without B-Skill before it in the sentence"),
        ("We\tO\tO\nuse\tO\tO\nSQL\tO\tI-Knowledge\n", 3, "I-Knowledge without B-Knowledge before it"),
        (
            "write\tB-Skill\tO\n\nreports\tI-Skill\tO\n",
            3,
            "I-Skill without B-Skill",
        ),  # spans end with sentences
        ("We\tO\tO\nuse\tB-Knowledge\tO\n", 2, "unknown skill tag 'B-Knowledge' in column 2"),
        ("We\tO\tB-Skill\n", 1, "unknown knowledge tag 'B-Skill' in column 3 (expected O, B-Knowledge or"),
        ("We\tO\tO\n \tO\tO\n", 2, "empty token"),
    ],
)
def test_bad_input_names_the_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"^{re.escape(f'{path}:{line}: {message}')}"):
        convert([path], tmp_path / "out")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "skillspan_nope.conll"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(missing))}: no such file$"):
        convert([write(tmp_path, SENTENCES_CONLL), missing], tmp_path / "out")


def test_two_files_with_one_stem_would_share_ids(tmp_path: Path) -> None:
    first = write(tmp_path, SENTENCES_CONLL)
    (tmp_path / "copy").mkdir()
    second = write(tmp_path / "copy", SENTENCES_CONLL)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(second))}: its records would get the same ids"):
        collect([first, second])


def test_lenient_reads_an_inside_tag_without_begin_as_begin(tmp_path: Path) -> None:
    path = write(tmp_path, "We\tO\tO\nwrite\tI-Skill\tO\nreports\tI-Skill\tO\nand\tO\tO\ntest\tI-Skill\tO\n")
    parsed = read_conll(path, lenient=True)
    assert parsed.repaired == 2
    assert parsed.postings[0][0].skills == ("write reports", "test")


def test_bad_input_leaves_earlier_output_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert([write(tmp_path, SENTENCES_CONLL)], out)
    before = (out / "records.jsonl").read_bytes(), (out / "gold.jsonl").read_bytes()
    with pytest.raises(ConfigError):
        convert([write(tmp_path, "We\tO\tO\nneed\tI-Skill\tO\n", "skillspan_bad.conll")], out)
    assert ((out / "records.jsonl").read_bytes(), (out / "gold.jsonl").read_bytes()) == before


def test_a_new_conversion_replaces_the_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert([write(tmp_path, SENTENCES_CONLL)], out)
    convert([write(tmp_path, POSTINGS_CONLL, "skillspan_other.conll")], out)
    assert [row["id"] for row in read_jsonl(out / "gold.jsonl")] == [
        "other-000000",
        "other-000001",
        "other-000002",
    ]
    assert sorted(path.name for path in out.iterdir()) == ["gold.jsonl", "records.jsonl"]


@pytest.mark.parametrize(
    ("tokens", "skipped"),
    [
        (["Python", "."], True),
        (["<NAME>", "<CONTACT>", "<ADDRESS>"], True),
        (["<ORGANIZATION>", ",", "<LOCATION>", "."], True),
        (["<ORGANIZATION>", "hires", "engineers"], False),
        (["Java", "Python", "Go"], False),
    ],
)
def test_skipped_units(tokens: list[str], skipped: bool) -> None:
    assert is_skipped(tokens) is skipped


def test_file_key() -> None:
    assert file_key(Path("../x/skillspan_house_dev.conll")) == "house_dev"
    assert file_key(Path("mine.conll")) == "mine"


def test_cli_prints_the_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main([str(write(tmp_path, SENTENCES_CONLL)), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (
        "records 5  skills 6  knowledge 5  skipped 2 sentences (under 3 tokens or only placeholders; "
        "0 skill and 1 knowledge spans)"
    )
    assert printed[1:3] == [f"records: {out / 'records.jsonl'}", f"gold:    {out / 'gold.jsonl'}"]
    load = command("load", str(out / "records.jsonl"), "--job", "jobs/skillspan.yaml")
    assert printed[3] == f"next:    {load}"  # the program by its path: pasted outside the virtualenv too


def test_cli_bad_input_is_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "We\tO\tO\nneed\tI-Skill\tO\n")
    assert main([str(path), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err
        == f"error: {path}:2: I-Skill without B-Skill before it in the sentence (--lenient reads it as B-)\n"
    )


@pytest.mark.process
def test_python_dash_m_entry_point(tmp_path: Path) -> None:
    missing = tmp_path / "skillspan_nope.conll"
    completed = subprocess.run(
        [sys.executable, "-m", "pipeline.bench.skillspan", str(missing), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert (completed.returncode, completed.stdout, completed.stderr) == (
        2,
        "",
        f"error: {missing}: no such file\n",
    )


def _independent_spans(path: Path) -> tuple[Counter[str], list[dict[str, list[str]]]]:
    """B- tags counted per kind, and each sentence's distinct spans, read without the converter."""
    begins: Counter[str] = Counter()
    sentences: list[dict[str, list[str]]] = []
    for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8").strip()):
        spans: dict[str, list[str]] = {"skills": [], "knowledge": []}
        for kind, column in (("skills", 1), ("knowledge", 2)):
            current: list[str] = []
            for row in [line.split("\t") for line in block.splitlines()] + [["", "O", "O"]]:
                if not row[column].startswith("I-") and current:
                    spans[kind].append(" ".join(current))
                    current = []
                if row[column] != "O":
                    begins[row[column]] += row[column].startswith("B-")
                    current.append(row[0].strip())
            spans[kind] = list(dict.fromkeys(spans[kind]))
        sentences.append(spans)
    return begins, sentences


@pytest.mark.skipif(not all(path.is_file() for path in DEV_FILES), reason="no ../shared/datasets/skillspan")
def test_real_dev_files_keep_every_span(tmp_path: Path) -> None:
    report = convert(DEV_FILES, tmp_path)
    gold = {row["id"]: row for row in read_jsonl(report.gold_path)}
    texts = {row["id"]: row["text"] for row in read_jsonl(report.records_path)}
    begins: Counter[str] = Counter()
    for path in DEV_FILES:
        counted, sentences = _independent_spans(path)
        begins += counted
        for index, spans in enumerate(sentences):
            record = gold.get(f"{file_key(path)}-{index:06d}")
            if record is not None:  # the others were skipped
                assert (record["skills"], record["knowledge"]) == (spans["skills"], spans["knowledge"])
    assert report.skills + report.skipped_skills == begins["B-Skill"] == 525 + 545
    assert report.knowledge + report.skipped_knowledge == begins["B-Knowledge"] == 287 + 806
    assert report.records == len(gold) == len(texts) > 2000
    for record_id, record in gold.items():
        assert all(span in texts[record_id] for span in record["skills"] + record["knowledge"])


# The schema -----------------------------------------------------------------------------------


def test_schema_marks_both_fields_grounded() -> None:
    properties = SkillMentions.model_json_schema()["properties"]
    assert (properties["skills"]["grounded"], properties["knowledge"]["grounded"]) == (True, True)
    assert properties["skills"]["description"].startswith("What a person can DO")
    assert properties["knowledge"]["description"].startswith("What a person KNOWS")


def test_schema_strips_and_keeps_each_span_once() -> None:
    mentions = SkillMentions.model_validate(
        {"skills": [" manage budgets", "manage budgets"], "knowledge": ["Python", "python"]}
    )
    assert (mentions.skills, mentions.knowledge) == (["manage budgets"], ["Python", "python"])


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"skills": []}, "knowledge\n  Field required"),
        ({"skills": [], "knowledge": [], "tools": []}, "Extra inputs are not permitted"),
        ({"skills": ["x" * 201], "knowledge": []}, "at most 200 characters"),
        ({"skills": [""], "knowledge": []}, "at least 1 character"),
        ({"skills": [], "knowledge": [f"k{n}" for n in range(41)]}, "at most 40 items"),
    ],
)
def test_schema_rejects(answer: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        SkillMentions.model_validate(answer)


# The examples and the job ------------------------------------------------------------------------


def examples(name: str) -> list[dict[str, Any]]:
    return read_jsonl(REPO / "jobs" / "examples" / f"{name}.jsonl")


def test_skillspan_examples_are_valid_verbatim_and_varied() -> None:
    rows = examples("skillspan")
    assert 4 <= len(rows) <= 6
    kinds = set()
    for row in rows:
        assert list(row["input"]) == ["text"]
        answer = SkillMentions.model_validate(row["output"])
        assert answer.model_dump() == row["output"]  # nothing the validators would change
        for span in answer.skills + answer.knowledge:
            assert span in row["input"]["text"], span
        kinds.add((bool(answer.skills), bool(answer.knowledge)))
    assert kinds == {(False, False), (True, False), (False, True), (True, True)}


def test_linkedin_examples_are_complete_exemplary_postings() -> None:
    rows = examples("linkedin")
    assert len(rows) == 2
    for row in rows:
        assert list(row["input"]) == ["title", "company", "location", "description"]
        assert 600 <= len(row["input"]["description"]) <= 900
        posting = JobPosting.model_validate(row["output"])
        assert posting.model_dump(mode="json") == row["output"]  # every field given, nothing to clean
        for skill in posting.explicit_skills:
            assert skill in row["input"]["description"], skill
        assert len(posting.requirements) >= 5 and posting.seniority != "Unspecified"


def job_file() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "jobs" / "skillspan.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_job_file_fits_the_converter_and_the_examples() -> None:
    job = job_file()
    assert (job["name"], job["database"], job["schema"]) == (
        "skillspan",
        "../data/skillspan.duckdb",
        "schemas.skillspan:SkillMentions",
    )
    assert job["source"] == {"table": "sentences", "id_column": "id", "fields": ["text"]}
    assert template_fields(job["prompt"]["user"]) == ["text"]
    assert (REPO / "jobs" / job["prompt"]["examples_file"]).is_file()
    assert job["variants"] == {"zero-shot": {"prompt": {"examples_file": None, "examples": []}}}
    assert (job["max_tokens"], job["reasoning_effort"]) == (1024, "low")


def test_job_loads_with_its_examples() -> None:
    spec = load_job(REPO / "jobs" / "skillspan.yaml")
    assert spec.schema_class is SkillMentions
    assert [example.input["text"] for example in spec.prompt.examples] == [
        row["input"]["text"] for row in examples("skillspan")
    ]
