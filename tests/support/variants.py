"""A job with two variants, ``main`` and ``big``, made by real runs against scripted servers whose
answers are chosen per record, so agreement, tokens, failures and grounding are known exactly.

The source: records ``SOURCE_IDS``, each ``Title N`` / ``Posting N needs SQL and Python.``; after the
runs, record ``LATE_ID`` is added (nothing extracted it yet). The schema is ``GroundedItem`` (its
``skills`` are grounded). Every reply's usage is 100 prompt, 40 completion and 10 reasoning tokens.

``main`` answers ``title: Title N, skills: [SQL, Python], years: N``, except record 9: schema-invalid
every time (a failure ``schema_invalid`` after 2 attempts). ``big`` (model ``big-model``) answers the
same, except: record 1 first with invalid JSON, then well (2 attempts: 200/80/20 tokens); records 2
and 3 skills ``[SQL]``; record 3 years 30; record 5 skills ``[SQL, Python, Rust]`` (Rust is not in
the text); record 8 truncated (a failure ``truncated``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio
import duckdb
import httpx2
import orjson
import pytest

from pipeline.job.spec import JobSpec, load_job
from pipeline.reports import Sample
from pipeline.run.runner import RunSummary
from tests.support.fakes import Handler, completion, respond
from tests.support.jobs import write_job
from tests.support.runs import run_served

SOURCE_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 42)
LATE_ID = 50
#: Gold for main: 42 (a string id) all right; 1 skills half right; 2 skills half precise, years wrong;
#: 9 failed; 50 not extracted yet; 77 not in the source.
PARTIAL_GOLD: list[dict[str, Any]] = [
    {"id": "42", "title": "Title 42", "skills": ["SQL", "Python"], "years": 42},
    {"id": 1, "skills": ["SQL", "Excel"], "years": 1},
    {"id": 2, "skills": ["SQL"], "years": 3},
    {"id": 9, "skills": ["SQL"]},
    {"id": LATE_ID, "skills": []},
    {"id": 77, "skills": []},
]
#: The sample ``--sample 4 --seed 7`` and its records (checked against sampled runs in test_reports).
SAMPLE = Sample(4, 7)
SAMPLED_IDS = {"2", "3", "6", "9"}
MODELS = ("test-model", "big-model")
#: record number, attempt (1, 2, ...) -> the reply
Answer = Callable[[int, int], httpx2.Response]


def approx(value: float) -> Any:
    """A float compared to 1e-9."""
    return pytest.approx(value, abs=1e-9)


def description(number: int) -> str:
    return f"Posting {number} needs SQL and Python."


def extraction(number: int, **changes: Any) -> dict[str, Any]:
    """What ``main`` extracts from record ``number`` (with ``changes``)."""
    return {
        "title": f"Title {number}",
        "skills": ["SQL", "Python"],
        "years": number,
        "low": 0,
        "high": 0,
        **changes,
    }


def reply(answer: Mapping[str, Any]) -> httpx2.Response:
    return respond(completion(orjson.dumps(answer).decode()))


def main_answer(number: int, attempt: int) -> httpx2.Response:
    if number == 9:
        return reply(extraction(number, low=5, high=1))
    return reply(extraction(number))


BIG_CHANGES: dict[int, dict[str, Any]] = {
    2: {"skills": ["SQL"]},
    3: {"skills": ["SQL"], "years": 30},
    5: {"skills": ["SQL", "Python", "Rust"]},
}


def big_answer(number: int, attempt: int) -> httpx2.Response:
    if number == 1 and attempt == 1:
        return respond(completion('{"title": "Title 1", "skills": ["SQL"'))
    if number == 8:
        return respond(completion('{"title": "Ti', finish_reason="length"))
    return reply(extraction(number, **BIG_CHANGES.get(number, {})))


def record_number(body: Mapping[str, Any]) -> int:
    """The record a request is about: its first user message starts ``Title: Title N``."""
    user = next(message for message in body["messages"] if message["role"] == "user")
    return int(str(user["content"]).split("\n")[0].rsplit(" ", 1)[1])


def answering(answer: Answer) -> Handler:
    """A fake server that answers each record's attempts with ``answer``."""
    attempts: dict[int, int] = {}

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"object": "list", "data": [{"id": name} for name in MODELS]})
        number = record_number(orjson.loads(request.content))
        attempts[number] = attempts.get(number, 0) + 1
        return answer(number, attempts[number])

    return handle


def run_variant(spec: JobSpec, variant: str, answer: Answer, **options: Any) -> RunSummary:
    """One real run of ``variant`` of the job against a server answering with ``answer``."""
    return anyio.run(functools.partial(run_served, spec.for_variant(variant), answering(answer), **options))


def make_postings(database: Path, ids: Iterable[int]) -> None:
    with duckdb.connect(str(database)) as connection:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS postings (id BIGINT, title VARCHAR, description VARCHAR)"
        )
        for number in ids:
            connection.execute(
                "INSERT INTO postings VALUES (?, ?, ?)", [number, f"Title {number}", description(number)]
            )


def variants_job(folder: Path) -> JobSpec:
    """The job file (variant ``big``: model ``big-model``; ``titles``: a template with the title only)
    and its source, nothing run yet."""
    path = write_job(
        folder,
        schema="tests.support.schemas:GroundedItem",
        retry={"reasks": 1, "truncation_retries": 0},
        variants={"big": {"model": "big-model"}, "titles": {"prompt": {"user": "Title: {title}"}}},
    )
    spec = load_job(path)
    make_postings(spec.database, SOURCE_IDS)
    return spec


def two_variant_job(folder: Path) -> JobSpec:
    """:func:`variants_job`, both variants run over every record, then ``LATE_ID`` added."""
    spec = variants_job(folder)
    main = run_variant(spec, "main", main_answer)
    big = run_variant(spec, "big", big_answer)
    assert (main.done, main.failed, big.done, big.failed) == (9, 1, 9, 1), (main, big)
    make_postings(spec.database, [LATE_ID])
    return spec


def write_gold(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """``rows`` as a JSON-lines gold file."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def stored_extractions(database: Path, variant: str) -> dict[int, dict[str, Any]]:
    """record id -> the variant's stored extraction, read straight from the results table."""
    with duckdb.connect(str(database), read_only=True) as connection:
        rows = connection.execute(
            "SELECT record_id, extracted FROM results WHERE variant = ? ORDER BY record_id", [variant]
        ).fetchall()
    return {int(record_id): orjson.loads(extracted) for record_id, extracted in rows}
