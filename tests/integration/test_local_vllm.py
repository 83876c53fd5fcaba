"""End to end against the real local vLLM server (CPU build, SmolLM2-135M): 20 real job ads are loaded
with `pipeline load`, extracted with `pipeline run`, killed midway once and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx2
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pipeline.errors import FailureClass
from pipeline.quality.normalize import normalize_text
from pipeline.servers.scrape import CACHE_CONFIG_INFO, CACHE_CONFIG_LABELS, RELIED_ON, metrics_url
from schemas.linkedin import JobPosting
from tests.support.datasets import ADZUNA
from tests.support.jobs import linkedin_job, table_rows
from tests.support.local_vllm import require_local_vllm, wait_gone
from tests.support.processes import REPO, pipeline_command, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.local_vllm]

ADS = 20


@pytest.fixture(scope="module")
def local_server() -> Iterator[str]:
    """`pipeline serve-local`, once for this module; stopped with SIGINT, and nothing may remain."""
    require_local_vllm()
    process = subprocess.Popen(
        pipeline_command("serve-local", "--log-format", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=REPO,
    )
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    if " at http://" not in line:
        process.kill()
        pytest.fail(f"serve-local did not start:\n{line}{process.stderr.read()[-3000:]}")
    events = _events_until_ready(process.stderr)
    print(f"\nlocal vLLM server ready after {events['local server ready']['seconds']} s")
    yield line.rsplit(" at ", 1)[1].strip()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0
    wait_gone(int(events["starting local server"]["pid"]))


def _events_until_ready(stream: Iterable[str]) -> dict[str, dict[str, Any]]:
    events: dict[str, dict[str, Any]] = {}
    for raw in stream:
        event = json.loads(raw)
        events[event["event"]] = event
        if event["event"] == "local server ready":
            return events
    raise AssertionError(f"no ready event: {events}")


def write_job(folder: Path, url: str) -> Path:
    spec = linkedin_job(folder / "ads.duckdb")
    del spec["source"]["seed_file"]
    # Without the worked examples: a 135M model copies their full-length answers, which do not fit
    # the test's 512-token budget (the examples are measured with `pipeline compare`, not here).
    del spec["prompt"]["examples_file"]
    spec["schema"] = "schemas.linkedin:JobPosting"
    spec["model"] = "smollm2-135m"
    spec["endpoint"] = {"base_url": url}
    spec["max_tokens"] = 512  # bounds the test's time: longer answers end as `truncated` failures
    spec["retry"] = {**spec["retry"], "truncation_retries": 0}
    path = folder / "ads.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def wait_for_results(snapshot: Path, at_least: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if orjson.loads(snapshot.read_bytes())["done"] >= at_least:
                return
        except (OSError, orjson.JSONDecodeError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} results after {timeout_s:.0f} s")


@pytest.mark.skipif(not ADZUNA.is_file(), reason="../shared datasets not present")
def test_real_ads_extracted_killed_midway_and_resumed(tmp_path: Path, local_server: str) -> None:
    ads = tmp_path / "ads.csv"
    with duckdb.connect() as connection:
        connection.execute(
            f"COPY (SELECT * FROM read_csv('{ADZUNA}', header = true) LIMIT {ADS}) TO '{ads}' (HEADER)"
        )
    job = write_job(tmp_path, local_server)
    env = subprocess_env()
    load = subprocess.run(
        pipeline_command(
            "load",
            str(ads),
            "--job",
            str(job),
            "--rename",
            "FullDescription=description",
            "--rename",
            "LocationRaw=location",
        ),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert load.returncode == 0, load.stderr
    assert f"loaded {ADS} records from" in load.stdout and f": {ADS} new, 0 updated" in load.stdout

    started = time.monotonic()
    # Two at a time, so the kill lands midway: at the job's 8, the last waves of 20 records can end
    # inside one 2 s snapshot interval, and the run would complete before it is killed.
    first = subprocess.Popen(
        pipeline_command("run", str(job), "--concurrency", "2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
    )
    try:
        wait_for_results(tmp_path / "ads.duckdb.progress.json", at_least=3, timeout_s=600)
    finally:
        ended_by_itself = first.poll() is not None
        if not ended_by_itself:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
    assert not ended_by_itself, "the first run ended before it was killed: nothing was resumed"
    killed_with = table_rows(tmp_path / "ads.duckdb", "SELECT count(*) FROM results")[0][0]
    assert killed_with >= 3

    resumed = subprocess.run(
        pipeline_command("run", str(job)), capture_output=True, text=True, env=env, cwd=REPO, timeout=1500
    )
    elapsed = time.monotonic() - started
    assert resumed.returncode in (0, 1), resumed.stderr[-3000:]

    database = tmp_path / "ads.duckdb"
    ids = sorted(row[0] for row in table_rows(database, "SELECT id FROM postings"))
    done = table_rows(database, "SELECT record_id, extracted FROM results")
    failed = table_rows(database, "SELECT record_id, failure_class FROM failures")
    assert sorted([row[0] for row in done] + [row[0] for row in failed]) == ids  # each exactly once
    for _, extracted in done:
        JobPosting.model_validate_json(extracted)
    assert {failure_class for _, failure_class in failed} <= {str(c) for c in FailureClass}
    runs = table_rows(database, "SELECT status FROM runs ORDER BY run_id")
    assert runs[0][0] == "abandoned" and runs[-1][0] in ("completed", "completed_with_failures")
    print(
        f"\n{ADS} real ads through local vLLM: {len(done)} extracted, {len(failed)} failed, "
        f"{ADS * 60 / elapsed:.1f} records/min including the kill and the resume"
    )


def test_bench_sweeps_the_real_server_and_reads_its_metrics(tmp_path: Path, local_server: str) -> None:
    args = ["bench", "--endpoint", local_server, "--model", "smollm2-135m", "--concurrency", "1,2"]
    args += ["--prompt-tokens", "700", "--output-tokens", "16", "--rounds", "1", "--out", str(tmp_path)]
    done = subprocess.run(
        pipeline_command(*args), capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    levels = orjson.loads((tmp_path / "bench.json").read_bytes())["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    for level in levels:
        assert level["errors"] == 0 and level["aggregate_tok_s"] > 0
        assert level["ttft_p50_s"] is not None  # streamed
        assert level["max_running"] is not None and level["kv_usage_max"] is not None  # vLLM's /metrics
    assert (
        levels[1]["prefix_hit_rate"] is not None and levels[1]["prefix_hit_rate"] > 0
    )  # shared system prompt
    print(f"\n{done.stdout}{done.stderr[-2000:]}")


def test_the_metric_names_the_pipeline_relies_on_are_the_real_servers(local_server: str) -> None:
    """vLLM's /metrics has each name of scrape.RELIED_ON with its type (counters with their _total),
    and cache_config_info's labels hold the KV cache as blocks of tokens and prefix caching as True or
    False: what `pipeline check` and the simulator (pipeline/sim/metrics.py) read and write."""
    text = httpx2.get(metrics_url(local_server), timeout=30).text
    found = {
        sample.name: (family.type, sample.labels)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    missing = [name for name in RELIED_ON if name not in found]
    assert missing == [], f"vLLM's /metrics lacks {missing}"
    for name in RELIED_ON:
        assert found[name][0] == ("counter" if name.endswith("_total") else "gauge"), name
    labels = found[CACHE_CONFIG_INFO][1]
    assert set(CACHE_CONFIG_LABELS) <= set(labels), labels
    assert labels["num_gpu_blocks"].isdigit() and labels["block_size"].isdigit()
    assert labels["enable_prefix_caching"] in ("True", "False")
    print(f"\nvLLM's KV cache: {labels['num_gpu_blocks']} blocks of {labels['block_size']} tokens")


def test_no_record_is_refused_for_its_length(tmp_path: Path, local_server: str) -> None:
    """The LinkedIn job with a budget past the server's context (max_tokens 16,384 against vLLM's
    --max-model-len 8,192, read from its /v1/models): every request asks for what fits, so no record
    fails for an HTTP 400 about its length. A posting whose prompt alone is past the context is counted
    by vLLM's /tokenize and never sent: `too_long`, with the server's count and the field."""
    sample = (REPO / "data" / "sample_postings.jsonl").read_text().splitlines()
    postings = [json.loads(line) for line in sample]
    huge = {**postings[0], "id": 999, "description": "Responsibilities include many things. " * 6000}
    data = tmp_path / "postings.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in [*postings[:2], huge]))
    job = write_job(tmp_path, local_server)
    spec = yaml.safe_load(job.read_text())
    spec["max_tokens"] = 16384
    spec["retry"] = {**spec["retry"], "truncation_retries": 1, "max_tokens_ceiling": 32768}
    job.write_text(yaml.safe_dump(spec))
    env = subprocess_env()
    load = subprocess.run(
        pipeline_command("load", str(data), "--job", str(job)),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert load.returncode == 0, load.stderr
    started = time.monotonic()
    run = subprocess.run(
        pipeline_command("run", str(job), "--log-format", "json"),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=900,
    )
    assert run.returncode in (0, 1), run.stderr[-3000:]
    database = tmp_path / "ads.duckdb"
    done = table_rows(database, "SELECT record_id, prompt_tokens, max_tokens FROM results")
    failed = dict(table_rows(database, "SELECT record_id, [failure_class, message] FROM failures"))
    assert sorted([row[0] for row in done] + list(failed)) == [1, 2, 999]  # each exactly once
    assert all(prompt + budget <= 8192 for _, prompt, budget in done)
    assert "HTTP 400" not in run.stderr
    assert all(message_class != "permanent" for message_class, _ in failed.values())
    failure_class, message = failed[999]
    assert failure_class == "too_long"
    assert message.startswith("the prompt alone does not fit the context: ")
    assert "(estimated)" not in message  # the server's own count
    assert (
        "tokens against a context of 8192 tokens (the server's max_model_len); most of it is field "
        "'description' (228,000 characters): enable chunking (chunking: field: description)"
    ) in message
    attempts = table_rows(database, "SELECT attempts FROM failures WHERE record_id = 999")
    assert attempts == [(0,)]  # never sent
    print(f"\n{len(done)} done, failures {failed} in {time.monotonic() - started:.0f} s")


def prose(tokens: int) -> str:
    """English paragraphs of about ``tokens`` SmolLM2 tokens (about 4.5 characters a token)."""
    tools = ["Python", "SQL", "Docker", "Kafka", "Spark", "Excel", "Terraform", "React", "Go", "Tableau"]
    sentences = [
        f"Team {i} maintains the {tools[i % 10]} service number {i} and reviews the weekly reports with "
        f"the {tools[(i * 3) % 10]} group."
        for i in range(tokens * 9 // 2 // 100 + 1)
    ]
    return "\n\n".join(" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5))


def test_a_document_past_the_context_is_chunked_and_no_request_is_refused(
    tmp_path: Path, local_server: str
) -> None:
    """A document of over twice the bundled model's context (8,192 tokens, from its /v1/models): split
    to what the context leaves after max_tokens (the server's /tokenize counts it), no request refused
    for its length, the merged skills the union of the chunks' with spans in the whole document."""
    database = tmp_path / "docs.duckdb"
    text = prose(2 * 8192 + 2048)  # three chunks: what the context leaves is under 8,192
    with duckdb.connect(str(database)) as connection:
        connection.execute(
            "CREATE TABLE docs AS SELECT 1 AS id, 'Platform team' AS title, ? AS description", [text]
        )
    spec = {
        "name": "docs",
        "database": "docs.duckdb",
        "source": {"table": "docs", "fields": ["title", "description"]},
        "prompt": {
            "system": "List the skills and tools the text names, copied word for word.",
            "user": "Title: {title}\n\n{description}",
        },
        "schema": "tests.support.schemas:BoundedMentions",
        "model": "smollm2-135m",
        "endpoint": {"base_url": local_server},
        "concurrency": 2,
        "max_tokens": 512,
        "chunking": {"field": "description", "overlap_tokens": 50},
    }
    job = tmp_path / "docs.yaml"
    job.write_text(yaml.safe_dump(spec))
    started = time.monotonic()
    run = subprocess.run(
        pipeline_command("run", str(job), "--log-format", "json"),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "HTTP 400" not in run.stderr
    extracted, grounding, summary = table_rows(database, "SELECT extracted, grounding, chunks FROM results")[
        0
    ]
    merged, summary = orjson.loads(extracted), orjson.loads(summary)
    answers = table_rows(database, "SELECT extracted FROM results_chunks ORDER BY chunk")
    assert summary["chunks"] == len(answers) >= 3
    union = {normalize_text(skill) for (answer,) in answers for skill in orjson.loads(answer)["skills"]}
    assert {normalize_text(skill) for skill in merged["skills"]} == union
    for entry in orjson.loads(grounding):
        if entry["match"] != "none" and entry["source_field"] == "description":
            found = text[entry["start"] : entry["end"]]
            assert normalize_text(found) == normalize_text(entry["value"]) or entry["match"] == "fuzzy"
    print(
        f"\n{len(answers)} chunks of a {len(text):,}-character document in {time.monotonic() - started:.0f} s"
    )
