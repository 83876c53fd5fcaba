from __future__ import annotations

import re
from pathlib import Path

import duckdb
import httpx2

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"


def build_source(database: Path, count: int) -> None:
    """``count`` postings: the real Adzuna ads, repeated under new ids, or synthetic ones without them."""
    with duckdb.connect(str(database)) as connection:
        if SHARED.is_file():
            connection.execute(
                f"CREATE OR REPLACE TABLE postings AS "
                f"WITH ads AS (SELECT row_number() OVER () - 1 AS n, Title AS title, FullDescription AS description "
                f"FROM read_csv('{SHARED}', header = true)), copies AS (SELECT i FROM range({count}) t(i)) "
                f"SELECT i AS id, title, description FROM copies JOIN ads ON ads.n = i % (SELECT count(*) FROM ads)"
            )
        else:
            connection.execute(
                f"CREATE OR REPLACE TABLE postings AS SELECT i AS id, 'Engineer ' || i AS title, "
                f"repeat('We need SQL and Python. ', 60) AS description FROM range({count}) t(i)"
            )


def sim_metric(url: str, name: str) -> float:
    text = httpx2.get(url.removesuffix("/v1") + "/metrics").text
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.]+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))
