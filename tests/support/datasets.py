"""Large DuckDB sources for integration tests and benchmarks, built from ../shared without copying it."""

from __future__ import annotations

from pathlib import Path

import duckdb

ADZUNA = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"


def build_postings(database: Path, count: int) -> None:
    """``count`` postings: the real Adzuna ads repeated under new ids, or synthetic ones without them."""
    with duckdb.connect(str(database)) as connection:
        if ADZUNA.is_file():
            connection.execute(
                "CREATE OR REPLACE TABLE postings AS WITH ads AS ("
                "SELECT row_number() OVER () - 1 AS n, Title AS title, FullDescription AS description "
                f"FROM read_csv('{ADZUNA}', header = true)) "
                f"SELECT i AS id, title, description FROM range({count}) t(i) "
                "JOIN ads ON ads.n = i % (SELECT count(*) FROM ads)"
            )
        else:
            connection.execute(
                "CREATE OR REPLACE TABLE postings AS SELECT i AS id, 'Engineer ' || i AS title, "
                f"repeat('We need SQL and Python. ', 60) AS description FROM range({count}) t(i)"
            )


if __name__ == "__main__":  # python -m tests.support.datasets DATABASE COUNT (used by benchmarks)
    import sys

    build_postings(Path(sys.argv[1]), int(sys.argv[2]))
