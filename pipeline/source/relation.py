"""The job's source: the table or the single SELECT a job reads its records from, and the check that
it has the id column and every prompt field, with usable ids. Every query over the source takes its
relation from here (:func:`source_relation`)."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.source.db import quote


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
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ConfigError(f"{where} fails: {' '.join(str(exc).split())}") from exc
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kinds = ", ".join(statement.type.name for statement in statements) or "nothing"
        raise ConfigError(f"{where} must be one SELECT statement, not: {kinds}")
    return query


@dataclass(frozen=True, slots=True)
class SourceShape:
    id_type: str
    columns: tuple[str, ...]


def describe_source(connection: duckdb.DuckDBPyConnection, spec: JobSpec) -> SourceShape:
    """Check the source has the id column and every prompt field, with usable ids. Blocking."""
    where = f"{spec.source_file}: source in {spec.database}"
    try:
        described = connection.execute(f"DESCRIBE SELECT * FROM {source_relation(spec)}").fetchall()
    except duckdb.CatalogException as exc:
        if spec.source.table is None:
            raise ConfigError(f"{where}: key source.query fails: {' '.join(str(exc).split())}") from exc
        raise ConfigError(
            f"{where}: table '{spec.source.table}' does not exist (key source.table); "
            f"load records with `pipeline load FILE --job {spec.source_file}`"
        ) from exc
    except duckdb.OutOfMemoryException:
        raise  # not the query's fault: the caller names duckdb_memory_limit
    except duckdb.Error as exc:
        raise ConfigError(f"{where}: key source.query fails: {' '.join(str(exc).split())}") from exc
    types = {str(row[0]).lower(): str(row[1]) for row in described}
    missing = [name for name in (spec.source.id_column, *spec.source.fields) if name.lower() not in types]
    if missing:
        raise ConfigError(
            f"{where}: the source has no column {missing} (keys source.id_column / source.fields); "
            f"it has {sorted(types)}"
        )
    _check_ids(connection, spec, where)
    return SourceShape(id_type=types[spec.source.id_column.lower()], columns=tuple(types))


def _check_ids(connection: duckdb.DuckDBPyConnection, spec: JobSpec, where: str) -> None:
    id_column = quote(spec.source.id_column)
    relation = source_relation(spec)
    row = connection.execute(f"SELECT count(*) FROM {relation} WHERE {id_column} IS NULL").fetchone()
    if row is not None and row[0]:
        raise ConfigError(f"{where}: {row[0]} records have a NULL id in column {spec.source.id_column}")
    duplicates = connection.execute(
        f"SELECT {id_column} FROM {relation} GROUP BY ALL HAVING count(*) > 1 LIMIT 5"
    ).fetchall()
    if duplicates:
        shown = ", ".join(repr(dup[0]) for dup in duplicates)
        raise ConfigError(f"{where}: ids are not unique in column {spec.source.id_column} (e.g. {shown})")
