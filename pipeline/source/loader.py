"""``pipeline load``: a CSV, JSONL or Parquet file into the job's DuckDB source table.

Loading is incremental and idempotent: ids new to the table are inserted, rows whose values changed
are updated, identical rows are left alone, so the next night's export loads on top of the last one
(and a changed posting's extraction becomes stale, see :mod:`pipeline.source.versions`). ``replace`` makes the
table equal to the file; ids it drops keep their results, which ``status`` counts as orphaned. The
whole load is one transaction: a failed load changes nothing. It says which of the file's records have
nothing to extract from (:mod:`pipeline.source.blank`): a run will not send them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import ConfigError, DatabaseError
from pipeline.job.spec import JobSpec
from pipeline.source.blank import BlankRecords, blank_records
from pipeline.source.db import Database, quote
from pipeline.source.relation import check_ids

_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # as the job spec's table names
# A column type as DESCRIBE names it (BIGINT, VARCHAR, DECIMAL(18,3)): safe to put into SQL text.
_PLAIN_TYPE = re.compile(r"[A-Z][A-Z0-9_ ]*(\(\d+(,\s*\d+)?\))?")

_READERS = {
    ".csv": "read_csv({path}, header = true{csv_options})",
    ".tsv": "read_csv({path}, header = true, delim = '\t'{csv_options})",
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
    updated: int = 0
    removed: int = 0  # with replace: ids that were in the table and are not in the file
    # The file's records whose prompt fields (those the job's template reads) are all empty.
    blank: BlankRecords = field(default_factory=lambda: BlankRecords(()))

    @property
    def unchanged(self) -> int:
        return self.rows_in_file - self.inserted - self.updated

    @property
    def skipped(self) -> int:
        """Rows of the file that did not add a new id."""
        return self.rows_in_file - self.inserted


def _reader_sql(path: Path, file_format: str | None, text_column: str | None = None) -> str:
    """The table function reading ``path``; a CSV's ``text_column`` is read as text, as it is written
    (a guessed number would turn the id 007 into 7)."""
    suffix = f".{file_format.lower().lstrip('.')}" if file_format else path.suffix.lower()
    if path.name.endswith(".gz") and not file_format:
        suffix = Path(path.stem).suffix.lower()
    template = _READERS.get(suffix)
    if template is None:
        raise ConfigError(f"{path}: unknown file type '{suffix}'; use one of {sorted(_READERS)} or --format")
    options = f", types = {{{_literal(text_column)}: 'VARCHAR'}}" if text_column else ""
    return template.format(path=_literal(str(path)), csv_options=options)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _incoming_sql(
    path: Path, file_format: str | None, rename: Mapping[str, str], text_id: tuple[str, str] | None = None
) -> str:
    """The file's rows as a SELECT, columns renamed; with ``text_id`` (the renamed id column and the
    type the file gives it), that column as text."""
    renames = ", ".join(f"{quote(old)} AS {quote(new)}" for old, new in rename.items())
    id_column = text_id[0] if text_id else ""
    in_file = next((old for old, new in rename.items() if new.lower() == id_column.lower()), id_column)
    reader = _reader_sql(path, file_format, in_file or None)
    select = f"SELECT *{f' RENAME ({renames})' if renames else ''} FROM {reader}"
    if text_id is None:
        return select
    # A JSON value's text is its ->> '$' (a cast would keep the quotes of "abc").
    name, file_type = quote(id_column), text_id[1]
    text = f"{name} ->> '$'" if file_type == "JSON" else f"CAST({name} AS VARCHAR)"
    return f"SELECT * REPLACE ({text} AS {name}) FROM ({select})"


def _is_empty(path: Path) -> bool:
    """Nothing but whitespace (DuckDB reads such a CSV as one column named column0)."""
    with path.open("rb") as file:
        return not file.read(4096).strip() and not file.read(1)


def load_file(
    connection: Database,
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
    if _is_empty(path):
        raise ConfigError(f"{path}: empty file (nothing to load)")
    incoming, id_type = _incoming(connection, spec, path, target, rename or {}, file_format)
    try:
        with connection.transaction():
            report = _load(connection, path, incoming, target, spec.source.id_column, replace, id_type)
            blank = blank_records(
                connection, "pipeline_incoming", spec.source.id_column, spec.content_fields()
            )
            connection.execute("DROP TABLE pipeline_incoming")
            return dataclasses.replace(report, blank=blank)
    except DatabaseError as error:
        raise ConfigError(f"{path}: cannot load into table '{target}' ({error.reason})") from error


def _incoming(
    connection: Database,
    spec: JobSpec,
    path: Path,
    table: str,
    rename: Mapping[str, str],
    file_format: str | None,
) -> tuple[str, str | None]:
    """The SELECT reading the file, checked to have the job's columns, and the type its ids take:
    an existing table's (the file's are read as text, then as those), else None (the file's own)."""
    incoming, id_column = _incoming_sql(path, file_format, rename), spec.source.id_column
    try:
        in_file = connection.rows(f"DESCRIBE {_incoming_sql(path, file_format, {})}")
        columns = _renamed(path, {str(row[0]): str(row[1]) for row in in_file}, rename)
        _check_columns(path, spec, list(columns))
        id_type = _table_id_type(connection, table, id_column)
    except DatabaseError as error:
        raise ConfigError(f"{path}: cannot read ({error.reason})") from error
    if id_type is None:
        return incoming, None
    file_type = next(kind for name, kind in columns.items() if name.lower() == id_column.lower())
    return _incoming_sql(path, file_format, rename, text_id=(id_column, file_type)), id_type


def _table_id_type(connection: Database, table: str, id_column: str) -> str | None:
    """The type of the id column of ``table`` (None: no such table or column yet, or an exotic type)."""
    if table.lower() not in connection.table_names():
        return None
    types = {str(row[0]).lower(): str(row[1]) for row in connection.rows(f"DESCRIBE {quote(table)}")}
    id_type = types.get(id_column.lower())
    return id_type if id_type is not None and _PLAIN_TYPE.fullmatch(id_type) else None


def _load(
    connection: Database,
    path: Path,
    incoming: str,
    table: str,
    id_column: str,
    replace: bool,
    id_type: str | None,
) -> LoadReport:
    connection.execute(f"CREATE OR REPLACE TEMP TABLE pipeline_incoming AS {incoming}")
    if id_type is not None:
        _read_ids_as(connection, path, table, id_column, id_type)
    check_ids(connection, "pipeline_incoming", id_column, str(path))
    return _insert(connection, path, table, id_column, replace)


def _renamed(path: Path, columns: dict[str, str], rename: Mapping[str, str]) -> dict[str, str]:
    """The file's columns (name: type) as ``rename`` names them. Renaming a column the file does not
    have is refused, naming the rename as it was typed (DuckDB passes over it, and the column it was
    for would then be reported missing instead)."""
    in_file = {name.lower(): name for name in columns}
    for old, new in rename.items():
        if old.lower() not in in_file:
            raise ConfigError(f"--rename {old}={new}: {path} has no column {old!r}; it has {list(columns)}")
    renames = {in_file[old.lower()]: new for old, new in rename.items()}
    return {renames.get(name, name): kind for name, kind in columns.items()}


def _check_columns(path: Path, spec: JobSpec, columns: list[str]) -> None:
    present = {name.lower() for name in columns}
    missing = [name for name in (spec.source.id_column, *spec.source.fields) if name.lower() not in present]
    if missing:
        raise ConfigError(
            f"{path}: no column {missing} (needed by the job's source.id_column / source.fields); "
            f"the file has {columns}; map one with --rename FILE_COLUMN=NAME"
        )


def _read_ids_as(connection: Database, path: Path, table: str, id_column: str, id_type: str) -> None:
    """The file's ids (read as text) as the table's ``id_type``; one line naming some that are not."""
    if id_type == "VARCHAR":
        return
    column = quote(id_column)
    refused = connection.rows(
        f"SELECT {column} FROM pipeline_incoming "
        f"WHERE {column} IS NOT NULL AND TRY_CAST({column} AS {id_type}) IS NULL LIMIT 3"
    )
    if refused:
        shown = ", ".join(repr(row[0]) for row in refused)
        raise ConfigError(
            f"{path}: ids that are not {id_type} (e.g. {shown}) cannot go into table '{table}', whose id "
            f"column '{id_column}' is {id_type}; load them into a new table (--table) or database "
            "(--database)"
        )
    connection.execute(f"ALTER TABLE pipeline_incoming ALTER {column} TYPE {id_type}")


def _insert(connection: Database, path: Path, table: str, id_column: str, replace: bool) -> LoadReport:
    rows_in_file = connection.scalar("SELECT count(*) FROM pipeline_incoming")
    if table.lower() not in connection.table_names():
        connection.execute(f"CREATE TABLE {quote(table)} AS SELECT * FROM pipeline_incoming")
        return LoadReport(path, table, rows_in_file, rows_in_file)
    shared = _shared_columns(connection, table, id_column)
    if replace:
        return _replace(connection, path, table, id_column, shared, rows_in_file)
    column = quote(id_column)
    updated = connection.scalar(
        f"UPDATE {quote(table)} t SET {', '.join(f'{name} = i.{name}' for name in shared)} "
        f"FROM pipeline_incoming i WHERE t.{column} = i.{column} AND ({_differs(shared)})"
        if shared
        else "SELECT 0",
    )
    listed = ", ".join([column, *shared])
    inserted = connection.scalar(
        f"INSERT INTO {quote(table)} ({listed}) SELECT {listed} FROM pipeline_incoming i "
        f"WHERE NOT EXISTS (SELECT 1 FROM {quote(table)} t WHERE t.{column} = i.{column})",
    )
    return LoadReport(path, table, rows_in_file, inserted, updated)


def _replace(
    connection: Database,
    path: Path,
    table: str,
    id_column: str,
    shared: list[str],
    rows_in_file: int,
) -> LoadReport:
    """The table becomes the file (its columns too); the counts compare it with what it was."""
    column, target = quote(id_column), quote(table)
    changed = _differs(shared) if shared else "false"
    counts = connection.row(
        f"SELECT count(*) FILTER (WHERE t.{column} IS NULL), "
        f"count(*) FILTER (WHERE t.{column} IS NOT NULL AND ({changed})), "
        f"(SELECT count(*) FROM {target} WHERE {column} NOT IN (SELECT {column} FROM pipeline_incoming)) "
        f"FROM pipeline_incoming i LEFT JOIN {target} t ON t.{column} = i.{column}"
    )
    inserted, updated, removed = (int(value) for value in counts) if counts else (0, 0, 0)
    connection.execute(f"CREATE OR REPLACE TABLE {target} AS SELECT * FROM pipeline_incoming")
    return LoadReport(path, table, rows_in_file, inserted, updated, removed)


def _shared_columns(connection: Database, table: str, id_column: str) -> list[str]:
    """The file's columns the table has too, quoted, without the id."""
    target = {name.lower() for name in connection.column_names(table)}
    return [
        quote(name)
        for name in connection.column_names("pipeline_incoming")
        if name in target and name != id_column.lower()
    ]


def _differs(columns: list[str]) -> str:
    return " OR ".join(f"t.{name} IS DISTINCT FROM i.{name}" for name in columns)
