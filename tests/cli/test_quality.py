"""`pipeline eval`, `pipeline compare`, `pipeline review`: the printed reports, --json, the review page
(opened in headless Chromium), and exit codes: 2 with one line for bad input, 3 while a run holds the
database. Databases are made by real runs of two variants (tests/support/variants.py)."""

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
from tests.support.browser import Element, dump_dom, parse_dom, require_browser
from tests.support.jobs import table_rows
from tests.support.outputs import database_held_by_another_process
from tests.support.processes import sim_server
from tests.support.variants import (
    PARTIAL_GOLD,
    SAMPLE,
    approx,
    main_answer,
    run_variant,
    two_variant_job,
    variants_job,
    write_gold,
)

DATA_SCRIPT = re.compile(r'<script type="application/json" id="review-data">(.*?)</script>', re.DOTALL)

PROGRAM = shlex.join(program())  # how a hint names the pipeline program


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    return two_variant_job(tmp_path_factory.mktemp("variants"))


@pytest.fixture
def gold(tmp_path: Path) -> Path:
    return write_gold(tmp_path / "gold.jsonl", PARTIAL_GOLD)


def cli(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(arg) for arg in args])
    return result.exit_code, result.stdout, result.stderr


def page_data(path: Path) -> Any:
    match = DATA_SCRIPT.search(path.read_text())
    assert match is not None
    return json.loads(match.group(1))


def opened(path: Path) -> Element:
    require_browser()
    return parse_dom(dump_dom(path))


def card_ids(dom: Element) -> list[str]:
    return [card.attrs["data-record-id"] for card in dom.find_all("article", cls="card")]


# --- eval -------------------------------------------------------------------------------------------


def test_eval_prints_the_table_grounding_and_every_missing_gold_record(job: JobSpec, gold: Path) -> None:
    code, out, err = cli("eval", job.source_file, "--gold", gold)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"variant main against {gold} (6 gold records)"
    (row,) = [line for line in lines if line.startswith("skills  ")]
    assert row.split() == ["skills", "list", "3", "0.667", "0.800", "0.727", "0.722"]
    # the row under a field's scores holds their 95% intervals (3 records: wide)
    assert lines[lines.index(row) + 1].split() == ["0.500-1.000"] * 4
    # one record, or every record alike, gives no interval: not certainty, too small a sample
    (title,) = [line for line in lines if line.startswith("title  ")]
    assert title.split() == ["title", "text", "1", "1.000", "1.000"]
    assert lines[lines.index(title) + 1].split() == ["sample", "too", "small"] * 2
    # TP 7, FP 3, FN 2 and macro (1 + 8/11 + 2/3) / 3: see test_reports' partial gold test
    micro = (
        "micro P 0.700 [0.333-1.000]  R 0.778 [0.500-1.000]  F1 0.737 [0.400-1.000]  "
        "(pooled over every value: 7 TP, 3 FP, 2 FN; a scalar counts once)"
    )
    macro = "macro 0.798 [0.333-1.000]  (mean of each field's F1 or accuracy, 3 fields)"
    assert lines[lines.index(micro) + 1] == macro
    assert lines[lines.index(micro) + 2] == (
        "95% intervals: percentile bootstrap over records, 1,000 resamples, seed 0 "
        "(the row under a field's scores; [low-high]; sample too small: every resample gave the same "
        "score, as one record does)"
    )
    assert lines[-7:] == [
        "grounding of main over the 3 scored records (values of grounded fields found in the record text):",
        "  skills: 6 of 6 values found in the text (100%)",
        "",
        "gold records without a result of main: 3",
        "  failed (schema_invalid): 1 (9)",
        "  not extracted yet: 1 (50)",
        "  not in the source: 1 (77)",
    ]


def test_eval_json_is_one_object_with_the_report_and_what_is_missing(job: JobSpec, gold: Path) -> None:
    code, out, _ = cli(
        "eval", job.source_file, "--gold", gold, "--json", "--variant", "big", "--tolerance", "0.5"
    )
    assert code == 0
    data = orjson.loads(out)
    keys = {
        "records",
        "fields",
        "micro",
        "macro",
        "missing",
        "matching",
        "variant",
        "gold",
        "grounding",
        "failed",
    }
    assert keys <= set(data)
    # big has 9 too; skills: 42 right, 1 [SQL, Python] for [SQL, Excel], 2 [SQL] right, 9 [SQL, Python] for
    # [SQL]: TP 2+1+1+1, gold items 2+2+1+1, extracted 2+2+1+2; years 2 for 3 is within 50%
    assert (data["variant"], data["records"], data["gold"]) == ("big", 4, {"path": str(gold), "records": 6})
    skills = data["fields"]["skills"]
    assert (skills["precision"], skills["recall"]) == (approx(5 / 7), approx(5 / 6))
    assert data["fields"]["years"]["accuracy"] == 1.0 and data["matching"]["numeric_tolerance"] == 0.5
    assert data["grounding"] == {"skills": {"found": 7, "values": 7, "share": 1.0}}
    assert (data["failed"], data["not_extracted"], data["not_in_source"]) == ({}, ["50"], ["77"])


@pytest.mark.process
def test_eval_html_puts_the_gold_beside_the_variant(job: JobSpec, gold: Path, tmp_path: Path) -> None:
    html = tmp_path / "eval.html"
    code, out, _ = cli("eval", job.source_file, "--gold", gold, "--html", html)
    assert code == 0 and out.splitlines()[-1] == f"wrote {html} (3 records)"
    data = page_data(html)
    assert data["variants"] == ["gold", "main"]
    assert [(record["id"], record["differing"]) for record in data["records"]] == [
        ("1", ["skills"]),
        ("2", ["skills", "years"]),
        ("42", []),
    ]
    gold_view, main_view = data["records"][0]["variants"]
    assert gold_view == {
        "extraction": {"skills": ["SQL", "Excel"], "years": 1},
        "failure": None,
        "model": None,
        "grounding": [],
        "chunks": None,
    }
    assert [span["value"] for span in main_view["grounding"]] == ["SQL", "Python"]
    dom = opened(html)
    assert dom.find(id="shown-count").text == "3 of 3 records shown"
    assert card_ids(dom) == ["2", "1", "42"]  # by disagreement: 2/3, 1/4, 0


@pytest.mark.process
def test_eval_html_shows_each_score_with_its_interval(job: JobSpec, gold: Path, tmp_path: Path) -> None:
    html = tmp_path / "eval.html"
    code, _, _ = cli("eval", job.source_file, "--gold", gold, "--html", html)
    assert code == 0
    table = opened(html).find(id="scores")
    rows = {
        (cells[0].text, cells[1].text): (cells[2].text, cells[3].text, cells[4].text)
        for cells in (row.find_all("td") for row in table.find("tbody").find_all("tr"))
    }
    assert rows[("skills", "f1")] == ("0.727", "0.500 \u2013 1.000", "3")
    assert rows[("years", "accuracy")] == ("0.667", "0.000 \u2013 1.000", "3")
    assert rows[("overall", "micro f1")] == ("0.737", "0.400 \u2013 1.000", "3")


def test_eval_two_variants_gives_the_paired_difference_and_a_verdict(job: JobSpec, gold: Path) -> None:
    code, out, err = cli("eval", job.source_file, "--gold", gold, "--variants", "main,big", "--json")
    assert (code, err) == (0, "")
    data = orjson.loads(out)
    # gold records with a result of both: 42, 1, 2 (9 failed for main, 50 not extracted, 77 not in source)
    assert (data["variants"], data["records"]) == ({"a": "main", "b": "big"}, 3)
    skills = data["fields"]["skills"]
    # record 2: big says [SQL], the gold [SQL]: big's skills F1 is 2*4/(5+5) = 0.8 to main's 8/11
    assert (skills["a"]["f1"], skills["b"]["f1"]) == (approx(8 / 11), approx(0.8))
    difference = skills["difference"]
    assert difference["metric"] == "f1" and difference["value"] == approx(0.8 - 8 / 11)
    low, high = difference["ci"]
    assert low < 0 < high and difference["verdict"] == "no detectable difference"
    assert difference["records_needed"] > 3  # more gold would be needed to tell
    assert data["fields"]["years"]["difference"]["metric"] == "accuracy"
    assert data["micro"]["difference"]["verdict"] == "no detectable difference"
    assert data["missing"]["a"]["failed"] == {"9": "schema_invalid"}
    code, out, _ = cli("eval", job.source_file, "--gold", gold, "--variants", "main,big")
    lines = out.splitlines()
    assert (
        code == 0
        and lines[0]
        == f"big (B) against main (A), both against {gold}, over the 3 gold records both have a result for"
    )
    assert lines[2].split() == ["field", "metric", "main", "big", "B", "-", "A", "verdict"]
    assert any(line.startswith("skills  ") and line.endswith("no detectable difference") for line in lines)
    assert (
        "verdict: better or worse when the interval of B - A excludes 0, else no detectable difference"
        in lines
    )
    # the one gold title: every resample the same, no interval; each difference's level is said
    (title,) = [" ".join(line.split()) for line in lines if line.startswith("title ")]
    assert title.startswith("title accuracy 1.000 [sample too small] 1.000 [sample too small]")
    (scores,) = [line for line in lines if line.startswith("scores: 95% intervals")]
    assert "sample too small: every resample gave the same score" in scores
    assert any("simultaneous over the 4 differences shown (98.8% each" in line for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--variants", "main,big", "--variant", "big"], r"give it without --variant$"),
        (["--variants", "main"], r"--variants 'main': give exactly 2 variant names"),
        (["--variants", "main,nope"], r"variant 'nope' has no results"),
        (["--resamples", "10"], r"--resamples"),
    ],
)
def test_eval_variants_bad_input_exits_2(job: JobSpec, gold: Path, args: list[str], message: str) -> None:
    code, out, err = cli("eval", job.source_file, "--gold", gold, *args)
    assert code == 2 and out == "" and re.search(message, err) and "Traceback" not in err


@pytest.mark.process
def test_eval_two_variants_html_shows_a_beside_b_with_both_scores_and_the_difference(
    job: JobSpec, gold: Path, tmp_path: Path
) -> None:
    """`eval --variants A,B --html` was refused (exit 2): the page of the paired evaluation."""
    html = tmp_path / "pair.html"
    code, out, err = cli("eval", job.source_file, "--gold", gold, "--variants", "main,big", "--html", html)
    assert (code, err) == (0, "") and out.splitlines()[-1] == f"wrote {html} (3 records)"
    data = page_data(html)
    assert data["variants"] == ["main", "big"]
    assert [record["id"] for record in data["records"]] == ["1", "2", "42"]  # both have a result
    assert all(len(record["variants"]) == 2 and None not in record["variants"] for record in data["records"])
    scores = {(row["path"], row["metric"]): row for row in data["scores"]}
    assert scores[("skills", "f1 (main)")]["value"] == approx(8 / 11)
    assert scores[("skills", "f1 (big)")]["value"] == approx(0.8)
    difference = scores[("skills", "B - A: no detectable difference")]
    assert difference["value"] == approx(0.8 - 8 / 11) and difference["records"] == 3
    assert ("overall", "micro f1 (big)") in scores
    # title, skills, years and the overall micro F1: each interval at 1 - 0.05/4
    assert any("simultaneous over the 4 differences shown (98.8% each" in note for note in data["notes"])
    (one,) = [note for note in data["notes"] if note.endswith("shows the gold beside one variant")]
    look = f"{PROGRAM} eval {job.source_file} --gold {gold} --html eval-main.html"  # the job and gold named
    assert f"`{look}`" in one
    dom = opened(html)
    assert dom.find(id="shown-count").text == "3 of 3 records shown"


def test_eval_json_with_html_keeps_stdout_one_json_object(job: JobSpec, gold: Path, tmp_path: Path) -> None:
    html = tmp_path / "eval.html"
    result = CliRunner().invoke(
        app, ["eval", str(job.source_file), "--gold", str(gold), "--json", "--html", str(html)]
    )
    assert result.exit_code == 0 and orjson.loads(result.stdout)["records"] == 3
    assert result.stderr == f"wrote {html} (3 records)\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gold", "{gold_dir}/missing.jsonl"], r"missing\.jsonl: cannot read the gold file"),
        (["--gold", "{bad_gold}"], r"bad\.jsonl: line 2: invalid JSON"),
        (["--gold", "{gold}", "--fields", "skills,nope"], r"field 'nope' is not in the schema"),
        (["--gold", "{gold}", "--fields", ","], r"--fields ',': give field names"),
        (
            ["--gold", "{gold}", "--variant", "nope"],
            r"variant 'nope' has no results \(variants with results: big, main\)",
        ),
        (["--gold", "{gold}", "--variant", "bad name!"], r"variant 'bad name!': a variant name has"),
        (["--gold", "{gold}", "--fuzzy", "150"], r"less than or equal to 100"),
    ],
)
def test_eval_bad_input_exits_2_with_one_line(
    job: JobSpec, gold: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    bad_gold = tmp_path / "bad.jsonl"
    bad_gold.write_text('{"id": 1, "years": 1}\n{"id": 2,\n')
    values = {"gold": gold, "bad_gold": bad_gold, "gold_dir": tmp_path}
    code, out, err = cli("eval", job.source_file, *(arg.format(**values) for arg in args))
    assert code == 2 and out == ""
    assert re.search(message, err) and "Traceback" not in err
    if "--fuzzy" not in args:  # typer's own usage errors come in a box
        assert err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.process
def test_run_rerun_repeats_a_variant_on_its_own_records_as_a_variant_of_its_own(tmp_path: Path) -> None:
    spec = variants_job(tmp_path)
    run_variant(spec, "big", main_answer)
    with sim_server("--model", "big-model") as url:
        code, out, err = cli("run", spec.source_file, "--variant", "big", "--rerun", "--endpoint", url)
    assert code == 0, err
    assert out.startswith("run 2 completed: 9 done, 0 failed of 9")  # big's 9 results, not 10 records
    models = table_rows(spec.database, "SELECT DISTINCT model FROM results WHERE variant = 'big~rerun'")
    assert models == [("big-model",)]  # big's settings, exactly
    code, out, _ = cli("compare", spec.source_file, "--variants", "big,big~rerun", "--json")
    assert code == 0 and orjson.loads(out)["noise"]["rerun"] == "big~rerun"


def test_a_job_that_never_ran_is_exit_2(tmp_path: Path) -> None:
    spec = variants_job(tmp_path)
    code, _, err = cli("compare", spec.source_file, "--variants", "main,big")
    assert code == 2 and "no table 'results' yet" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "--gold", "{gold}"],
        ["compare", "--variants", "main,big"],
        ["review", "--html", "{html}"],
    ],
)
@pytest.mark.process
def test_a_database_held_by_another_process_is_exit_3(tmp_path: Path, gold: Path, command: list[str]) -> None:
    spec = two_variant_job(tmp_path)
    args = [arg.format(gold=gold, html=tmp_path / "review.html") for arg in command]
    with database_held_by_another_process(spec.database):
        code, _, err = cli(args[0], spec.source_file, *args[1:])
    assert code == 3 and "database is in use by another process" in err and err.count("\n") == 1
    assert not (tmp_path / "review.html").exists()


# --- compare ----------------------------------------------------------------------------------------


def test_compare_prints_agreement_per_variant_numbers_disagreements_and_the_noise_floor(job: JobSpec) -> None:
    code, out, err = cli("compare", job.source_file, "--variants", "main,big", "--show", "2")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "big compared with main (the reference) over the 8 records both extracted"
    (row,) = [line for line in lines if line.startswith("skills  ")]
    assert row.split() == ["skills", "list", "8", "0.933", "0.875", "0.903", "0.892"]
    assert lines[lines.index(row) + 1].split() == ["0.824-1.000", "0.750-1.000", "0.800-0.970", "0.783-0.975"]
    start = lines.index("means per record over the 8 records both extracted:")
    assert lines[start + 1].split() == [
        "variant",
        "prompt",
        "tok",
        "completion",
        "tok",
        "reasoning",
        "tok",
        "latency",
        "s",
    ]
    assert lines[start + 2].split()[:4] == ["main", "100.0", "40.0", "10.0"]
    assert lines[start + 3].split()[:4] == ["big", "112.5", "45.0", "11.2"]
    assert lines[start + 4 : start + 9] == [
        "failures, over the 10 records both variants attempted (each has a result or a failure for them):",
        "  main: 1 (schema_invalid 1)",
        "  big: 1 (truncated 1)",
        "grounding (values of grounded fields found in the record text, same records):",
        "  skills: main 16 of 16 values found in the text (100%) · "
        "big 14 of 15 values found in the text (93%)",
    ]
    start = lines.index("records that differ most (2 of 3 that differ), per differing field main | big:")
    assert lines[start + 1 : start + 6] == [
        "  id 3  (disagreement 0.27)",
        '    skills: ["SQL","Python"] | ["SQL"]',
        "    years: 3 | 30",
        "  id 2  (disagreement 0.07)",
        '    skills: ["SQL","Python"] | ["SQL"]',
    ]
    job_file = str(job.source_file)
    assert lines[-1] == (
        "noise floor: not measured (main~rerun has no results). Temperature 0 on vLLM is not deterministic "
        "across batches, so a difference means something only above how much main differs from a re-run "
        f"of itself: `{PROGRAM} run {job_file} --variant main --rerun` (re-runs main with its settings on "
        f"the records it extracted), then `{PROGRAM} compare {job_file} --variants main,big`"
    )


def test_compare_json(job: JobSpec) -> None:
    code, out, _ = cli(
        "compare", job.source_file, "--variants", "main,big", "--json", "--show", "1", "--fuzzy", "80"
    )
    assert code == 0
    data = orjson.loads(out)
    assert (data["records"], data["matching"]["fuzzy_threshold"]) == (8, 80.0)
    # as without --fuzzy (no unmatched pair is alike): see test_reports' compare test
    assert (data["micro"]["tp"], data["micro"]["fp"], data["micro"]["fn"]) == (45, 2, 3)
    assert data["micro"]["f1"] == approx(90 / 95)
    assert data["fields"]["years"]["accuracy"] == 0.875
    assert data["variants"]["big"]["tokens_per_record"] == {
        "prompt": 112.5,
        "completion": 45.0,
        "reasoning": 11.25,
    }
    assert data["variants"]["main"]["failures"] == {"schema_invalid": 1}
    assert data["disagreements"] == [
        {
            "id": "3",
            "disagreement": approx(1 - (3 + 2 / 3) / 5),
            "differences": [
                {"path": "skills", "a": ["SQL", "Python"], "b": ["SQL"]},
                {"path": "years", "a": 3, "b": 30},
            ],
        }
    ]


def test_compare_sample_reads_only_the_sampled_records(job: JobSpec) -> None:
    args = ["--variants", "main,big", "--sample", str(SAMPLE.size), "--seed", str(SAMPLE.seed)]
    code, out, _ = cli("compare", job.source_file, *args, "--json")
    data = orjson.loads(out)
    assert (code, data["records"], data["failures_over"]["records"], data["sample"]) == (
        0,
        3,
        4,
        {"size": 4, "seed": 7},
    )
    assert [d["id"] for d in data["disagreements"]] == ["3", "2"]
    code, out, _ = cli("compare", job.source_file, *args)
    assert out.splitlines()[0] == (
        "big compared with main (the reference) over the 3 records both extracted "
        "(sample of 4 source records (seed 7))"
    )
    # the hint keeps every option the comparison needs: the variant, the sample, its seed, the database
    assert "--variant main --rerun --sample 4 --seed 7`" in out.splitlines()[-1]
    code, out, _ = cli("compare", job.source_file, *args, "--database", job.database)
    assert out.splitlines()[-1].endswith(
        f"--sample 4 --seed 7 --database {job.database}` (re-runs main with its settings on the records "
        f"it extracted), then `{PROGRAM} compare {job.source_file} --variants main,big --sample 4 --seed 7 "
        f"--database {job.database}`"
    )


@pytest.mark.process
def test_compare_html_shows_both_variants_over_the_records_both_attempted(
    job: JobSpec, tmp_path: Path
) -> None:
    html = tmp_path / "compare.html"
    code, out, _ = cli("compare", job.source_file, "--variants", "main,big", "--html", html)
    assert code == 0 and out.splitlines()[-1] == f"wrote {html} (10 records)"
    assert page_data(html)["variants"] == ["main", "big"]
    dom = opened(html)
    assert dom.find(id="shown-count").text == "10 of 10 records shown"
    assert card_ids(dom)[:3] == ["3", "2", "5"]
    # above the records, the numbers `compare` prints (see the text test above)
    section = dom.find("section", id="comparison")
    assert (
        section.find("h2").text == "big compared with main (the reference) over the 8 records both extracted"
    )
    agreement = {
        row.attrs["data-path"]: row for row in section.find("table", id="agreement").find_all("tr")[1:5]
    }
    assert [cell.text for cell in agreement["skills"].find_all("td")] == [
        "skills",
        "list",
        "8",
        "0.903",
        "0.800 \u2013 0.970",
        "0.933",
        "0.875",
    ]
    assert [cell.text for cell in agreement["years"].find_all("td")][3:5] == ["0.875", "0.625 \u2013 1.000"]
    variants = section.find("table", id="variant-numbers")
    assert [[cell.text for cell in row.find_all("td")][:4] for row in variants.find_all("tr")[1:]] == [
        ["main", "100.0", "40.0", "10.0"],
        ["big", "112.5", "45.0", "11.3"],  # 11.25, as the text's 11.2 rounds it half to even
    ]
    assert [[cell.text for cell in row.find_all("td")][5:] for row in variants.find_all("tr")[1:]] == [
        ["1 (schema_invalid 1)", "skills 16 of 16 (100%)"],
        ["1 (truncated 1)", "skills 14 of 15 (93%)"],
    ]
    (hint,) = section.find_all("p", cls="noise-note")
    assert hint.text.startswith("noise floor: not measured (main~rerun has no results).")
    assert f"`{PROGRAM} run {job.source_file} --variant main --rerun --database {job.database}`" in hint.text


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        ("main", r"--variants 'main': give exactly 2 variant names"),
        ("main,main", r"give exactly 2 different variants"),
        ("main,big,other", r"give exactly 2 variant names"),
        ("main,nope", r"variant 'nope' has no results \(variants with results: big, main\)"),
        ("main,bad name!", r"variant 'bad name!': a variant name has"),
    ],
)
def test_compare_bad_variants_exit_2_with_one_line(job: JobSpec, variants: str, message: str) -> None:
    code, out, err = cli("compare", job.source_file, "--variants", variants)
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err)


@pytest.mark.process
def test_compare_with_a_rerun_says_it_is_the_noise_floor(tmp_path: Path) -> None:
    spec = variants_job(tmp_path)
    run_variant(spec, "main", main_answer)
    run_variant(spec, "main~rerun", main_answer)
    code, out, _ = cli("compare", spec.source_file, "--variants", "main,main~rerun")
    lines = out.splitlines()
    # 9 records: 4 scalars (36 values) and 2 skills (18) each
    micro = (
        "micro P 1.000 [0.664-1.000]  R 1.000 [0.664-1.000]  F1 1.000 [0.664-1.000]  "
        "(pooled over every value: 54 TP, 0 FP, 0 FN; a scalar counts once)"
    )
    assert code == 0 and micro in lines
    assert "no record differs" in lines
    # against its own re-run, the re-run is its noise: nothing is beyond it
    assert lines[-1] == "beyond the noise (the gap's interval is above 0): no field"
    (skills,) = [line for line in lines if line.startswith("  skills  ")]
    # alike on all 9 records: every resample the same, so the exact bound of 9 records (at 99% for the gap)
    assert " ".join(skills.split()) == "skills 1.000 1.000 [0.664, 1.000] +0.000 [-0.445, +0.445] no"
    # and the page shows the same noise floor above the records
    html = tmp_path / "noise.html"
    code, _, _ = cli("compare", spec.source_file, "--variants", "main,main~rerun", "--html", html)
    section = opened(html).find("section", id="comparison")
    noise, gap, beyond = [cell.text for cell in section.find("tr", data_path="skills").find_all("td")][-3:]
    # (the intervals are as the JSON gives them: of no width here, every resample the same)
    assert noise.startswith("1.000 [") and gap.startswith("+0.000 [") and beyond == "no"
    assert [note.text for note in section.find_all("p", cls="noise-note")][-1] == (
        "beyond the noise (the gap's interval is above 0): no field"
    )


# --- review -----------------------------------------------------------------------------------------


@pytest.mark.process
def test_review_of_one_variant(job: JobSpec, tmp_path: Path) -> None:
    html = tmp_path / "review.html"
    code, out, err = cli("review", job.source_file, "--html", html)
    assert (code, out, err) == (0, f"wrote {html} (10 records)\n", "")
    data = page_data(html)
    assert (data["variants"], data["groundedPaths"]) == (["main"], ["skills"])
    assert data["notes"] == ["sample of 100 source records (seed 0): 10 with a result or a failure of main"]
    dom = opened(html)
    assert dom.find(id="shown-count").text == "10 of 10 records shown"
    assert card_ids(dom) == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "42"]


@pytest.mark.process
def test_review_of_two_variants_in_a_sample(job: JobSpec, tmp_path: Path) -> None:
    html = tmp_path / "review.html"
    args = ["--variants", "main,big", "--sample", str(SAMPLE.size), "--seed", str(SAMPLE.seed)]
    code, out, _ = cli("review", job.source_file, "--html", html, *args)
    assert (code, out) == (0, f"wrote {html} (4 records)\n")
    records = {record["id"]: record for record in page_data(html)["records"]}
    assert (records["3"]["differing"], records["9"]["disagreement"]) == (["skills", "years"], None)
    assert records["9"]["variants"][0]["failure"].startswith("schema_invalid: ")
    dom = opened(html)
    assert dom.find(id="shown-count").text == "4 of 4 records shown"
    assert card_ids(dom) == ["3", "2", "6", "9"]  # by disagreement; 9 (main failed) has none


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--variant", "main", "--variants", "main,big"], r"give --variant or --variants, not both"),
        (["--variants", "main,big,x"], r"give 1 or 2 variant names"),
        (["--variant", "nope"], r"variant 'nope' has no results or failures"),
    ],
)
def test_review_bad_input_exits_2(job: JobSpec, tmp_path: Path, args: list[str], message: str) -> None:
    html = tmp_path / "review.html"
    code, out, err = cli("review", job.source_file, "--html", html, *args)
    assert (code, out) == (2, "") and err.count("\n") == 1 and re.search(message, err)
    assert not html.exists()


def test_the_commands_are_registered() -> None:
    code, out, _ = cli("--help")
    assert code == 0
    assert all(re.search(rf"│ {name} ", out) for name in ("eval", "compare", "review"))
