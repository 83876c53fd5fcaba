"""Job files and DuckDB sources in a temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import yaml

from pipeline.job.spec import JobSpec, load_job


def job_dict(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "test",
        "database": "test.duckdb",
        "source": {"table": "postings", "id_column": "id", "fields": ["title", "description"]},
        "prompt": {"system": "Extract the posting.", "user": "Title: {title}\n\n{description}"},
        "schema": "tests.support.schemas:Item",
        "model": "test-model",
        "endpoint": {"base_url": "http://testserver/v1"},
        "concurrency": 8,
        "request_timeout_s": 30,
        "max_tokens": 256,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def write_job(folder: Path, **overrides: Any) -> Path:
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(**overrides)))
    return path


def make_source(database: Path, count: int, *, table: str = "postings", start: int = 0) -> None:
    with duckdb.connect(str(database)) as connection:
        connection.execute(
            f"CREATE OR REPLACE TABLE {table} AS SELECT i AS id, 'Title ' || i AS title, "
            f"'Description of posting ' || i AS description FROM range({start}, {start + count}) t(i)"
        )


def make_job(folder: Path, records: int = 10, **overrides: Any) -> JobSpec:
    path = write_job(folder, **overrides)
    spec = load_job(path)
    if records:
        make_source(spec.database, records)
    return spec


def table_rows(database: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


def linkedin_job(database: Path) -> dict[str, Any]:
    """jobs/linkedin.yaml as a mapping, its relative paths made absolute, on ``database``: to be
    changed and written elsewhere."""
    repo = Path(__file__).resolve().parents[2]
    spec: dict[str, Any] = yaml.safe_load((repo / "jobs" / "linkedin.yaml").read_text())
    spec["database"] = str(database)
    spec["source"]["seed_file"] = str(repo / "data" / "sample_postings.jsonl")
    spec["prompt"]["examples_file"] = str(repo / "jobs" / "examples" / "linkedin.jsonl")
    return spec
