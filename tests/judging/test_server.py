"""The judging page's JSON API through aiohttp's test client: a real server on 127.0.0.1, a real database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from pipeline.job.spec import JobSpec
from pipeline.judging.journal import JudgmentWriter, journal_path
from pipeline.judging.server import build_app
from pipeline.judging.session import SessionOptions, load_session
from pipeline.reports import Sample
from tests.support.judging import blind_judgment_rows, judging_job, judgment_rows, write_read_copy
from tests.support.outputs import database_held_by_another_process
from tests.support.variants import two_variant_job

pytestmark = pytest.mark.anyio
JSON = dict[str, Any]


KEY = b"one blind order for every page of a test"


@asynccontextmanager
async def page_server(
    spec: JobSpec, *variants: str, judge: str = "ann", flush_every_s: float = 30.0
) -> AsyncIterator[TestClient[Any, Any]]:
    writer = JudgmentWriter(spec)
    pending = writer.pending()
    options = SessionOptions(variants or ("main",), Sample(50), judge, sample_given=False, order_key=KEY)
    session = load_session(spec, options, pending.added, pending.undone)
    async with TestClient(TestServer(build_app(session, writer, flush_every_s))) as client:
        yield client


async def post(client: TestClient[Any, Any], path: str, body: JSON, status: int = 200) -> JSON:
    response = await client.post(path, json=body)
    assert response.status == status, await response.text()
    answer: JSON = await response.json()
    return answer


async def get(client: TestClient[Any, Any], path: str) -> JSON:
    response = await client.get(path)
    assert response.status == 200, await response.text()
    answer: JSON = await response.json()
    return answer


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return judging_job(tmp_path)


async def test_judge_missing_and_undo_are_written_at_once_and_answered_with_the_record(spec: JobSpec) -> None:
    async with page_server(spec) as client:
        session = await get(client, "/api/session")
        assert (session["records"], session["start"], session["blind"], session["variant"]) == (
            9,
            0,
            False,
            "main",
        )
        record = await get(client, "/api/records/0")
        assert [item["value"] for item in record["items"]][:3] == ["Title 1", "SQL", "Python"]
        assert record["items"][1]["found"] == "exact" and record["unjudged"] == [0, 1, 2, 3, 4, 5]
        judged = await post(client, "/api/judge", {"record": 0, "item": 1, "verdict": "correct"})
        assert (judged["saved"], judged["message"], judged["pending"]) == ("written", "saved", 0)
        assert judged["record"]["items"][1]["verdict"] == "correct"
        assert judgment_rows(spec.database) == [("1", "main", "skills", "SQL", "correct", "ann")]
        await post(client, "/api/judge", {"record": 0, "item": 2, "verdict": "wrong"})
        missing = await post(client, "/api/missing", {"record": 0, "field": "skills", "text": "Excel"})
        assert missing["record"]["missing"] == [{"field": "skills", "value": "Excel", "answers": ["1"]}]
        skills = next(f for f in missing["progress"]["fields"] if f["field"] == "skills")
        assert (
            skills["values"],
            skills["judged"],
            skills["correct"],
            skills["wrong"],
            skills["missing"],
        ) == (
            18,
            2,
            1,
            1,
            1,
        )
        undone = await post(client, "/api/undo", {})
        assert undone["undone"] and undone["focus"] == {"item": None, "field": "skills"}
        undone = await post(client, "/api/undo", {})
        assert undone["focus"] == {"item": 2, "field": "skills"} and undone["record"]["index"] == 0
        assert judgment_rows(spec.database) == [("1", "main", "skills", "SQL", "correct", "ann")]
    # The page reopened on a new server: it goes on where the judge stopped.
    async with page_server(spec) as client:
        record = await get(client, "/api/records/0")
        assert record["items"][1]["verdict"] == "correct" and record["unjudged"] == [0, 2, 3, 4, 5]


async def test_undo_with_nothing_said_says_so_and_bad_requests_are_400(spec: JobSpec) -> None:
    async with page_server(spec) as client:
        assert await post(client, "/api/undo", {}) == {"undone": False, "message": "nothing to undo"}
        bad = await post(client, "/api/judge", {"record": 0, "item": 0, "verdict": "maybe"}, 400)
        assert bad["error"] == "verdict must be 'correct' or 'wrong'"
        bad = await post(client, "/api/judge", {"record": 99, "item": 0, "verdict": "correct"}, 400)
        assert bad["error"] == "no record number 99 (the session has 9)"
        bad = await post(client, "/api/judge", {"record": 0, "item": 60, "verdict": "correct"}, 400)
        assert "no value number 60" in bad["error"]
        bad = await post(client, "/api/missing", {"record": 0, "field": "skills", "text": "SQL"}, 400)
        assert "judge it instead" in bad["error"]
    assert judgment_rows(spec.database) == []


async def test_only_json_from_this_machine_changes_anything(spec: JobSpec) -> None:
    async with page_server(spec) as client:
        form = await client.post("/api/judge", data="record=0&item=0&verdict=correct")
        assert form.status == 403
        cross_site = await client.post(
            "/api/judge",
            json={"record": 0, "item": 0, "verdict": "correct"},
            headers={"Origin": "https://evil.test"},
        )
        assert cross_site.status == 403
        rebound = await client.get("/api/session", headers={"Host": "evil.test"})
        assert rebound.status == 403
    assert judgment_rows(spec.database) == []


async def test_the_page_carries_the_session_under_a_policy_of_its_own_script_and_this_server(
    spec: JobSpec,
) -> None:
    async with page_server(spec) as client:
        response = await client.get("/")
        assert response.status == 200
        page = await response.text()
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and policy.endswith("connect-src 'self'")
    assert f'content="{policy}"' in page
    assert '"judge":"ann"' in page and "__JUDGING_DATA__" not in page


@pytest.fixture
def blind_spec(tmp_path: Path) -> JobSpec:
    return two_variant_job(tmp_path)


async def test_a_blind_page_never_names_a_variant_or_a_model(blind_spec: JobSpec) -> None:
    spec = blind_spec
    secrets = ("main", "big", "test-model", "big-model")
    said: list[str] = []
    async with page_server(spec, "main", "big") as client:
        page = await (await client.get("/")).text()
        said.append(page.split('id="judging-data">', 1)[1].split("</script>", 1)[0])  # the page's data
        session = await get(client, "/api/session")
        assert session["blind"] and session["variant"] is None
        for index in range(session["records"]):
            record = await get(client, f"/api/records/{index}")
            assert [answer["id"] for answer in record["answers"]] == ["1", "2"]
            assert {answer["label"] for answer in record["answers"]} == {"answer 1", "answer 2"}
            said.append(str(record))
        said.append(str(await post(client, "/api/judge", {"record": 0, "item": 0, "verdict": "correct"})))
        said.append(
            str(await post(client, "/api/missing", {"record": 0, "field": "skills", "text": "Posting"}))
        )
        said.append(str(await post(client, "/api/undo", {})))
    leaked = [secret for secret in secrets for text in said if secret in text]
    assert not leaked
    # The title both answers gave is one item: judged once, a judgment for each variant.
    assert sorted(row[1] for row in judgment_rows(spec.database)) == ["big", "main"]


async def every_record(client: TestClient[Any, Any]) -> list[JSON]:
    session = await get(client, "/api/session")
    return [await get(client, f"/api/records/{index}") for index in range(session["records"])]


async def test_a_blind_page_after_judging_one_variant_shows_nothing_of_that_judging(
    blind_spec: JobSpec,
) -> None:
    spec = blind_spec
    async with page_server(spec, "main") as client:  # main judged first, on its own page
        for item, verdict in [(0, "wrong"), (1, "correct"), (2, "wrong")]:
            await post(client, "/api/judge", {"record": 0, "item": item, "verdict": verdict})
        await post(client, "/api/judge", {"record": 1, "item": 0, "verdict": "correct"})
        await post(client, "/api/missing", {"record": 0, "field": "skills", "text": "Posting"})
        seen = await get(client, "/api/session")
        assert seen["progress"]["judged"] == 4
    async with page_server(spec, "main", "big", judge="bob") as client:  # a judge who judged nothing
        fresh = (await get(client, "/api/session"))["progress"], await every_record(client)
    async with page_server(spec, "main", "big") as client:
        session = await get(client, "/api/session")
        records = await every_record(client)
        # Nothing of main's judging: no verdict, no missing value, nothing done; as a fresh judge sees it.
        assert session["progress"]["judged"] == 0 and session["start"] == 0
        assert (session["progress"], records) == fresh
        assert all(item["verdict"] is None for record in records for item in record["items"])
        assert all(record["missing"] == [] for record in records)
        judged = await post(client, "/api/judge", {"record": 0, "item": 0, "verdict": "correct"})
        assert judged["progress"]["judged"] == 1 and judged["record"]["items"][0]["verdict"] == "correct"
    # Both kept: main's own judgment and the blind one, which says which pair it was judged blind in.
    rows = [row for row in blind_judgment_rows(spec.database) if row[:3] == ("1", "main", "title")]
    assert [(row[4], row[6]) for row in rows] == [("wrong", ""), ("correct", "big,main")]
    async with page_server(spec, "big", "main") as client:  # the same pair: goes on where it stopped
        assert (await get(client, "/api/session"))["progress"]["judged"] == 1


@pytest.mark.process
async def test_while_a_run_holds_the_database_judgments_wait_in_the_journal(spec: JobSpec) -> None:
    write_read_copy(spec)
    async with page_server(spec, flush_every_s=0.05) as client:
        with database_held_by_another_process(spec.database, as_run=True):
            judged = await post(client, "/api/judge", {"record": 0, "item": 0, "verdict": "correct"})
            assert judged["saved"] == "journaled" and judged["pending"] == 1
            assert judged["message"] == "saved; a run holds the database: written when it ends"
            assert judged["record"]["items"][0]["verdict"] == "correct"
            assert (await get(client, "/api/session"))["pending"] == 1
        # The run ended: the server writes the journal without waiting for another judgment.
        for _ in range(200):
            if not journal_path(spec.database).exists():
                break
            await asyncio.sleep(0.025)
    assert judgment_rows(spec.database) == [("1", "main", "title", "Title 1", "correct", "ann")]
