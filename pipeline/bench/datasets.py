"""Large sources for sweeps, scale runs and tests: job ads repeated under new ids up to any count.

    python -m pipeline.bench.datasets DATABASE COUNT [--ads ADS.csv]

With ``--ads`` (a CSV with ``Title`` and ``FullDescription`` columns, as the Adzuna UK jobs set), the
real ads are repeated under new ids; without it, synthetic postings of a fixed size. Either way the
table is ``postings (id, title, description)``, replaced if it exists.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.source.db import open_database


def build_postings(database: Path, count: int, ads: Path | None = None) -> None:
    """``count`` postings in ``database``: the ads of ``ads`` repeated under new ids, or synthetic ones."""
    connection = open_database(database)
    try:
        if ads is not None:
            connection.execute(
                "CREATE OR REPLACE TABLE postings AS WITH ads AS ("
                "SELECT row_number() OVER () - 1 AS n, Title AS title, FullDescription AS description "
                "FROM read_csv($ads, header = true)) "
                "SELECT i AS id, title, description FROM range($count) t(i) "
                "JOIN ads ON ads.n = i % (SELECT count(*) FROM ads)",
                {"ads": str(ads), "count": count},
            )
        else:
            connection.execute(
                "CREATE OR REPLACE TABLE postings AS SELECT i AS id, 'Engineer ' || i AS title, "
                "repeat('We need SQL and Python. ', 60) AS description FROM range($count) t(i)",
                {"count": count},
            )
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.datasets", description=__doc__)
    parser.add_argument("database", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("--ads", type=Path, default=None, help="CSV of ads with Title and FullDescription")
    args = parser.parse_args(argv)
    build_postings(args.database, args.count, args.ads)


if __name__ == "__main__":
    main()
