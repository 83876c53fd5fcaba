"""The job's source: the table or the single SELECT a job reads its records from, and the check that
it has the id column and every prompt field, with usable ids. Every query over the source takes its
relation from here (:func:`source_relation`)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError, DatabaseError, DatabaseFailure, SourceMissingError
from pipeline.job.commands import Asked
from pipeline.job.spec import JobSpec
from pipeline.source.db import Database, quote, statement_kinds
from pipeline.wording import counted


def source_relation(spec: JobSpec) -> str:
    """The source as something a FROM clause accepts."""
    if spec.source.query is not None:
        return f"({single_select(spec)})"
    assert spec.source.table is not None
    return quote(spec.source.table)


def single_select(spec: JobSpec) -> str:
    """``source.query`` as one SELECT: a query that closes the parenthesis it is put in cannot run
    a second statement (``SELECT 1) ; DROP TABLE results; SELECT (1``). A trailing ``;`` is dropped."""
    assert spec.source.query is not None
    query = spec.source.query.strip().rstrip(";").rstrip()
    where = f"{spec.source_file}: key source.query"
    try:
        kinds = statement_kinds(query)
    except DatabaseError as error:
        raise ConfigError(f"{where} fails: {error.reason}") from error
    if kinds != ["SELECT"]:
        raise ConfigError(f"{where} must be one SELECT statement, not: {', '.join(kinds) or 'nothing'}")
    return query


def count_records(connection: Database, spec: JobSpec) -> int:
    """How many records the source holds (0: an empty table, e.g. a header-only file loaded). Blocking."""
    return connection.scalar(f"SELECT count(*) FROM {source_relation(spec)}")


@dataclass(frozen=True, slots=True)
class SourceShape:
    id_type: str
    columns: tuple[str, ...]


def describe_source(connection: Database, spec: JobSpec) -> SourceShape:
    """Check the source has the id column and every prompt field, with usable ids. Blocking."""
    types = source_columns(connection, spec)
    where = f"{spec.source_file}: source in {spec.database}"
    check_ids(connection, source_relation(spec), spec.source.id_column, where)
    return SourceShape(id_type=types[spec.source.id_column.lower()], columns=tuple(types))


def source_columns(connection: Database, spec: JobSpec) -> dict[str, str]:
    """The source's columns (lower-cased name to type), checked to hold the id column and every prompt
    field; reads no rows. A :class:`ConfigError` names the table or key at fault. Blocking."""
    where = f"{spec.source_file}: source in {spec.database}"
    try:
        described = connection.rows(f"DESCRIBE SELECT * FROM {source_relation(spec)}")
    except DatabaseError as error:
        if error.kind is DatabaseFailure.OUT_OF_MEMORY:
            raise  # not the query's fault: the caller names duckdb_memory_limit
        if error.kind is DatabaseFailure.MISSING and spec.source.table is not None:
            raise SourceMissingError(f"{where}: {_missing_table(spec)}") from error
        failure = SourceMissingError if error.kind is DatabaseFailure.MISSING else ConfigError
        raise failure(f"{where}: key source.query fails: {error.reason}") from error
    types = {str(row[0]).lower(): str(row[1]) for row in described}
    missing = [name for name in (spec.source.id_column, *spec.source.fields) if name.lower() not in types]
    if missing:
        raise ConfigError(
            f"{where}: the source has no column {missing} (keys source.id_column / source.fields); "
            f"it has {sorted(types)}"
        )
    return types


def _missing_table(spec: JobSpec) -> str:
    asked = Asked.of(spec)
    load = f"load records with `{asked.command('load')}`"
    if spec.source.seed_file is not None:  # a run loads it, but a reader (status) does not
        load += f" (`{asked.command('run')}` loads key source.seed_file, {spec.source.seed_file})"
    return f"table '{spec.source.table}' does not exist (key source.table); {load}"


def check_ids(connection: Database, relation: str, id_column: str, where: str) -> None:
    """Every row of ``relation`` (the source, or a file being loaded) has an id, and no id is there
    twice: a :class:`ConfigError` at ``where`` with a few of the ids otherwise. Blocking."""
    column = quote(id_column)
    nulls = connection.scalar(f"SELECT count(*) FROM {relation} WHERE {column} IS NULL")
    if nulls:
        have = "has" if nulls == 1 else "have"
        raise ConfigError(f"{where}: {counted(nulls, 'record')} {have} a NULL id in column {id_column}")
    duplicates = connection.rows(f"SELECT {column} FROM {relation} GROUP BY ALL HAVING count(*) > 1 LIMIT 5")
    if duplicates:
        shown = ", ".join(repr(duplicate[0]) for duplicate in duplicates)
        raise ConfigError(f"{where}: ids are not unique in column {id_column} (e.g. {shown})")
