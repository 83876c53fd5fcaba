"""Whole or in chunks: the estimate judges first, the server counts only what it says does not fit, and
auto sizes chunks to the context with room for max_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError, TooLongError
from pipeline.extraction.budget import FIXED_PART_ADVICE, FIXED_PART_FULL, estimated_tokens, fewest_tokens
from pipeline.extraction.chunk_plan import CHARS_MARGIN, ChunkPlanner
from pipeline.extraction.prompt import PromptBuilder
from pipeline.job.spec import JobSpec, load_job
from pipeline.source.reader import SourceRecord
from tests.support.endpoints import endpoint_for
from tests.support.fakes import ScriptedServer, serving
from tests.support.jobs import write_job
from tests.support.runs import served

pytestmark = pytest.mark.anyio

TEXT = " ".join(f"Sentence {i} of the posting." for i in range(400))  # 11,489 characters


def per_char(messages: list[dict[str, Any]]) -> int:
    """A tokenizer at 4 characters a token, plus 5 a message."""
    return sum(len(message["content"]) // 4 + 5 for message in messages)


def job(tmp_path: Path, **overrides: Any) -> JobSpec:
    chunking = {"field": "description", **overrides.pop("chunking", {})}
    return load_job(write_job(tmp_path, chunking=chunking, **overrides))


@asynccontextmanager
async def planner(spec: JobSpec, server: ScriptedServer) -> AsyncIterator[ChunkPlanner]:
    async with serving(server) as loopback:
        endpoint = endpoint_for(served(spec, loopback))
        try:
            await endpoint.client.check_server()
            assert spec.chunking is not None
            yield ChunkPlanner(spec.chunking, PromptBuilder(spec), spec.max_tokens, [endpoint], "job.yaml")
        finally:
            await endpoint.client.aclose()


async def test_auto_keeps_a_record_whole_when_it_fits_with_its_budget(tmp_path: Path) -> None:
    spec = job(tmp_path)
    near = SourceRecord(2, {"title": "T", "description": TEXT[:10_000]})
    estimate = estimated_tokens(PromptBuilder(spec).request_for(near.fields).messages)
    context = estimate + 256 - 1  # the estimate says it does not fit; it counts about a quarter less
    server = ScriptedServer([], max_model_len=context, count_tokens=per_char)
    async with planner(spec, server) as plans:
        assert await plans.plan(SourceRecord(1, {"title": "T", "description": "Short."})) is None
        assert server.tokenize_bodies == []  # the estimate said it fits: nothing counted
        assert await plans.plan(near) is None  # counted by the server: it fits
        assert len(server.tokenize_bodies) == 1
        assert per_char(server.tokenize_bodies[0]["messages"]) + 256 <= context


async def test_auto_splits_to_what_the_context_leaves_after_max_tokens(tmp_path: Path) -> None:
    server = ScriptedServer([], max_model_len=1500, count_tokens=per_char)
    record = SourceRecord(1, {"title": "T", "description": TEXT})
    async with planner(job(tmp_path, max_tokens=500), server) as plans:
        plan = await plans.plan(record)
    assert plan is not None and plan.field == "description" and plan.passes == 1
    rest = per_char(server.tokenize_bodies[1]["messages"])  # the prompt without the description
    room_chars = (1500 - 500 - rest) * len(TEXT) / (per_char(server.tokenize_bodies[0]["messages"]) - rest)
    assert all(len(span) <= room_chars * CHARS_MARGIN for span in plan.spans)
    assert max(len(span) for span in plan.spans) > room_chars * CHARS_MARGIN * 0.8  # not much smaller
    assert plan.spans[0].start == 0 and plan.spans[-1].end == len(TEXT)
    overlaps = [a.end - b.start for a, b in zip(plan.spans, plan.spans[1:], strict=False)]
    assert all(0 < overlap <= 100 * 4 for overlap in overlaps)  # 100 tokens at about 4 characters


async def test_passes_keep_room_for_what_was_found(tmp_path: Path) -> None:
    server = ScriptedServer([], max_model_len=1500, count_tokens=per_char)
    record = SourceRecord(1, {"title": "T", "description": TEXT})
    async with planner(job(tmp_path, max_tokens=500), server) as plans:
        one = await plans.plan(record)
    async with planner(job(tmp_path, max_tokens=500, chunking={"passes": 2}), server) as plans:
        two = await plans.plan(record)
    assert one is not None and two is not None and two.passes == 2
    assert len(two.spans) > len(one.spans) and two.found_room > 0


async def test_a_number_of_tokens_splits_the_field_past_it_and_no_other(tmp_path: Path) -> None:
    server = ScriptedServer([], count_tokens=per_char)  # no context listed: none needed
    spec = job(tmp_path, chunking={"max_chunk_tokens": 1000, "overlap_tokens": 0})
    async with planner(spec, server) as plans:
        plans.check()
        assert await plans.plan(SourceRecord(1, {"title": "T", "description": TEXT[:2000]})) is None
        assert server.tokenize_bodies == []
        plan = await plans.plan(SourceRecord(2, {"title": "T", "description": TEXT}))
    # 2,872 tokens at 4 characters a token: chunks of up to 1,000 tokens (less 5%), so four.
    assert plan is not None and len(plan.spans) == 4
    assert all(3500 < len(span) <= 3800 for span in plan.spans[:3])
    assert [plan.chunk_text(i) for i in range(4)] == [TEXT[s.start : s.end] for s in plan.spans]


async def test_without_a_count_the_estimate_makes_chunks_smaller(tmp_path: Path) -> None:
    server = ScriptedServer([], max_model_len=1500)  # no /tokenize
    async with planner(job(tmp_path, max_tokens=500), server) as plans:
        plan = await plans.plan(SourceRecord(1, {"title": "T", "description": TEXT}))
    assert plan is not None and all(len(span) <= (1500 - 500) * 3 for span in plan.spans)


async def test_other_fields_that_leave_no_room_are_too_long(tmp_path: Path) -> None:
    server = ScriptedServer([], max_model_len=1500, count_tokens=per_char)
    record = SourceRecord(1, {"title": "word " * 800, "description": TEXT})
    async with planner(job(tmp_path, max_tokens=500), server) as plans:
        with pytest.raises(TooLongError, match="^the prompt without field 'description' is ") as caught:
            await plans.plan(record)
    assert caught.value.field == "description" and caught.value.context == 1500


async def test_without_a_count_other_fields_the_floor_leaves_room_for_get_the_smallest_chunks(
    tmp_path: Path,
) -> None:
    """Behind a server that cannot count, the estimate of the other fields leaves no room for a chunk,
    their floor (one token a word) does: not refused, but split into the smallest chunks."""
    server = ScriptedServer([], max_model_len=1500)  # no /tokenize
    spec = job(tmp_path, max_tokens=500)
    record = SourceRecord(1, {"title": "word " * 800, "description": TEXT})
    rest = PromptBuilder(spec).request_for({**record.fields, "description": ""}).messages
    assert 1500 - 500 - estimated_tokens(rest) < 64 <= 1500 - 500 - fewest_tokens(rest)
    async with planner(spec, server) as plans:
        plan = await plans.plan(record)
    assert plan is not None and all(len(span) <= 64 * 3 for span in plan.spans)


async def test_a_fixed_part_that_leaves_no_room_for_a_chunk_says_chunking_cannot_help(tmp_path: Path) -> None:
    server = ScriptedServer([], max_model_len=1500, count_tokens=per_char)
    spec = job(tmp_path, max_tokens=200, prompt={"system": "Extract the posting, carefully. " * 180})
    async with planner(spec, server) as plans:
        with pytest.raises(TooLongError) as caught:
            await plans.plan(SourceRecord(1, {"title": "T", "description": TEXT}))
    assert str(caught.value).startswith("the prompt without field 'description' is ")
    assert f", and {FIXED_PART_FULL}: its fixed part (system prompt, examples" in str(caught.value)
    assert str(caught.value).endswith(f"; {FIXED_PART_ADVICE}")


@pytest.mark.parametrize(
    ("overrides", "listed", "message"),
    [
        ({}, None, "auto fits chunks to the server's context, which the server does not list"),
        ({"max_tokens": 1450}, 1500, "auto leaves no room for a chunk: a context of 1,500 tokens less"),
        ({"chunking": {"max_chunk_tokens": 1490}}, 1500, "1,490 tokens of chunk and at least"),
    ],
)
async def test_chunks_that_cannot_fit_are_a_configuration_error(
    tmp_path: Path, overrides: dict[str, Any], listed: int | None, message: str
) -> None:
    async with planner(job(tmp_path, **overrides), ScriptedServer([], max_model_len=listed)) as plans:
        with pytest.raises(ConfigError, match=f"^job.yaml: key 'chunking.max_chunk_tokens': {message}"):
            plans.check()
