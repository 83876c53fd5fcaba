"""Records whole or in chunks: a long record's chunks go through the extractor like records, finished
chunks are handed on at once and never asked for again, and the merged answer is the record's."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from pipeline.errors import FailureClass
from pipeline.extraction.budget import estimated_text_tokens
from pipeline.extraction.chunk_plan import ChunkPlanner
from pipeline.extraction.documents import FOUND_INSTRUCTION, DocumentExtractor
from pipeline.extraction.extractor import BudgetGrowth, Extractor
from pipeline.extraction.outcomes import ChunkDone, Extracted, Failed, Outcome
from pipeline.extraction.prompt import PromptBuilder
from pipeline.extraction.retry import RetryPolicy
from pipeline.job.spec import JobSpec, load_job
from pipeline.quality.grounding import Grounder
from pipeline.run.stats import RunStats
from pipeline.source.reader import RecordId, SourceRecord
from tests.support.endpoints import endpoint_for, running_router
from tests.support.fakes import ScriptedServer, completion, error, respond, serving
from tests.support.jobs import write_job
from tests.support.runs import no_sleep, served

pytestmark = pytest.mark.anyio

SKILL = re.compile(r"skill\d+")
# 60 sentences, 3 to a paragraph, each naming one skill: about 2,000 characters.
DOCUMENT = "\n\n".join(
    " ".join(f"The role needs skill{3 * p + s} every day." for s in range(3)) for p in range(20)
)
LONG = SourceRecord(5, {"title": "Data Engineer", "description": DOCUMENT}, content_hash=77)
SHORT = SourceRecord(6, {"title": "Analyst", "description": "Needs skill1."}, content_hash=78)


def chunk_of(body: dict[str, Any]) -> str:
    """The description a request carries: the record's message after its title line."""
    record = next(m["content"] for m in reversed(body["messages"]) if m["content"].startswith("Title: "))
    return str(record).split("\n\n", 1)[1]


def answering(body: dict[str, Any], **extra: Any) -> httpx2.Response:
    """An answer naming every skill the chunk has, and the first two years it mentions."""
    skills = SKILL.findall(chunk_of(body))
    value = {"title": "Data Engineer", "skills": skills, "years": len(skills), "tools": [], **extra}
    return respond(completion(orjson.dumps(value).decode()))


def reader(request: httpx2.Request) -> httpx2.Response:
    return answering(orjson.loads(request.content))


class Kept:
    """Chunks an earlier run kept, by record."""

    def __init__(self, chunks: Sequence[ChunkDone] = ()) -> None:
        self.chunks = list(chunks)

    async def finished(self, record_id: RecordId, content_hash: int | None) -> list[ChunkDone]:
        return [done for done in self.chunks if done.record_id == record_id]


@asynccontextmanager
async def documents(
    spec: JobSpec, server: ScriptedServer, kept: Kept | None = None
) -> AsyncIterator[DocumentExtractor]:
    async with serving(server) as loopback:
        spec = served(spec, loopback)
        endpoint = endpoint_for(spec)
        try:
            await endpoint.client.check_server()
            async with running_router([endpoint]) as router:
                prompts = PromptBuilder(spec)
                extractor = Extractor(
                    router,
                    prompts,
                    spec.schema_class,
                    RetryPolicy(spec.retry, sleep=no_sleep),
                    BudgetGrowth(spec.retry.truncation_growth, spec.max_tokens_ceiling),
                    RunStats(pending_at_start=1, concurrency=8),
                    Grounder.for_schema(spec.schema_class),
                )
                assert spec.chunking is not None
                planner = ChunkPlanner(spec.chunking, prompts, spec.max_tokens, router.endpoints, "job.yaml")
                planner.check()
                yield DocumentExtractor(extractor, prompts, spec.schema_class, planner, kept or Kept())
        finally:
            await endpoint.client.aclose()


def job(tmp_path: Path, **chunking: Any) -> JobSpec:
    settings = {"field": "description", "max_chunk_tokens": 200, "overlap_tokens": 20, **chunking}
    return load_job(write_job(tmp_path, schema="tests.support.schemas:Mentions", chunking=settings))


async def extract(extractor: DocumentExtractor, record: SourceRecord) -> tuple[Outcome, list[ChunkDone]]:
    emitted: list[ChunkDone] = []

    async def emit(done: ChunkDone) -> None:
        emitted.append(done)

    return await extractor.extract(record, emit), emitted


async def test_a_record_that_fits_goes_whole_as_without_chunking(tmp_path: Path) -> None:
    server = ScriptedServer([reader])
    async with documents(job(tmp_path), server) as extractor:
        outcome, emitted = await extract(extractor, SHORT)
        whole = await extractor.extractor.extract(SHORT)
    assert isinstance(outcome, Extracted) and not outcome.chunked and emitted == []
    assert server.bodies[0] == server.bodies[1]  # the same request as the extractor alone sends
    assert isinstance(whole, Extracted) and outcome.data_json == whole.data_json


async def test_a_long_record_is_the_merge_of_its_chunks(tmp_path: Path) -> None:
    server = ScriptedServer([reader])
    async with documents(job(tmp_path), server) as extractor:
        outcome, emitted = await extract(extractor, LONG)
    assert isinstance(outcome, Extracted) and outcome.chunked
    chunks = [chunk_of(body) for body in server.bodies]
    assert len(chunks) == len(emitted) >= 3 and all(len(chunk) <= 200 * 3 for chunk in chunks)
    assert all(
        body["messages"][-1]["content"].startswith("Title: Data Engineer\n\n") for body in server.bodies
    )
    # Every chunk answer was handed on, with its place; the merged list is their union, in order.
    assert sorted(done.chunk for done in emitted) == list(range(1, len(emitted) + 1))
    for done in emitted:
        assert DOCUMENT[done.start : done.end] in chunks
        assert (done.pass_, done.chunks, done.result.content_hash) == (1, len(emitted), 77)
    union = [
        skill
        for done in sorted(emitted, key=lambda d: d.chunk)
        for skill in orjson.loads(done.result.data_json)["skills"]
    ]
    merged = orjson.loads(outcome.data_json)
    assert merged["skills"] == list(dict.fromkeys(union)) == SKILL.findall(DOCUMENT)
    assert merged["years"] == max(orjson.loads(done.result.data_json)["years"] for done in emitted)  # max
    # Spans are offsets into the whole description, and say which chunk found each value.
    grounding = orjson.loads(outcome.grounding_json or "[]")
    for entry in grounding:
        text = DOCUMENT if entry["source_field"] == "description" else "Data Engineer"
        assert text[entry["start"] : entry["end"]] == entry["value"]
        assert 1 <= entry["chunk"] <= len(emitted) and entry["pass"] == 1
    summary = orjson.loads(outcome.chunking_json or "{}")
    assert summary["chunks"] == len(emitted) and summary["field"] == "description"
    assert summary["added"] == {"1": 60 + 2}  # 60 skills, the title and the years
    assert outcome.attempts == len(emitted) and outcome.usage.requests == len(emitted)
    for name in ("requests", "prompt_tokens", "completion_tokens", "reasoning_tokens", "latency_s"):
        each = [getattr(done.result.usage, name) for done in emitted]  # the record's cost is all of theirs
        assert getattr(outcome.usage, name) == pytest.approx(sum(each)), name
    assert outcome.usage.completion_tokens > 0


async def test_kept_chunks_are_not_asked_for_again(tmp_path: Path) -> None:
    first = ScriptedServer([reader])
    async with documents(job(tmp_path), first) as extractor:
        _, emitted = await extract(extractor, LONG)
    kept = Kept([*emitted[: len(emitted) // 2], emitted[-1]])
    second = ScriptedServer([reader])
    async with documents(job(tmp_path), second, kept) as extractor:
        outcome, again = await extract(extractor, LONG)
    assert sorted(done.chunk for done in again) == sorted(
        done.chunk for done in emitted if done not in kept.chunks
    )
    assert len(second.bodies) == len(emitted) - len(kept.chunks)
    assert isinstance(outcome, Extracted)
    assert orjson.loads(outcome.data_json)["skills"] == SKILL.findall(DOCUMENT)
    assert outcome.attempts == len(emitted)  # every chunk's, the kept ones' too


async def test_a_kept_chunk_of_another_split_is_not_taken(tmp_path: Path) -> None:
    async with documents(job(tmp_path), ScriptedServer([reader])) as extractor:
        _, emitted = await extract(extractor, LONG)
    moved = [
        ChunkDone(d.record_id, d.pass_, d.chunk, d.chunks, d.start + 1, d.end, d.result) for d in emitted
    ]
    server = ScriptedServer([reader])
    async with documents(job(tmp_path), server, Kept(moved)) as extractor:
        await extract(extractor, LONG)
    assert len(server.bodies) == len(emitted)


async def test_a_chunk_that_fails_fails_the_record_naming_it(tmp_path: Path) -> None:
    def refusing_the_third(request: httpx2.Request) -> httpx2.Response:
        body = orjson.loads(request.content)
        return error(400, "bad chunk") if "skill30 " in chunk_of(body) else answering(body)

    async with documents(job(tmp_path), ScriptedServer([refusing_the_third])) as extractor:
        outcome, emitted = await extract(extractor, LONG)
    assert isinstance(outcome, Failed) and outcome.chunked
    assert outcome.failure_class is FailureClass.PERMANENT
    assert re.match(
        r"^chunk \d+ of \d+ \(characters [\d,]+-[\d,]+ of 'description'\): HTTP 400: bad chunk",
        outcome.message,
    )
    assert emitted and all("skill30 " not in DOCUMENT[d.start : d.end] for d in emitted)  # the rest kept
    assert outcome.usage.requests == 1


async def test_a_later_pass_is_told_what_was_found_and_adds_only_new_grounded_values(tmp_path: Path) -> None:
    def second_look(request: httpx2.Request) -> httpx2.Response:
        body = orjson.loads(request.content)
        if not body["messages"][-1]["content"].startswith("Your previous reply"):
            return answering(body)
        listed = body["messages"][-1]["content"].split("\n")[1]
        found = orjson.loads(listed)
        assert found["title"] == "Data Engineer" and found["skills"]  # the chunk's own first
        assert found["skills"][0] == SKILL.findall(chunk_of(body))[0]
        assert estimated_text_tokens(listed) <= 200 // 3  # the room kept for the list
        return answering(body, skills=["every day", "invented skill"], tools=["Excel"])

    server = ScriptedServer([second_look])
    async with documents(job(tmp_path, passes=2), server) as extractor:
        outcome, emitted = await extract(extractor, LONG)
    assert isinstance(outcome, Extracted)
    chunks = len(emitted) // 2
    assert sorted((d.pass_, d.chunk) for d in emitted) == [
        (p, c) for p in (1, 2) for c in range(1, chunks + 1)
    ]
    later = [body for body in server.bodies if body["messages"][-1]["content"].startswith("Your previous")]
    assert len(later) == chunks
    assert later[0]["messages"][-1]["content"].endswith(FOUND_INSTRUCTION.split("{found}\n")[1])
    merged = orjson.loads(outcome.data_json)
    skills = SKILL.findall(DOCUMENT)
    assert merged["skills"] == [skills[0], "every day", *skills[1:]]  # new, in the text: in its place
    assert merged["tools"] == []  # not grounded: a later pass cannot show the text has it
    assert orjson.loads(outcome.chunking_json or "{}")["added"]["2"] == 1


async def test_the_other_fields_leaving_no_room_is_too_long_without_a_request(tmp_path: Path) -> None:
    spec = load_job(
        write_job(
            tmp_path,
            schema="tests.support.schemas:Mentions",
            max_model_len=1200,
            max_tokens=300,
            chunking={"field": "description"},
        )
    )
    server = ScriptedServer([reader])  # no /tokenize: only the floor (one token a word) may refuse
    record = SourceRecord(9, {"title": "word " * 900, "description": DOCUMENT}, 1)
    async with documents(spec, server) as extractor:
        outcome, emitted = await extract(extractor, record)
    assert server.bodies == [] and emitted == []
    assert isinstance(outcome, Failed) and outcome.failure_class is FailureClass.TOO_LONG
    assert outcome.message.startswith("the prompt without field 'description' is ")
