"""The progress snapshot: a JSON file beside the database that a run replaces every few seconds, so
``pipeline status`` can report on a run that holds the database lock (DuckDB lets no other process
open it meanwhile)."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path

import orjson


def snapshot_path(database: Path) -> Path:
    return database.with_name(database.name + ".progress.json")


def write_snapshot(database: Path, run_id: int, numbers: Mapping[str, object], status: str) -> None:
    """Atomically replace the snapshot file (write a temporary file, then rename)."""
    path = snapshot_path(database)
    as_of = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")  # a reader says how old it is
    body = {"run_id": run_id, "status": status, "pid": os.getpid(), "as_of": as_of, **numbers}
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
    temporary.replace(path)


def read_snapshot(database: Path) -> dict[str, object] | None:
    try:
        value = orjson.loads(snapshot_path(database).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None
