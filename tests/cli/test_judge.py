"""``pipeline judge`` through the command line: the page as a real process (killed with -9 after a
judgment: it is in the table), bad input (one line, exit 2, nothing written), import and export, and
the exported gold file read back by ``pipeline eval --gold``."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
from pathlib import Path

import httpx2
import pytest

from pipeline.job.commands import command, program
from pipeline.job.spec import JobSpec
from tests.support.cli import cli_run, error_line
from tests.support.judging import free_port, judge_process, judging_job, judgment_rows
from tests.support.variants import two_variant_job

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """One job for the tests that write nothing (they check they did not)."""
    return judging_job(tmp_path_factory.mktemp("judge-cli"))


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return judging_job(tmp_path)


def test_the_page_is_served_and_a_judgment_survives_kill_9(spec: JobSpec) -> None:
    with judge_process(spec.source_file, "--judge", "ann") as judge:
        assert re.fullmatch(
            r"judging 9 records of variant main at http://127\.0\.0\.1:\d+/ \(Ctrl-C to stop\)", judge.line
        )
        page = httpx2.get(judge.url)
        assert page.status_code == 200 and "Judging" in page.text
        answer = httpx2.post(judge.url + "api/judge", json={"record": 0, "item": 1, "verdict": "wrong"})
        assert answer.status_code == 200 and answer.json()["saved"] == "written"
        os.killpg(judge.process.pid, signal.SIGKILL)
        judge.process.wait(timeout=10)
    assert judgment_rows(spec.database) == [("1", "main", "skills", "SQL", "wrong", "ann")]


def test_ctrl_c_stops_the_page_with_exit_0(judged: JobSpec) -> None:
    with judge_process(judged.source_file) as judge:
        os.killpg(judge.process.pid, signal.SIGINT)
        assert judge.process.wait(timeout=10) == 0


def test_two_variants_are_judged_blind(tmp_path: Path) -> None:
    spec = two_variant_job(tmp_path)
    with judge_process(spec.source_file, "--variants", "main,big", "--sample", "4", "--seed", "7") as judge:
        assert judge.line.startswith("judging 3 records of variants main and big, blind, at http://")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--sample", "500"), "error: --sample 500: variant main has 9 results"),
        (("--variant", "big"), "variant 'big' has no results (variants with results: main)"),
        (
            ("--variants", "main"),
            "error: --variants 'main': give exactly 2 variant names, separated by commas",
        ),
        (("--variants", "main,main"), "error: --variants 'main,main': give exactly 2 different variants"),
        (("--variant", "main", "--variants", "main,big"), "error: give --variant or --variants, not both"),
        (
            ("--import", "a.jsonl", "--export-gold", "b.jsonl"),
            "error: give one of --import, --export-gold and --by-model (or --judge-model)",
        ),
        (
            ("--by-model", "--import", "a.jsonl"),
            "error: give one of --import, --export-gold and --by-model (or --judge-model)",
        ),
        (
            ("--judge-model", "other", "--export-gold", "b.jsonl"),
            "error: give one of --import, --export-gold and --by-model (or --judge-model)",
        ),
        (("--by-model", "--judge-model", " "), "error: --judge-model: give a model name"),
        (
            ("--endpoint", "http://gpu-box:8000/v1"),
            "error: --endpoint is the judge model's server: give it with --by-model or --judge-model",
        ),
        (("--by-model", "--endpoint", "gpu-box:8000"), "error: --endpoint: must start with http://"),
        # --model names the model that extracts in run, status and check: here, what to give instead.
        (
            ("--model",),
            "error: judge has no --model (in run, status and check it names the model that extracts): "
            "give --by-model to have the job's judge model judge the sample, --judge-model NAME for another",
        ),
        (
            ("--model", "--sample", "5"),
            "give --by-model to have the job's judge model judge the sample",
        ),
        (
            ("--model", "gpt-oss-120b"),
            "give --judge-model gpt-oss-120b to have gpt-oss-120b judge the sample",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(judged: JobSpec, args: tuple[str, ...], said: str) -> None:
    result = cli_run("judge", str(judged.source_file), "--port", "0", *args)
    assert result.exit_code == 2
    assert said in error_line(result)
    assert judgment_rows(judged.database) == []


def test_a_port_in_use_is_said_with_what_to_do(judged: JobSpec) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli_run("judge", str(judged.source_file), "--port", str(port))
    assert result.exit_code == 2
    assert error_line(result) == f"error: port {port} is in use: give another with --port"
    assert free_port() > 0


def test_an_import_with_a_bad_line_imports_nothing(judged: JobSpec, tmp_path: Path) -> None:
    path = tmp_path / "judgments.jsonl"
    good = {"record_id": 1, "field": "skills", "value": "SQL", "verdict": "correct"}
    bad = {"record_id": 1, "field": "skils", "value": "SQL", "verdict": "correct"}
    gone = {"record_id": 77, "field": "skills", "value": "SQL", "verdict": "correct"}
    path.write_text("\n".join(json.dumps(line) for line in [good, good, bad]) + "\n")
    result = cli_run("judge", str(judged.source_file), "--import", str(path))
    assert result.exit_code == 2
    assert error_line(result) == f"error: {path}: line 3: unknown field 'skils' (did you mean 'skills'?)"
    path.write_text(json.dumps(gone) + "\n")
    result = cli_run("judge", str(judged.source_file), "--import", str(path))
    assert result.exit_code == 2 and "record '77' has no result of variant 'main'" in error_line(result)
    assert judgment_rows(judged.database) == []


def test_judgments_imported_export_a_gold_file_that_eval_reads(spec: JobSpec, tmp_path: Path) -> None:
    lines = [
        {"record_id": number, "field": field, "value": value, "verdict": verdict}
        for number in (1, 2, 4)
        for field, value, verdict in [
            ("title", f"Title {number}", "correct"),
            ("skills", "SQL", "correct"),
            ("skills", "Python", "wrong" if number == 2 else "correct"),
            ("years", number, "correct"),
            ("low", 0, "correct"),
            ("high", 0, "correct"),
        ]
    ]
    lines.append({"record_id": 4, "field": "skills", "value": "Excel", "verdict": "missing"})
    path = tmp_path / "judgments.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    imported = cli_run("judge", str(spec.source_file), "--import", str(path), "--judge", "ann")
    assert imported.exit_code == 0, imported.output
    said = "added, 0 replaced (another verdict), 0 left as they were"
    assert imported.stdout.strip() == f"imported 19 judgments from {path} (ann: 19): 19 {said}"
    again = cli_run("judge", str(spec.source_file), "--import", str(path), "--judge", "ann")
    assert again.stdout.strip().endswith(": 0 added, 0 replaced (another verdict), 19 left as they were")
    assert len(judgment_rows(spec.database)) == 19  # imported twice, counted once
    gold = tmp_path / "gold.jsonl"
    exported = cli_run("judge", str(spec.source_file), "--export-gold", str(gold))
    assert exported.exit_code == 0, exported.output
    assert exported.stdout.splitlines()[0] == f"wrote {gold}: 3 gold records, judged by ann"
    check = exported.stdout.splitlines()[1].removeprefix("check:  ")
    assert check == command("eval", str(spec.source_file), "--gold", str(gold))  # pasted anywhere
    evaluated = cli_run(*shlex.split(check)[len(program()) :], "--json")  # the command as printed
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    scores = report["fields"]
    assert report["records"] == 3
    assert scores["title"]["accuracy"] == 1.0 and scores["years"]["accuracy"] == 1.0
    skills = scores["skills"]
    # 6 extracted, 5 right (record 2's Python is wrong); 6 right in all (record 4's Excel was missed).
    assert (skills["tp"], skills["fp"], skills["fn"]) == (5, 1, 1)
    assert skills["precision"] == pytest.approx(5 / 6) and skills["recall"] == pytest.approx(5 / 6)


#: Every value of records 1, 2, 4 and 5 judged (title, SQL, Python, years, low, high), some wrong, a skill
#: missed in record 2: what a judge finishing those records says.
ROUND_TRIP = {
    1: {
        "title": "correct",
        "SQL": "correct",
        "Python": "wrong",
        "years": "correct",
        "low": "correct",
        "high": "wrong",
    },
    2: {
        "title": "wrong",
        "SQL": "correct",
        "Python": "correct",
        "years": "wrong",
        "low": "correct",
        "high": "correct",
    },
    4: dict.fromkeys(("title", "SQL", "Python", "years", "low", "high"), "correct"),
    5: {
        "title": "correct",
        "SQL": "wrong",
        "Python": "wrong",
        "years": "correct",
        "low": "wrong",
        "high": "correct",
    },
}


def test_judged_then_exported_then_eval_gold_gives_the_precision_eval_judged_gives(
    spec: JobSpec, tmp_path: Path
) -> None:
    lines = [
        {
            "record_id": number,
            "field": "skills" if name in ("SQL", "Python") else name,
            "value": name
            if name in ("SQL", "Python")
            else {"title": f"Title {number}", "years": number}.get(name, 0),
            "verdict": verdict,
        }
        for number, said in ROUND_TRIP.items()
        for name, verdict in said.items()
    ]
    lines.append({"record_id": 2, "field": "skills", "value": "Excel", "verdict": "missing"})
    path = tmp_path / "judgments.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert cli_run("judge", str(spec.source_file), "--import", str(path), "--judge", "ann").exit_code == 0
    gold = tmp_path / "gold.jsonl"
    assert cli_run("judge", str(spec.source_file), "--export-gold", str(gold)).exit_code == 0
    by_gold = json.loads(cli_run("eval", str(spec.source_file), "--gold", str(gold), "--json").stdout)
    by_judgments = json.loads(cli_run("eval", str(spec.source_file), "--judged", "--json").stdout)
    # 24 values: 7 judged wrong. Both count each value judged correct right, each judged wrong wrong.
    assert by_judgments["overall"]["precision"]["value"] == pytest.approx(17 / 24)
    assert by_gold["micro"]["precision"] == pytest.approx(17 / 24)
    assert (by_gold["micro"]["tp"], by_gold["micro"]["fp"]) == (17, 7)
    judged_fields, gold_fields = by_judgments["fields"], by_gold["fields"]
    assert gold_fields["skills"]["precision"] == judged_fields["skills"]["precision"]["value"] == 5 / 8
    assert gold_fields["skills"]["recall"] == judged_fields["skills"]["recall"]["value"] == 5 / 6
    for scalar in ("title", "years", "low", "high"):  # a scalar's accuracy: its values judged right
        assert gold_fields[scalar]["accuracy"] == judged_fields[scalar]["precision"]["value"] == 3 / 4
    # The values judged wrong are not nulls in the gold file: what they are not.
    exported = [json.loads(line) for line in gold.read_text().splitlines()]
    assert exported[1] == {
        "id": "2",
        "skills": ["SQL", "Python", "Excel"],
        "low": 0,
        "high": 0,
        "_judged_wrong": {"title": ["Title 2"], "years": [2]},
    }
    assert all(None not in record.values() for record in exported)
