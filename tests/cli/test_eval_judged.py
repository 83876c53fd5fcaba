"""`pipeline eval JOB --judged`: the printed report, --json, --html, --variants A,B and bad input (exit 2,
one line). The database is a real run's (variants main, b and c: records 0 and 8-11 extracted), with
judgments written by the store: ann judged records 0, 8 and 9 of main (Python wrong in 0 and 8) and b
(all right), a model judge all five of main (Python always wrong); nobody judged c."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.job.commands import program
from pipeline.job.spec import JobSpec
from pipeline.quality.judgments import Judgment, JudgmentVerdict, model_judge
from pipeline.store.judgments import record_judgments
from pipeline.store.opening import prepare_database
from tests.support.outputs import job_with_outputs, run_scripted

CORRECT, WRONG = JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG
MODEL = model_judge("judge-model")
DATA_SCRIPT = re.compile(r'<script type="application/json" id="review-data">(.*?)</script>', re.DOTALL)


def judged(records: list[str], variant: str, judge: str, python: JudgmentVerdict) -> list[Judgment]:
    made = []
    for record in records:
        made += [
            Judgment(record, variant, "title", f"Title {record}", CORRECT, judge),
            Judgment(record, variant, "skills", "SQL", CORRECT, judge),
            Judgment(record, variant, "skills", "Python", python, judge),
        ]
    return made


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    spec = job_with_outputs(tmp_path_factory.mktemp("judged"))
    run_scripted(spec.for_variant("b"))
    run_scripted(spec.for_variant("c"))
    people = ["0", "8", "9"]
    connection = prepare_database(spec)
    try:
        record_judgments(
            connection,
            spec,
            [
                *judged(["0", "8"], "main", "ann", WRONG),
                *judged(["9"], "main", "ann", CORRECT),
                *judged(people, "b", "ann", CORRECT),
                *judged(["0", "8", "9", "10", "11"], "main", MODEL, WRONG),
            ],
        )
    finally:
        connection.close()
    return spec


def cli(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(arg) for arg in args])
    return result.exit_code, result.stdout, result.stderr


def as_json(out: str) -> Any:
    return orjson.loads(out)


def test_the_report_prints_precision_per_field_what_it_covers_and_the_model_beside_people(
    job: JobSpec,
) -> None:
    code, out, err = cli("eval", job.source_file, "--judged")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "variant main: 3 records judged by person (ann)"
    skills = next(line for line in lines if line.startswith("skills "))
    assert skills.split()[:4] == ["skills", "6", "4", "0.667"]
    assert skills.endswith("misses not marked")
    assert next(line for line in lines if line.startswith("overall ")).split()[:4] == [
        "overall",
        "9",
        "7",
        "0.778",
    ]
    assert "the 5 records of variant main with a result" in out
    assert f"model judge {MODEL} on 5 records (people on 3 of them): agrees with people on 8 of the 9" in out
    assert any(line.startswith("field ") and "combined [95%]" in line for line in lines)


def test_json_has_precision_per_field_overall_and_the_model_section(job: JobSpec) -> None:
    code, out, err = cli("eval", job.source_file, "--judged", "--json")
    assert (code, err) == (0, "")
    data = as_json(out)
    precision = data["fields"]["skills"]["precision"]
    assert (precision["value"], precision["judged"], precision["correct"]) == (pytest.approx(2 / 3), 6, 4)
    assert len(precision["ci"]) == 2
    assert data["overall"]["precision"]["value"] == pytest.approx(7 / 9)
    assert data["fields"]["skills"]["recall"] is None
    assert data["population"]["records"] == 5
    model = data["model"]
    assert model["judge"] == MODEL and model["agreement"]["share"] == pytest.approx(8 / 9)
    assert set(model["combined"]["overall"]) >= {"value", "ci", "lambda", "records", "model_alone"}


def test_two_variants_get_b_minus_a_and_a_verdict_per_field(job: JobSpec) -> None:
    code, out, err = cli("eval", job.source_file, "--judged", "--variants", "main,b", "--json")
    assert (code, err) == (0, "")
    data = as_json(out)
    assert data["variants"] == {"a": "main", "b": "b"} and data["records"] == 3
    difference = data["fields"]["skills"]["difference"]
    assert set(difference) >= {"metric", "value", "ci", "verdict", "records_needed"}
    assert (difference["metric"], difference["value"]) == ("precision", pytest.approx(1 / 3))
    assert data["overall"]["difference"]["verdict"] in {"better", "no detectable difference"}
    code, out, _ = cli("eval", job.source_file, "--judged", "--variants", "main,b")
    assert code == 0 and out.startswith("b (B) against main (A): precision judged by person (ann)")


def test_html_writes_the_page_with_the_same_numbers(job: JobSpec, tmp_path: Path) -> None:
    page = tmp_path / "judged.html"
    code, out, err = cli("eval", job.source_file, "--judged", "--json", "--html", page)
    assert code == 0 and as_json(out)["records"] == 3
    assert err == f"wrote {page} (3 records)\n"  # with --json, stdout is the JSON alone
    match = DATA_SCRIPT.search(page.read_text())
    assert match is not None
    data = json.loads(match.group(1))
    scores = {(row["path"], row["metric"]): row for row in data["scores"]}
    assert scores[("skills", "precision")]["value"] == pytest.approx(2 / 3)
    assert ("overall", f"precision (people + {MODEL})") in scores
    assert [record["id"] for record in data["records"]] == ["0", "8", "9"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--variant", "c"], "no judgments for variant c yet: run `{program} judge {job} --variant c` first"),
        (["--variant", "nothing"], "variant 'nothing' has no results"),
        (["--gold", "gold.jsonl"], "--judged measures against judgments, --gold against a gold file"),
        (["--judge", "cy"], "--judge 'cy': no judgment of variant main by that judge (judges: ann, model:"),
        (["--fuzzy", "90"], "--judged takes no --fuzzy (options of matching a gold file)"),
        (["--variants", "main,c"], "no judgments for variant c yet"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(job: JobSpec, args: list[str], message: str) -> None:
    code, out, err = cli("eval", job.source_file, "--judged", *args)
    assert code == 2 and out == ""
    said = message.format(job=shlex.quote(str(job.source_file)), program=shlex.join(program()))
    assert err.count("\n") == 1 and said in err


def test_eval_needs_a_gold_file_or_judgments_and_judge_only_with_judgments(job: JobSpec) -> None:
    code, _, err = cli("eval", job.source_file)
    assert code == 2 and "give --gold FILE (a gold file) or --judged" in err
    code, _, err = cli("eval", job.source_file, "--gold", "gold.jsonl", "--judge", "ann")
    assert code == 2 and "--judge chooses whose judgments count: give it with --judged" in err
