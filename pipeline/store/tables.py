"""The job's output tables: their columns, creating them, and bringing an older database up to date.

* ``results``: one current result per (variant, record). Besides the answer, each row carries the
  version key it was made with (:mod:`pipeline.source.versions`), the last attempt's tokens and latency, and
  the totals over all its attempts.
* ``results_history``: every result a redo replaced, with when and by which run; moved there in the
  same transaction as the new result, so nothing extracted is ever lost.
* ``failures``: one row per (variant, record) that has no result from its last try, with the tokens
  that try spent and the version it was made under.
* ``results_chunks``: the answer of each chunk of a long record (``chunking:``), one row per (variant,
  record, pass, chunk), kept as each chunk finishes: a run stopped mid-document redoes only the chunks
  not kept, and the chunk answers behind every merged result stay there to look at.
* ``judgments`` (:mod:`pipeline.store.judgments`): what people and models said of extracted values,
  one row per judgment, tied to the result it judged.
* ``runs``: one row per run, with its numbers (:class:`~pipeline.store.numbers.RunNumbers`: totals
  over every attempt, records done and failed, its time), the profile of what it produced and a small
  time series of how it went.

A database written by an earlier version opens without a manual step: tables keyed by record alone
are rebuilt with the variant in their key (rows become variant ``main``), and missing columns are
added. Old results have no version key, so they count as stale with cause ``unknown``.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from pipeline.job.spec import JobSpec
from pipeline.source.db import UTC_NOW, Database, quote
from pipeline.source.versions import VERSION_COLUMNS
from pipeline.store.judgments import JUDGMENT_COLUMNS, judgments_table
from pipeline.store.numbers import RUN_NUMBER_COLUMNS

log = structlog.get_logger("pipeline.store.tables")

HISTORY_SUFFIX = "_history"
CHUNKS_SUFFIX = "_chunks"

# (name, type) after the key columns (variant, record_id); created_at comes last with its default.
_RESULT_COLUMNS = [
    ("run_id", "INTEGER"),
    ("extracted", "JSON"),
    ("attempts", "INTEGER"),
    ("prompt_tokens", "INTEGER"),  # the last attempt's
    ("completion_tokens", "INTEGER"),
    ("reasoning_tokens", "INTEGER"),
    ("latency_s", "DOUBLE"),
    ("finish_reason", "VARCHAR"),
    ("max_tokens", "INTEGER"),
    ("total_prompt_tokens", "INTEGER"),  # over every attempt, re-asks and retries included
    ("total_completion_tokens", "INTEGER"),
    ("total_reasoning_tokens", "INTEGER"),
    ("total_latency_s", "DOUBLE"),
    ("grounding", "JSON"),
    *VERSION_COLUMNS,
    ("chunks", "JSON"),  # merged from a long record's chunks: which, and what each pass added
    # The answer came in the reply's reasoning field, content null (vLLM issue 23694), and was taken.
    ("answer_from_reasoning", "BOOLEAN"),
]
# The record's own columns: a chunk's answer has neither.
_RECORD_ONLY = ("chunks", "answer_from_reasoning")
# A chunk's answer: where it is in the record's field, and the columns of a result, less `chunks`.
_CHUNK_KEY = [("pass", "INTEGER NOT NULL"), ("chunk", "INTEGER NOT NULL")]
_CHUNK_COLUMNS = [
    *_CHUNK_KEY,
    ("chunk_count", "INTEGER"),
    ("chunk_start", "INTEGER"),  # the chunk is field[chunk_start:chunk_end]
    ("chunk_end", "INTEGER"),
    *(column for column in _RESULT_COLUMNS if column[0] not in _RECORD_ONLY),
]
_FAILURE_COLUMNS = [
    ("run_id", "INTEGER"),
    ("failure_class", "VARCHAR"),
    ("message", "VARCHAR"),
    ("attempts", "INTEGER"),
    ("last_raw_output", "VARCHAR"),
    ("last_max_tokens", "INTEGER"),
    ("prompt_tokens", "INTEGER"),  # over every attempt of the try that failed
    ("completion_tokens", "INTEGER"),
    ("reasoning_tokens", "INTEGER"),
    ("latency_s", "DOUBLE"),
    *VERSION_COLUMNS,
    # A too_long record's fit, for a later run to judge it unsent: the server's count of its prompt,
    # and the tokens its answer was cut off at with all the room the context left.
    ("counted_prompt_tokens", "INTEGER"),
    ("answer_cut_at", "INTEGER"),
]
_RUN_COLUMNS = [
    ("run_id", "INTEGER PRIMARY KEY"),
    ("job_name", "VARCHAR"),
    ("variant", "VARCHAR DEFAULT 'main'"),
    ("job_hash", "VARCHAR"),
    ("model", "VARCHAR"),
    ("base_url", "VARCHAR"),
    ("concurrency", "INTEGER"),
    ("started_at", "TIMESTAMP"),
    ("updated_at", "TIMESTAMP"),
    ("ended_at", "TIMESTAMP"),
    ("status", "VARCHAR"),
    *RUN_NUMBER_COLUMNS,  # the run's counts, one column per field of RunNumbers (store/numbers.py)
    ("message", "VARCHAR"),
    ("knees", "JSON"),  # {"base_url model": level}: where `concurrency: auto` found each server's knee
    ("profile", "JSON"),  # what the run produced, field by field (store/run_profiles.py): drift's input
    ("series", "JSON"),  # the run over time: records/min, in flight, each endpoint's limit (run/series.py)
    ("options", "JSON"),  # the command-line options that changed the job (--model, --prompt-file...)
]
_HISTORY_EXTRA = [("superseded_at", "TIMESTAMP"), ("superseded_by_run", "INTEGER")]

KEY_COLUMNS = ["variant", "record_id"]
RESULT_COLUMNS = [*KEY_COLUMNS, *(name for name, _ in _RESULT_COLUMNS)]
FAILURE_COLUMNS = [*KEY_COLUMNS, *(name for name, _ in _FAILURE_COLUMNS)]
CHUNK_COLUMNS = [*KEY_COLUMNS, *(name for name, _ in _CHUNK_COLUMNS)]


def history_table(spec: JobSpec) -> str:
    return spec.output.results_table + HISTORY_SUFFIX


def chunks_table(spec: JobSpec) -> str:
    return spec.output.results_table + CHUNKS_SUFFIX


@dataclass(frozen=True, slots=True)
class _Table:
    name: str
    columns: list[tuple[str, str]]
    per_record: bool = True  # starts with (variant, record_id)
    primary_key: bool = True  # (variant, record_id, *key_extra) is its key
    key_extra: tuple[str, ...] = ()

    def ddl(self, id_type: str, name: str | None = None) -> str:
        body = ", ".join(f"{quote(column)} {kind}" for column, kind in self.columns)
        if not self.per_record:
            return f"CREATE TABLE IF NOT EXISTS {quote(name or self.name)} ({body})"
        key_columns = ", ".join(["variant", "record_id", *(quote(column) for column in self.key_extra)])
        key = f", PRIMARY KEY ({key_columns})" if self.primary_key else ""
        return (
            f"CREATE TABLE IF NOT EXISTS {quote(name or self.name)} ("
            f"variant VARCHAR NOT NULL DEFAULT 'main', record_id {id_type} NOT NULL, {body}, "
            f"created_at TIMESTAMP DEFAULT ({UTC_NOW}){key})"
        )


def _tables(spec: JobSpec) -> list[_Table]:
    out = spec.output
    return [
        _Table(out.runs_table, _RUN_COLUMNS, per_record=False),
        _Table(out.results_table, _RESULT_COLUMNS),
        _Table(history_table(spec), [*_RESULT_COLUMNS, *_HISTORY_EXTRA], primary_key=False),
        _Table(out.failures_table, _FAILURE_COLUMNS),
        _Table(chunks_table(spec), _CHUNK_COLUMNS, key_extra=tuple(name for name, _ in _CHUNK_KEY)),
        _Table(judgments_table(spec), JUDGMENT_COLUMNS, primary_key=False),
    ]


def output_table_names(spec: JobSpec) -> list[str]:
    """The job's output tables: runs, results, their history, failures, the chunks of long records, the
    judgments of values."""
    return [table.name for table in _tables(spec)]


def create_output_tables(connection: Database, spec: JobSpec, id_type: str) -> None:
    """Create the job's output tables if missing, or bring older ones up to date, in one transaction.

    The record id keeps the source id's type (an existing table keeps its own)."""
    existing = connection.table_names()
    with connection.transaction():
        for table in _tables(spec):
            if table.name.lower() not in existing:
                connection.execute(table.ddl(id_type))
            else:
                _upgrade(connection, table)


def needs_upgrade(connection: Database, spec: JobSpec) -> bool:
    """Whether some output tables exist but not all, or one lacks a column of this version."""
    existing = connection.table_names()
    present = [table.name.lower() in existing for table in _tables(spec)]
    if any(present) and not all(present):
        return True
    for table in _tables(spec):
        if table.name.lower() in existing:
            columns = set(connection.column_names(table.name))
            wanted = {name for name, _ in table.columns} | ({"variant"} if table.per_record else set())
            if wanted - columns:
                return True
    return False


def _upgrade(connection: Database, table: _Table) -> None:
    columns = connection.column_names(table.name)
    if table.per_record and "variant" not in columns:
        _rebuild_with_variant(connection, table, columns)
        return
    for name, kind in table.columns:
        if name not in columns:
            kind = kind.removesuffix(" PRIMARY KEY")
            connection.execute(f"ALTER TABLE {quote(table.name)} ADD COLUMN {quote(name)} {kind}")


def _rebuild_with_variant(connection: Database, table: _Table, old_columns: list[str]) -> None:
    """A table keyed by record alone (before variants): copy it into the new layout as variant main."""
    row = connection.row(
        "SELECT data_type FROM duckdb_columns() "
        "WHERE lower(table_name) = lower(?) AND column_name = 'record_id'",
        [table.name],
    )
    upgrading = f"{table.name}__upgrading"
    connection.execute(table.ddl(str(row[0]) if row else "VARCHAR", upgrading))
    shared = ", ".join(name for name in connection.column_names(upgrading) if name in old_columns)
    connection.execute(
        f"INSERT INTO {quote(upgrading)} (variant, {shared}) SELECT 'main', {shared} FROM {quote(table.name)}"
    )
    connection.execute(f"DROP TABLE {quote(table.name)}")
    connection.execute(f"ALTER TABLE {quote(upgrading)} RENAME TO {quote(table.name)}")
    log.warning("upgraded an output table to this version's layout", table=table.name)
