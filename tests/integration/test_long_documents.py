"""Documents longer than the context, against `pipeline sim --max-model-len` over HTTP, through
`pipeline run`: chunked so that no request is refused for its length, resumed mid-document without
asking for a kept chunk again, merged into the union of the chunk answers with spans in the whole
document; without chunking, never sent."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from pipeline.extraction.prompt import PromptBuilder
from pipeline.job.spec import load_job
from pipeline.quality.normalize import normalize_text
from pipeline.sim.answers import prompt_tokens as sim_prompt_tokens
from tests.support.jobs import table_rows, write_job
from tests.support.processes import (
    REPO,
    pipeline_command,
    run_pipeline,
    sim_metrics,
    sim_server,
    subprocess_env,
    wait_until,
)

pytestmark = pytest.mark.integration

CONTEXT = 2048
MAX_TOKENS = 512
SIM = ("--model", "test-model", "--max-model-len", str(CONTEXT), "--quoted-answers", "--seed", "5")


def document(number: int, tokens: int) -> str:
    """Paragraphs of sentences of distinct words, about ``tokens`` tokens as the simulator counts
    (4 characters a token)."""
    sentences = [" ".join(f"w{number}x{i}y{j}" for j in range(6)) + "." for i in range(tokens * 4 // 52 + 1)]
    return "\n\n".join(" ".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4))


def make_source(database: Path, documents: dict[int, str]) -> None:
    with duckdb.connect(str(database)) as connection:
        connection.execute("CREATE TABLE postings (id INTEGER, title VARCHAR, description VARCHAR)")
        connection.executemany(
            "INSERT INTO postings VALUES (?, ?, ?)",
            [[number, f"Document {number}", text] for number, text in documents.items()],
        )


def job(folder: Path, url: str, **overrides: Any) -> Path:
    settings = {
        "endpoint": {"base_url": url},
        "schema": "tests.support.schemas:Mentions",
        "max_tokens": MAX_TOKENS,
        "chunking": {"field": "description", "overlap_tokens": 40},
        **overrides,
    }
    return write_job(folder, **{key: value for key, value in settings.items() if value is not None})


def fitting_exactly(folder: Path) -> str:
    """A description whose request, as the simulator counts it, fits the context with the whole budget
    and not a token to spare (record 9, titled "Document 9")."""
    prompts = PromptBuilder(load_job(job(folder, "http://127.0.0.1:1/v1", chunking=None)))
    text = "word " * 1000

    def counted(description: str) -> int:
        request = prompts.request_for({"title": "Document 9", "description": description})
        return sim_prompt_tokens([dict(message) for message in request.messages])

    while counted(text) < CONTEXT - MAX_TOKENS:  # a character at a time: a token at most
        text += "x"
    return text


LONG = {
    number: document(number, CONTEXT * times)
    for number, times in zip(range(1, 5), (3, 5, 7, 10), strict=True)
}


def test_documents_past_the_context_are_chunked_merged_and_never_refused(tmp_path: Path) -> None:
    make_source(tmp_path / "test.duckdb", {**LONG, 9: fitting_exactly(tmp_path)})
    with sim_server(*SIM) as url:
        done = run_pipeline("run", str(job(tmp_path, url)))
        metrics = sim_metrics(url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert metrics["pipeline_sim:context_rejections_total"] == 0  # no request refused for its length
    database = tmp_path / "test.duckdb"
    status = orjson.loads(run_pipeline("status", str(job(tmp_path, url)), "--json").stdout)
    assert status["done"] == 5 and status["chunking"]["records"] == 4
    chunks = table_rows(database, "SELECT record_id, chunk_count, count(*) FROM results_chunks GROUP BY ALL")
    assert sorted(number for number, _, _ in chunks) == [1, 2, 3, 4]
    assert all(count == kept >= 3 for _, count, kept in chunks)
    assert metrics["pipeline_sim:chat_requests_total"] == sum(count for _, count, _ in chunks) + 1
    whole = table_rows(database, "SELECT prompt_tokens, max_tokens, chunks FROM results WHERE record_id = 9")
    assert whole == [(CONTEXT - MAX_TOKENS, MAX_TOKENS, None)]  # just fits: sent whole, as it is
    results = dict(table_rows(database, "SELECT record_id, [extracted, grounding, chunks] FROM results"))
    for number, text in LONG.items():
        extracted, grounding, summary = (orjson.loads(part) for part in results[number])
        answers = table_rows(
            database, f"SELECT extracted FROM results_chunks WHERE record_id = {number} ORDER BY chunk"
        )
        union = {normalize_text(skill) for (answer,) in answers for skill in orjson.loads(answer)["skills"]}
        assert {normalize_text(skill) for skill in extracted["skills"]} == union
        assert len(extracted["skills"]) == len(union)  # each once
        assert summary["chunks"] == len(answers) and summary["field"] == "description"
        located = [entry for entry in grounding if entry["match"] != "none"]
        assert located and {entry["chunk"] for entry in grounding} <= set(range(1, len(answers) + 1))
        for entry in located:
            source = text if entry["source_field"] == "description" else f"Document {number}"
            found = source[entry["start"] : entry["end"]]
            assert normalize_text(found) == normalize_text(entry["value"]), entry
    read_like_any_other(tmp_path, job(tmp_path, url), results)


def read_like_any_other(folder: Path, path: Path, results: dict[int, list[str]]) -> None:
    """eval scores the merged results against a gold file, and review shows them with their chunks."""
    gold = folder / "gold.jsonl"
    first = orjson.loads(results[1][0])["skills"]
    gold.write_bytes(orjson.dumps({"id": 1, "skills": [*first, "not found anywhere"]}) + b"\n")
    scored = run_pipeline("eval", str(path), "--gold", str(gold), "--json")
    assert scored.returncode == 0, scored.stderr[-2000:]
    skills = orjson.loads(scored.stdout)["fields"]["skills"]
    assert (skills["tp"], skills["fp"], skills["fn"]) == (len(first), 0, 1)
    page = folder / "review.html"
    shown = run_pipeline("review", str(path), "--html", str(page))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert '"chunks":' in page.read_text() and '"chunk":1' in page.read_text().replace(" ", "")


def test_a_run_killed_mid_document_resumes_without_asking_for_a_kept_chunk_again(tmp_path: Path) -> None:
    database = tmp_path / "test.duckdb"
    make_source(database, LONG)
    with sim_server(*SIM, "--latency", "0.25") as url:
        path = job(tmp_path, url, concurrency=2)
        first = subprocess.Popen(
            pipeline_command("run", str(path)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=subprocess_env(),
            cwd=REPO,
        )
        snapshot = tmp_path / "test.duckdb.progress.json"

        def kept_some() -> bool:
            try:
                return int(orjson.loads(snapshot.read_bytes()).get("chunks_done", 0)) >= 5
            except (OSError, orjson.JSONDecodeError):
                return False

        try:
            wait_until(kept_some, timeout_s=120)
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
    kept = dict(table_rows(database, "SELECT record_id, count(*) FROM results_chunks GROUP BY ALL"))
    finished = {row[0] for row in table_rows(database, "SELECT record_id FROM results")}
    assert set(LONG) - finished, "the kill came after every document was done"
    status = orjson.loads(run_pipeline("status", str(path), "--json").stdout)["chunking"]
    assert status["kept_chunks"] == sum(kept.get(number, 0) for number in set(LONG) - finished) > 0
    with sim_server(*SIM) as url:  # a fresh server: its counters are the second run's alone
        resumed = run_pipeline("run", str(job(tmp_path, url, concurrency=2)))
        asked = sim_metrics(url)["pipeline_sim:chat_requests_total"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    counts = dict(
        table_rows(database, "SELECT record_id, any_value(chunk_count) FROM results_chunks GROUP BY 1")
    )
    unfinished = set(LONG) - finished
    assert any(0 < kept.get(number, 0) < counts[number] for number in unfinished)  # killed mid-document
    assert asked == sum(counts[number] - kept.get(number, 0) for number in unfinished)
    assert sorted(row[0] for row in table_rows(database, "SELECT record_id FROM results")) == sorted(LONG)


def test_without_chunking_a_document_that_cannot_fit_is_never_sent(tmp_path: Path) -> None:
    """A record whose prompt and budget (as the simulator counts them) just fit the context is sent
    whole, with its whole budget; the long ones are too_long, counted by the simulator's /tokenize and
    never sent."""
    just_under = fitting_exactly(tmp_path)
    make_source(tmp_path / "test.duckdb", {**LONG, 9: just_under})
    with sim_server(*SIM) as url:
        done = run_pipeline("run", str(job(tmp_path, url, chunking=None)))
        metrics = sim_metrics(url)
    assert done.returncode == 1, done.stderr[-3000:]  # finished, with failures
    database = tmp_path / "test.duckdb"
    failed = table_rows(database, "SELECT record_id, failure_class, attempts FROM failures ORDER BY 1")
    assert failed == [(number, "too_long", 0) for number in sorted(LONG)]
    results = table_rows(database, "SELECT record_id, prompt_tokens, max_tokens, chunks FROM results")
    assert results == [(9, CONTEXT - MAX_TOKENS, MAX_TOKENS, None)]
    assert metrics["pipeline_sim:chat_requests_total"] == 1  # only the one that fits
    assert metrics["pipeline_sim:context_rejections_total"] == 0
    report = run_pipeline("failures", str(job(tmp_path, url, chunking=None)))
    assert "too_long: 4" in report.stdout and "chunking: {field: NAME}" in report.stdout


def test_a_second_pass_adds_only_new_values_found_in_the_text(tmp_path: Path) -> None:
    """With answers that vary between requests (--answer-noise), the second pass over each chunk finds
    values the first did not: the merged list keeps those the text has, and status says how many."""
    database = tmp_path / "test.duckdb"
    make_source(database, {1: LONG[2]})
    chunking = {"field": "description", "overlap_tokens": 40, "passes": 2}
    with sim_server(*SIM, "--answer-noise", "0.5") as url:
        path = job(tmp_path, url, chunking=chunking)
        done = run_pipeline("run", str(path))
        status = run_pipeline("status", str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    extracted, summary = (
        orjson.loads(part) for part in table_rows(database, "SELECT extracted, chunks FROM results")[0]
    )
    answers = table_rows(database, "SELECT pass, extracted FROM results_chunks ORDER BY pass, chunk")
    first = {
        normalize_text(skill)
        for number, answer in answers
        if number == 1
        for skill in orjson.loads(answer)["skills"]
    }
    second = {
        normalize_text(skill)
        for number, answer in answers
        if number == 2
        for skill in orjson.loads(answer)["skills"]
    }
    merged = {normalize_text(skill) for skill in extracted["skills"]}
    added = merged - first
    assert first <= merged and added and added <= second
    assert summary["passes"] == 2 and summary["added"]["2"] >= len(added)
    text = LONG[2]
    normalised = normalize_text(text)
    assert all(skill in normalised for skill in added)  # only what the text has
    assert f"pass 2: +{summary['added']['2']}" in status.stdout
