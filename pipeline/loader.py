"""``pipeline load``: a CSV, JSONL or Parquet file into the job's DuckDB source table.

Loading is idempotent: records whose id is already in the table are skipped, so the same file (or a
bigger export of it) can be loaded again. The whole load is one transaction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline.errors import ConfigError
from pipeline.job import JobSpec
from pipeline.source import quote

_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # as the job spec's table names

_READERS = {
    ".csv": "read_csv({path}, header = true)",
    ".tsv": "read_csv({path}, header = true, delim = '\t')",
    ".jsonl": "read_json({path}, format = 'newline_delimited')",
    ".ndjson": "read_json({path}, format = 'newline_delimited')",
    ".json": "read_json({path})",
    ".parquet": "read_parquet({path})",
}


@dataclass(frozen=True, slots=True)
class LoadReport:
    file: Path
    table: str
    rows_in_file: int
    inserted: int

    @property
    def skipped(self) -> int:
        return self.rows_in_file - self.inserted


def _reader_sql(path: Path, file_format: str | None) -> str:
    suffix = f".{file_format.lower().lstrip('.')}" if file_format else path.suffix.lower()
    if path.name.endswith(".gz") and not file_format:
        suffix = Path(path.stem).suffix.lower()
    template = _READERS.get(suffix)
    if template is None:
        raise ConfigError(f"{path}: unknown file type '{suffix}'; use one of {sorted(_READERS)} or --format")
    return template.format(path="'" + str(path).replace("'", "''") + "'")


def _one_line(exc: BaseException, limit: int = 400) -> str:
    """DuckDB's reason in one line: without its sniffer settings, suggestions, echoed query or the
    "Original Line" (record text, and often not even the line at fault)."""
    text = re.split(r"\n\s*\n|\nLINE \d+:|\nPossible [Ss]olution", str(exc), maxsplit=1)[0]
    kept = [line for line in text.splitlines() if not line.startswith("Original Line:")]
    reason = " ".join(" ".join(kept).split())
    if re.search(r"utf-?8|unicode", reason, re.IGNORECASE):
        reason += "; the file must be UTF-8 (convert it, e.g. iconv -f latin1 -t utf-8)"
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def load_file(
    connection: duckdb.DuckDBPyConnection,
    spec: JobSpec,
    path: Path,
    *,
    table: str | None = None,
    rename: Mapping[str, str] | None = None,
    replace: bool = False,
    file_format: str | None = None,
) -> LoadReport:
    """Load ``path`` into ``table`` (default: the job's source table). Blocking; call from a thread."""
    target = table or spec.source.table
    if target is None:
        raise ConfigError(
            f"{spec.source_file}: the job reads a query (source.query); say which table with --table"
        )
    if not _SQL_NAME.fullmatch(target):
        raise ConfigError(f"--table {target!r}: must be a plain SQL name (letters, digits and _)")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    renames = ", ".join(f"{quote(old)} AS {quote(new)}" for old, new in (rename or {}).items())
    incoming = f"SELECT *{f' RENAME ({renames})' if renames else ''} FROM {_reader_sql(path, file_format)}"
    try:
        columns = [str(row[0]) for row in connection.execute(f"DESCRIBE {incoming}").fetchall()]
    except duckdb.Error as exc:
        raise ConfigError(f"{path}: cannot read ({_one_line(exc)})") from exc
    _check_columns(path, spec, columns)
    connection.begin()
    try:
        connection.execute(f"CREATE OR REPLACE TEMP TABLE pipeline_incoming AS {incoming}")
        _check_ids(connection, path, spec.source.id_column)
        report = _insert(connection, path, target, spec.source.id_column, replace)
        connection.execute("DROP TABLE pipeline_incoming")
        connection.commit()
    except duckdb.Error as exc:
        connection.rollback()
        raise ConfigError(f"{path}: cannot load into table '{target}' ({_one_line(exc)})") from exc
    except BaseException:
        connection.rollback()
        raise
    return report


def _check_columns(path: Path, spec: JobSpec, columns: list[str]) -> None:
    present = {name.lower() for name in columns}
    missing = [name for name in (spec.source.id_column, *spec.source.fields) if name.lower() not in present]
    if missing:
        raise ConfigError(
            f"{path}: no column {missing} (needed by the job's source.id_column / source.fields); "
            f"the file has {columns}; map one with --rename FILE_COLUMN=NAME"
        )


def _check_ids(connection: duckdb.DuckDBPyConnection, path: Path, id_column: str) -> None:
    column = quote(id_column)
    nulls = connection.execute(f"SELECT count(*) FROM pipeline_incoming WHERE {column} IS NULL").fetchone()
    if nulls and nulls[0]:
        raise ConfigError(f"{path}: {nulls[0]} rows have no value in the id column '{id_column}'")
    duplicates = connection.execute(
        f"SELECT {column} FROM pipeline_incoming GROUP BY ALL HAVING count(*) > 1 LIMIT 5"
    ).fetchall()
    if duplicates:
        shown = ", ".join(repr(row[0]) for row in duplicates)
        raise ConfigError(f"{path}: id column '{id_column}' has duplicate values (e.g. {shown})")


def _insert(
    connection: duckdb.DuckDBPyConnection, path: Path, table: str, id_column: str, replace: bool
) -> LoadReport:
    row = connection.execute("SELECT count(*) FROM pipeline_incoming").fetchone()
    rows_in_file = int(row[0]) if row else 0
    exists = connection.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE lower(table_name) = lower(?) AND NOT temporary", [table]
    ).fetchone()
    if replace or not (exists and exists[0]):
        connection.execute(f"CREATE OR REPLACE TABLE {quote(table)} AS SELECT * FROM pipeline_incoming")
        return LoadReport(path, table, rows_in_file, rows_in_file)
    target_columns = {str(r[0]).lower() for r in connection.execute(f"DESCRIBE {quote(table)}").fetchall()}
    shared = [
        quote(str(r[0]))
        for r in connection.execute("DESCRIBE pipeline_incoming").fetchall()
        if str(r[0]).lower() in target_columns
    ]
    column_list = ", ".join(shared)
    column = quote(id_column)
    inserted = connection.execute(
        f"INSERT INTO {quote(table)} ({column_list}) SELECT {column_list} FROM pipeline_incoming i "
        f"WHERE NOT EXISTS (SELECT 1 FROM {quote(table)} t WHERE t.{column} = i.{column})"
    ).fetchone()
    return LoadReport(path, table, rows_in_file, int(inserted[0]) if inserted else 0)
