"""The noise floor end to end, over HTTP to the simulator with answer noise (as vLLM at temperature 0
is not deterministic): a variant against its own re-run is no detectable difference and beyond the noise
nowhere; a variant whose prompt changes two fields' answers is beyond the noise on exactly those."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.job.commands import program
from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.processes import run_pipeline, sim_server

pytestmark = pytest.mark.integration

RECORDS = 300
# The fields whose answers the system prompt decides (the simulator draws them with the prompt).
PROMPT_SENSITIVE = ("seniority", "explicit_skills")


def run(*args: str | Path) -> dict[str, Any] | str:
    done = run_pipeline(*(str(arg) for arg in args), timeout=300)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return orjson.loads(done.stdout) if "--json" in args else done.stdout


def write_gold_from(database: Path, variant: str, path: Path) -> Path:
    """A gold file of a variant's stored extractions (an independent draw of the same answers)."""
    rows = table_rows(database, f"SELECT record_id, extracted FROM results WHERE variant = '{variant}'")
    path.write_bytes(b"".join(orjson.dumps({"id": rid, **orjson.loads(e)}) + b"\n" for rid, e in rows))
    return path


def test_a_rerun_is_the_noise_floor_and_a_changed_prompt_is_beyond_it(tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, RECORDS)
    sensitive = [arg for name in PROMPT_SENSITIVE for arg in ("--prompt-sensitive", name)]
    with sim_server("--model", "test-model", "--seed", "5", "--answer-noise", "0.02", *sensitive) as url:
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": url},
            concurrency=1,  # one request at a time: the noise the server draws lands on the same records
            schema="schemas.linkedin:JobPosting",
            max_tokens=2048,
            variants={"terse": {"prompt": {"system": "Extract the posting, tersely."}}},
        )
        for variant in ("main", "terse", "gold"):
            run("run", job, "--variant", variant)
        rerun = run("run", job, "--rerun")
    assert isinstance(rerun, str) and f"{RECORDS:,} done" in rerun
    counts = dict(table_rows(database, "SELECT variant, count(*) FROM results GROUP BY variant"))
    assert counts == {"main": RECORDS, "main~rerun": RECORDS, "terse": RECORDS, "gold": RECORDS}
    gold = write_gold_from(database, "gold", tmp_path / "gold.jsonl")

    paired = run("eval", job, "--gold", gold, "--variants", "main,main~rerun", "--json")
    assert isinstance(paired, dict) and paired["records"] == RECORDS
    verdicts = {path: field["difference"]["verdict"] for path, field in paired["fields"].items()}
    assert set(verdicts.values()) == {"no detectable difference"}, verdicts
    assert paired["micro"]["difference"]["verdict"] == "no detectable difference"

    itself = run("compare", job, "--variants", "main,main~rerun", "--json")
    assert isinstance(itself, dict) and itself["noise"] == {
        "rerun": "main~rerun",
        "records": RECORDS,
        "beyond_noise": [],
    }
    assert not any(field["beyond_noise"] for field in itself["fields"].values())
    # the re-run differs from main, a little: the noise is measured, not assumed to be 0
    assert min(field["noise_agreement"] for field in itself["fields"].values()) < 1

    other = run("compare", job, "--variants", "main,terse", "--json")
    assert isinstance(other, dict)
    beyond = {path for path, field in other["fields"].items() if field["beyond_noise"]}
    assert beyond == set(PROMPT_SENSITIVE), beyond
    assert other["noise"]["beyond_noise"] == [path for path in other["fields"] if path in beyond]


def hinted_run(compare_text: str) -> list[str]:
    """The `pipeline run ... --rerun ...` command compare prints without a re-run, as words after the
    program's."""
    match = re.search(r"`([^`]* run [^`]*--rerun[^`]*)`", compare_text)
    assert match is not None, compare_text
    words = shlex.split(match.group(1))
    assert words[: len(program())] == program()  # by its path: it runs without the environment active
    return words[len(program()) :]


def test_the_hint_for_a_variant_made_with_command_line_options_does_the_rerun(tmp_path: Path) -> None:
    """A variant made with --prompt-file (and one with --endpoint --model, on another server) is re-run
    by the command compare prints, pasted as it is. Before, the hint left the options out: the re-run
    had the job's own settings, A's results were stale against it, and it said "nothing to do"."""
    database = tmp_path / "postings.duckdb"
    build_postings(database, 40)
    terse = tmp_path / "terse prompt.txt"
    terse.write_text("Extract the posting, tersely.")
    with sim_server("--model", "test-model", "--seed", "5") as url, sim_server("--model", "big") as big:
        job = write_job(
            tmp_path,
            database="postings.duckdb",
            endpoint={"base_url": url},
            concurrency=4,
            schema="schemas.linkedin:JobPosting",
            max_tokens=2048,
        )
        sample = ("--sample", "12", "--seed", "3")
        run("run", job, *sample)
        run("run", job, "--variant", "terse", "--prompt-file", terse, *sample)
        run("run", job, "--variant", "large", "--endpoint", big, "--model", "big", *sample)
        for variant in ("terse", "large"):
            text = run("compare", job, "--variants", f"{variant},main", *sample)
            assert isinstance(text, str) and "noise floor: not measured" in text
            command = hinted_run(text)
            assert command[0] == "run" and f"{variant}" in command
            rerun = run(*command)
            assert isinstance(rerun, str) and "12 done" in rerun, rerun
            measured = run("compare", job, "--variants", f"{variant},main", *sample, "--json")
            assert isinstance(measured, dict) and measured["noise"]["records"] == 12
    assert table_rows(database, "SELECT DISTINCT model FROM results WHERE variant = 'large~rerun'") == [
        ("big",)
    ]
