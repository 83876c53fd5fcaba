"""The share of values found, defined once: what a value is and what found means are the same for one
record's grounding, ``eval``'s and ``compare``'s summary, ``status`` (in SQL) and a run's profile, shown
on one set of stored results that holds every edge of the definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.job.spec import JobSpec
from pipeline.quality.found_share import FoundShare, found_shares
from pipeline.quality.grounding import Grounding, grounding_from_json
from pipeline.reports.reading import EVERY_RECORD, open_output
from pipeline.reports.shared import grounding_summary
from pipeline.reports.status import job_status
from pipeline.source.db import open_database
from pipeline.store.run_profiles import run_profile
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.jobs import make_job
from tests.support.runs import run_served

pytestmark = pytest.mark.anyio


def entry(path: str | None, value: str | None, match: str | None) -> dict[str, Any]:
    stored = {"path": path, "value": value, "match": match, "source_field": "description"}
    return {key: item for key, item in stored.items() if item is not None}


#: Each result's stored grounding column, one per record.
STORED: list[list[dict[str, Any]] | None] = [
    [entry("skills", "SQL", "exact"), entry("skills", "Go", "none"), entry("title", "Nurse", "fuzzy")],
    [entry("skills", "R", None)],  # no match stored: not found
    [entry("skills", None, "exact"), entry(None, "x", "exact"), {"path": None, "value": "y"}],  # no values
    [],  # grounded, nothing to look for
    None,  # stored without grounding: no values
    [entry("title", "Chef", "normalised"), entry("skills", "Excel", "exact")],
]
EXPECTED = {"skills": FoundShare(2, 4), "title": FoundShare(2, 2)}


@pytest.fixture
async def stored(tmp_path: Path) -> JobSpec:
    spec = make_job(tmp_path, records=len(STORED), schema="tests.support.schemas:GroundedItem")
    summary = await run_served(spec, ScriptedServer([respond(good_completion())]))
    assert summary.done == len(STORED)
    connection = open_database(spec.database)
    for record, grounding in enumerate(STORED):
        text = None if grounding is None else orjson.dumps(grounding).decode()
        connection.execute("UPDATE results SET grounding = ? WHERE record_id = ?", [text, record])
    connection.close()
    return spec


def test_one_records_grounding_counts_by_the_definition() -> None:
    values = [value for grounding in STORED for value in grounding_from_json(grounding) or ()]
    assert found_shares(values) == EXPECTED
    assert Grounding(("title", "skills", "company"), tuple(values)).share_by_path() == {
        "title": EXPECTED["title"],
        "skills": EXPECTED["skills"],
        "company": FoundShare(0, 0),  # asked for, with no value: 0 of 0, no share
    }
    assert FoundShare().share is None and FoundShare(1, 4).share == 0.25


async def test_every_reader_of_stored_grounding_agrees(stored: JobSpec) -> None:
    assert job_status(stored).grounding == {path: share.to_json() for path, share in EXPECTED.items()}
    with open_output(stored) as output:
        results = output.results(["main"], EVERY_RECORD)["main"].values()
        summary = grounding_summary(["skills"], results)
    assert {share.path: share.counts for share in summary.shares} == EXPECTED
    assert summary.without_grounding == 1
    connection = open_database(stored.database, read_only=True)
    try:
        fields = run_profile(connection, stored, run_id=1)["fields"]
    finally:
        connection.close()
    assert {name: fields[name]["grounded"] for name in EXPECTED} == {
        name: share.to_json() for name, share in EXPECTED.items()
    }
