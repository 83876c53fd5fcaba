"""The real job ads from ../shared for integration tests (read in place, never copied)."""

from __future__ import annotations

from pathlib import Path

from pipeline.bench.datasets import build_postings as build_any_postings

ADZUNA = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "adzuna_uk_jobs_2499.csv"


def build_postings(database: Path, count: int) -> None:
    """``count`` postings: the real Adzuna ads repeated under new ids, or synthetic ones without them."""
    build_any_postings(database, count, ADZUNA if ADZUNA.is_file() else None)
