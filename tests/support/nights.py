"""A user's project for property tests: a folder with a job, its schema modules, its records' files and
one database, driven through the ``pipeline`` command in this process, and read back independently of
the code under test (:func:`record_states`, straight from the tables).
"""

from __future__ import annotations

import importlib
import re
import shlex
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

import pipeline.cli as cli
from pipeline.job.commands import program
from tests.support.drawn_jobs import DrawnSchema, Row, write_rows, write_schema
from tests.support.processes import pipeline_command, subprocess_env

#: Retries that cost no real time: a property test runs hundreds of nights.
QUICK_RETRY = {"backoff_initial_s": 0.001, "backoff_max_s": 0.005}
SYSTEM = "Extract what the record says. Use only its text."


@dataclass(frozen=True, slots=True)
class Said:
    """What one command did: its words, its exit code and what it wrote to each stream."""

    args: tuple[str, ...]
    code: int
    out: str
    err: str

    @property
    def returncode(self) -> int:
        return self.code

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err

    @property
    def error_lines(self) -> list[str]:
        """Its stderr lines that are not log lines (JSON)."""
        return [line for line in self.err.splitlines() if line.strip() and not line.startswith("{")]

    def __str__(self) -> str:
        return f"pipeline {shlex.join(self.args)} -> exit {self.code}\n{self.out[-1500:]}\n{self.err[-1500:]}"


def killed_midway(args: tuple[str, ...], when: Callable[[], bool], signum: signal.Signals) -> Said:
    """``pipeline ARGS`` as its own process, sent ``signum`` once ``when()`` holds (or it ended first),
    as cron's timeout or a crash ends a night; what it said, once it has ended."""
    process = subprocess.Popen(
        pipeline_command(*args),
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and not when() and time.monotonic() < deadline:
            time.sleep(0.005)
        if process.poll() is None:
            process.send_signal(signum)
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return Said(args, process.returncode, out, err)


def pipeline(*args: str) -> Said:
    """``pipeline ARGS`` in this process. An exception that escaped the command fails the test with it:
    a user would have seen a traceback."""
    result = CliRunner().invoke(cli.app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"pipeline {shlex.join(args)} raised") from result.exception
    return Said(tuple(args), result.exit_code, result.stdout, result.stderr)


_PROGRAM = re.escape(shlex.join(program()))
_PRINTED = re.compile(rf"{_PROGRAM} [^`\n]*")


def printed_commands(text: str) -> list[tuple[str, ...]]:
    """The ``pipeline`` commands ``text`` prints for the user to paste, each as its words after the
    program."""
    found = []
    for match in _PRINTED.finditer(text):
        words = shlex.split(match.group(0).rstrip(" .;,)"))
        found.append(tuple(words[len(program()) :]))
    return found


@dataclass
class Project:
    """``root/jobs/job.yaml`` and ``root/data/nights.duckdb``; the schema modules in ``root``."""

    root: Path
    urls: list[str]
    schema: DrawnSchema
    concurrency: int = 8
    system: str = SYSTEM
    max_tokens: int = 512
    settings: dict[str, Any] = field(default_factory=dict)
    _files: int = 0

    def __post_init__(self) -> None:
        for folder in ("jobs", "data"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.schema_path = write_schema(self.root, self.schema)
        self.write()

    @property
    def job(self) -> Path:
        return self.root / "jobs" / "job.yaml"

    @property
    def database(self) -> Path:
        return self.root / "data" / "nights.duckdb"

    def write(self) -> None:
        job: dict[str, Any] = {
            "name": "nights",
            "database": "../data/nights.duckdb",
            "source": {"table": "records", "fields": ["title", "body"]},
            "prompt": {"system": self.system, "user": "Title: {title}\n\n{body}"},
            "schema": self.schema_path,
            "model": "sim-model",
            "concurrency": self.concurrency,
            "request_timeout_s": 30,
            "max_tokens": self.max_tokens,
            "retry": QUICK_RETRY,
            "operations": {"preflight_timeout_s": 5, "server_down_abort_s": 2, "shutdown_grace_s": 30},
            "variants": {"short": {"max_tokens": self.max_tokens // 2}},
            **self.settings,
        }
        if len(self.urls) == 1:
            job["endpoint"] = {"base_url": self.urls[0]}
        else:
            job["endpoints"] = [{"base_url": url} for url in self.urls]
        self.job.write_text(yaml.safe_dump(job, allow_unicode=True))

    def schema_class(self) -> type[BaseModel]:
        module, _, name = self.schema_path.partition(":")
        found: type[BaseModel] = getattr(importlib.import_module(module), name)
        return found

    def edit_schema(self, schema: DrawnSchema) -> None:
        self.schema = schema
        self.schema_path = write_schema(self.root, schema)
        self.write()

    def rows_file(self, rows: list[Row], file_format: str) -> Path:
        self._files += 1
        return write_rows(self.root / "data" / f"load-{self._files}.{file_format}", rows)


@dataclass(frozen=True, slots=True)
class RecordState:
    """What the tables hold for one source record: its result's run, its failure's class and run."""

    result_run: int | None
    failure: tuple[str, int] | None

    @property
    def name(self) -> str:
        if self.result_run is not None:
            return "done"
        return f"failed:{self.failure[0]}" if self.failure else "none"


def _tables(database: Path) -> set[str]:
    if not database.exists():
        return set()
    with duckdb.connect(str(database), read_only=True) as connection:
        return {name for (name,) in connection.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def _rows(database: Path, sql: str, *, needs: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """``sql``'s rows; none while a table it needs is not there yet (before the first load or run)."""
    if not set(needs) <= _tables(database):
        return []
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


def record_states(database: Path) -> dict[int, RecordState]:
    """Every source record's state, straight from the tables (not through the code under test)."""
    made = {"results", "failures"} <= _tables(database)
    joins = (
        "LEFT JOIN results r ON r.record_id = s.id AND r.variant = 'main' "
        "LEFT JOIN failures f ON f.record_id = s.id AND f.variant = 'main'"
    )
    columns = "r.run_id, f.failure_class, f.run_id" if made else "NULL, NULL, NULL"
    rows = _rows(
        database, f"SELECT s.id, {columns} FROM records s {joins if made else ''}", needs=("records",)
    )
    states: dict[int, RecordState] = {}
    for record_id, result_run, failure_class, failure_run in rows:
        assert record_id not in states, f"record {record_id} has two results or two failures"
        failure = (failure_class, failure_run) if failure_class is not None else None
        states[record_id] = RecordState(result_run, failure)
    return states


def made_results(database: Path) -> set[tuple[int, int]]:
    """(record, run) of every result ever made: the current ones and those superseded since."""
    return {
        (record_id, run_id)
        for record_id, run_id in _rows(
            database,
            "SELECT record_id, run_id FROM results WHERE variant = 'main' "
            "UNION ALL SELECT record_id, run_id FROM results_history WHERE variant = 'main'",
            needs=("results", "results_history"),
        )
    }


def duplicates(database: Path) -> list[tuple[Any, ...]]:
    """(table, record, count) of any record held twice by the results or the failures."""
    return _rows(
        database,
        "SELECT 'results', record_id, count(*) FROM results WHERE variant = 'main' GROUP BY ALL "
        "HAVING count(*) > 1 UNION ALL SELECT 'failures', record_id, count(*) FROM failures "
        "WHERE variant = 'main' GROUP BY ALL HAVING count(*) > 1",
        needs=("results", "failures"),
    )


def last_run(database: Path) -> dict[str, Any] | None:
    rows = _rows(database, "SELECT to_json(runs) FROM runs ORDER BY run_id DESC LIMIT 1", needs=("runs",))
    return orjson.loads(rows[0][0]) if rows else None


def run_rows(database: Path) -> list[dict[str, Any]]:
    rows = _rows(database, "SELECT to_json(runs) FROM runs ORDER BY run_id", needs=("runs",))
    return [orjson.loads(row[0]) for row in rows]


def parquet_types(path: Path) -> dict[str, str]:
    with duckdb.connect() as connection:
        described = connection.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
    return {name: str(sql_type) for name, sql_type, *_ in described}


def counts(states: dict[int, RecordState]) -> Counter[str]:
    return Counter(state.name for state in states.values())
