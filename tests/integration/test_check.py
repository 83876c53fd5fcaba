"""``pipeline check`` and the run's preflight against the simulator as a process, imitating the servers
of the seed runs (its vLLM metric names, its KV capacity in tokens, prefix caching off, answers in
``reasoning``), with the LinkedIn job's own records: what a person would read before a night's run."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import duckdb
import orjson
import pytest
import yaml

from tests.support.jobs import linkedin_job, table_rows
from tests.support.processes import run_pipeline, sim_server

pytestmark = pytest.mark.integration

NEMOTRON = "nvidia/Llama-3_3-Nemotron-Super-49B-v1_5"


def linkedin(tmp_path: Path, url: str, **overrides: object) -> Path:
    spec = linkedin_job(tmp_path / "linkedin.duckdb") | {"endpoint": {"base_url": url}} | overrides
    path = tmp_path / "linkedin.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_gpt_oss_server_of_the_seed_runs_is_all_ok_for_the_linkedin_job(tmp_path: Path) -> None:
    with sim_server("--profile", "gpt-oss-120b", "--speed", "100") as url:
        checked = run_pipeline("check", str(linkedin(tmp_path, url)), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = orjson.loads(checked.stdout)
    assert report["kv_tokens"] == 4_800_000 and report["prefix_caching"] is True
    assert report["requests_that_fit"] > 256 and report["answer_in_reasoning"] is False
    assert report["reasoning_effort_honored"] is True and report["context"] == 131_072
    assert report["pending"] == 12 and report["eta_s"] > 0


def test_a_dense_server_past_its_kv_cache_with_a_short_timeout_says_everything_wrong(tmp_path: Path) -> None:
    sim = ("--profile", "nemotron-super-49b", "--speed", "100", "--kv-tokens", "200000")
    faults = ("--no-prefix-caching", "--answer-in-reasoning")
    with sim_server(*sim, *faults) as url:
        job = linkedin(tmp_path, url, model=NEMOTRON, request_timeout_s=180)
        text = run_pipeline("check", str(job))
        data = orjson.loads(run_pipeline("check", str(job), "--json").stdout)
    assert text.returncode == 3, text.stdout + text.stderr
    lines = {line.split(":")[0].split()[-1]: line for line in text.stdout.splitlines()}
    fit = data["requests_that_fit"]
    assert data["kv_tokens"] == 200_000 and 0 < fit < 256
    assert lines["kv_cache"].startswith("warn") and f"c=256, about {fit} fit" in lines["kv_cache"]
    assert lines["prefix_caching"].startswith("warn") and "records =" in lines["prefix_caching"]
    assert lines["answer"].startswith("warn") and data["answer_in_reasoning"] is True
    assert lines["timeout"].startswith("fail") and "request_timeout_s 180 would kill them" in lines["timeout"]


def test_a_run_says_the_cheap_checks_at_start_and_goes_on(tmp_path: Path) -> None:
    sim = (
        "--profile",
        "nemotron-super-49b",
        "--speed",
        "200",
        "--kv-tokens",
        "200000",
        "--no-prefix-caching",
    )
    with sim_server(*sim) as url:
        job = linkedin(tmp_path, url, model=NEMOTRON)
        ran = run_pipeline("run", str(job), "--limit", "2", "--log-format", "json")
    assert ran.returncode in (0, 1), ran.stderr
    events = [json.loads(line)["event"] for line in ran.stderr.splitlines() if line.startswith("{")]
    said = [event for event in events if event.startswith("server check:")]
    assert len(said) == 2 and "kv_cache" in said[0] and "prefix_caching: off" in said[1]
    assert events.index(said[-1]) < events.index("run started")


def test_in_a_4096_context_the_probes_ask_for_what_the_run_asks_for_and_both_agree(tmp_path: Path) -> None:
    """The LinkedIn job's ~3,000-token prompts leave about 1,000 of its max_tokens 4,096: the probes ask
    for that, as the run does, and are answered (asking for 4,096, each was refused with a 400)."""
    with sim_server("--model", "test-model", "--max-model-len", "4096") as url:
        job = linkedin(tmp_path, url, model="test-model")
        checked = run_pipeline("check", str(job))
        ran = run_pipeline("run", str(job))
    lines = {line.split(":")[0].split()[-1]: line for line in checked.stdout.splitlines()}
    assert "probe" not in lines, checked.stdout
    assert lines["answer"].startswith("ok") and lines["response_format"].startswith("ok")
    assert (
        lines["context"].startswith("warn")
        and "a run sends 5 with less than max_tokens 4,096" in (lines["context"])
    )
    assert ran.returncode == 0 and "12 done, 0 failed of 12" in ran.stdout, ran.stdout + ran.stderr


def test_a_server_answering_http_500_is_said_as_such_in_seconds_and_what_it_did_not_show_is_unknown(
    tmp_path: Path,
) -> None:
    """At the default --probe-timeout (120 s) the probe was retried as a run retries it, six times with
    backoff, and the check took 106 s to fail; it stops at the third answer, in seconds."""
    with sim_server("--model", "test-model", "--fault-server-error", "1") as url:
        job = linkedin(tmp_path, url, model="test-model")
        started = time.monotonic()
        checked = run_pipeline("check", str(job))
        took = time.monotonic() - started
    lines = {line.split(":")[0].split()[-1]: line for line in checked.stdout.splitlines()}
    assert checked.returncode == 3, checked.stdout + checked.stderr
    assert took < 15, f"{took:.1f} s"
    assert re.match(r"fail     probe: in [\d.]+ s the server answered 3 times, each with ", lines["probe"])
    assert "an error a run retries (a probe, alone); the last: HTTP 50" in lines["probe"]
    for name in ("answer", "response_format", "timeout"):
        assert lines[name].startswith("unknown"), lines[name]


def test_the_longest_pending_record_is_named_and_the_run_refuses_that_one(tmp_path: Path) -> None:
    """A record of ~15,000 tokens among the LinkedIn postings, against an 8,192 context: however the
    probes are sampled, the check names it as the run's too_long failure, and the run fails it alone."""
    spec = linkedin_job(tmp_path / "linkedin.duckdb")
    with duckdb.connect(str(tmp_path / "linkedin.duckdb")) as connection:
        connection.execute(
            "CREATE TABLE postings AS SELECT * FROM read_json_auto(?)", [spec["source"]["seed_file"]]
        )
        connection.execute(
            "INSERT INTO postings BY NAME SELECT 99 AS id, title, company, location, "
            "repeat(description || ' ', 60) AS description FROM postings LIMIT 1"
        )
    with sim_server("--model", "test-model", "--max-model-len", "8192") as url:
        job = linkedin(tmp_path, url, model="test-model")
        checked = run_pipeline("check", str(job), "--json")
        ran = run_pipeline("run", str(job))
    report = orjson.loads(checked.stdout)
    context = next(check for check in report["checks"] if check["name"] == "context")
    assert (
        context["status"] == "fail"
        and "a run fails 1 as too_long, unsent (record 99: " in (context["message"])
    )
    assert report["longest_prompt"]["record_id"] == 99 and report["longest_prompt"]["max_tokens"] is None
    assert ran.returncode == 1 and "12 done, 1 failed of 13" in ran.stdout, ran.stdout + ran.stderr
    failed = table_rows(
        tmp_path / "linkedin.duckdb", "SELECT record_id, failure_class, attempts FROM failures"
    )
    assert failed == [(99, "too_long", 0)]
