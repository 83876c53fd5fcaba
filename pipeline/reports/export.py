"""``pipeline export``: a job's results, joined to the source ids, to Parquet, JSON lines or CSV.

DuckDB's COPY writes the file itself, streaming: no row passes through Python, and memory stays
within the job's ``duckdb_memory_limit`` whatever the size of the table. Each file is written to a
hidden temporary file in the same folder and renamed into place, so a crashed export never leaves a
half-written file at the path asked for. With ``flatten``, ``extracted`` becomes a column per schema
field, still computed by DuckDB (:mod:`pipeline.reports.flatten`).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

# export_results takes an ExportFormat, so callers import it from here too; it is defined beside the
# defaults, which `--help` reads without loading DuckDB.
from pipeline.defaults import FORMAT_BY_EXTENSION
from pipeline.defaults import ExportFormat as ExportFormat
from pipeline.errors import ConfigError, DatabaseError
from pipeline.job.spec import JobSpec
from pipeline.quality.fields import schema_fields
from pipeline.reports.flatten import SESSION_SETTINGS, flat_columns, select_list
from pipeline.source.db import Database, memory_limit_or_default, quote
from pipeline.source.relation import source_relation
from pipeline.store.opening import open_job_output
from pipeline.store.read_copy import ReadCopy, read_copy_of
from pipeline.store.tables import history_table

_COPY_OPTIONS = {
    ExportFormat.PARQUET: "FORMAT parquet, ROW_GROUP_SIZE_BYTES '64MB'",
    ExportFormat.JSONL: "FORMAT json",  # one object per line; a JSON column is written as nested JSON
    ExportFormat.CSV: "FORMAT csv, HEADER true",
}
RESULT_EXPORT_COLUMNS = (
    "extracted",
    "model",
    "attempts",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "finish_reason",
    "created_at",
    "variant",
    "run_id",
    "latency_s",
    "max_tokens",
    "total_prompt_tokens",
    "total_completion_tokens",
    "total_reasoning_tokens",
    "total_latency_s",
    "content_hash",
    "prompt_hash",
    "schema_hash",
    "settings_hash",
)
HISTORY_EXPORT_COLUMNS = ("superseded_at", "superseded_by_run")
EXPORT_MEMORY_FLOOR = "1GB"
FAILURE_EXPORT_COLUMNS = ("failure_class", "message", "attempts", "last_raw_output", "created_at")


@dataclass(frozen=True, slots=True)
class ExportReport:
    out: Path
    format: ExportFormat
    rows: int
    failures_out: Path | None = None
    failure_rows: int | None = None
    history_out: Path | None = None
    history_rows: int | None = None
    read_copy: ReadCopy | None = None  # a run holds the database: exported from its copy


def export_format(out: Path, fmt: ExportFormat | str | None) -> ExportFormat:
    """The format asked for, or else the one ``out``'s extension names."""
    choices = f"use --format {'|'.join(ExportFormat)} or a path ending in {', '.join(FORMAT_BY_EXTENSION)}"
    if isinstance(fmt, ExportFormat):
        return fmt
    if fmt is not None:
        try:
            return ExportFormat(fmt.lower().lstrip("."))
        except ValueError:
            raise ConfigError(f"{out}: unknown export format {fmt!r}; {choices}") from None
    found = FORMAT_BY_EXTENSION.get(out.suffix.lower())
    if found is None:
        raise ConfigError(
            f"{out}: cannot tell the export format from the extension {out.suffix!r}; {choices}"
        )
    return found


def export_memory_limit(spec: JobSpec) -> str:
    """The job's DuckDB memory limit, but at least 1 GB.

    The writers hold a chunk of 2,048 rows per thread, 40 MB of 20 KB results, and copies of it on
    the way: at 128 MB every format ran out of memory on 20 KB results. The limit caps DuckDB's
    buffer pool and reserves nothing, so an export of small results stays small anyway.
    """
    limit = memory_limit_or_default(spec.duckdb_memory_limit)
    size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT])(i?)B", limit)
    if size is None:  # the job spec's pattern lets nothing else through
        return EXPORT_MEMORY_FLOOR
    number, prefix, binary = size.groups()
    limit_bytes = float(number) * (1024 if binary else 1000) ** ("KMGT".index(prefix) + 1)
    return limit if limit_bytes >= 1e9 else EXPORT_MEMORY_FLOOR


def side_path(out: Path, fmt: ExportFormat, part: str) -> Path:
    """Where a second part goes beside ``out``: ``results.parquet`` → ``results.failures.parquet``."""
    if FORMAT_BY_EXTENSION.get(out.suffix.lower()) is fmt:
        return out.with_name(f"{out.stem}.{part}{out.suffix}")
    return out.with_name(f"{out.name}.{part}.{fmt}")


def failures_path(out: Path, fmt: ExportFormat) -> Path:
    """Where ``--include-failures`` writes: ``results.parquet`` → ``results.failures.parquet``."""
    return side_path(out, fmt, "failures")


def export_results(
    spec: JobSpec,
    out: str | Path,
    fmt: ExportFormat | str | None = None,
    *,
    include_failures: bool = False,
    history: bool = False,
    flatten: bool = False,
) -> ExportReport:
    """Write the variant's results for ids still in the source to ``out``, in ``fmt`` (by default the
    one ``out``'s extension names); if asked, its failures and the results that redos replaced
    (``results.history.parquet``), each beside ``out``, in its folder (which must exist: the pipeline
    makes no folder for a file it is named). ``flatten``: a column per schema field instead of
    ``extracted``. Blocking; raises :class:`ConfigError` for an unknown format or a job that has not
    run."""
    out = Path(out)
    fmt = export_format(out, fmt)
    out = _checked_target(spec, out.expanduser().absolute(), include_failures)
    extracted = _extracted_columns(spec, fmt, flatten)
    failures_out = failures_path(out, fmt) if include_failures else None
    history_out = side_path(out, fmt, "history") if history else None
    tables = [spec.output.results_table]
    tables += [spec.output.failures_table] if failures_out else []
    tables += [history_table(spec)] if history_out else []
    connection = open_job_output(spec, tables, memory_limit=export_memory_limit(spec))
    # Keeping the rows' order buffers them in memory, past the memory limit on a big table; each row
    # carries its id, so the order does not matter.
    connection.execute("SET preserve_insertion_order = false")
    for setting in SESSION_SETTINGS if flatten else ():
        connection.execute(setting)
    written: list[tuple[Path, Path]] = []  # (temporary file, final path)
    try:
        copy = functools.partial(_copy, connection, spec.variant, fmt, written=written)
        rows = copy(_results_sql(spec, extracted), out)
        failure_rows = copy(_failures_sql(spec), failures_out) if failures_out else None
        history_rows = copy(_history_sql(spec, extracted), history_out) if history_out else None
        _move_into_place(written)
        read_copy = read_copy_of(connection)
    finally:
        connection.close()
        for temporary, _ in written:
            temporary.unlink(missing_ok=True)
    return ExportReport(out, fmt, rows, failures_out, failure_rows, history_out, history_rows, read_copy)


def _checked_target(spec: JobSpec, out: Path, include_failures: bool) -> Path:
    columns: tuple[str, ...] = (*RESULT_EXPORT_COLUMNS, *HISTORY_EXPORT_COLUMNS, "record_id")
    columns += FAILURE_EXPORT_COLUMNS if include_failures else ()
    if spec.source.id_column.lower() in columns:
        raise ConfigError(
            f"{spec.source_file}: key 'source.id_column': {spec.source.id_column!r} is also the name "
            "of an exported column; export cannot name two columns alike"
        )
    if out.is_dir():
        raise ConfigError(f"{out}: is a folder; give the path of the file to write")
    if out.resolve() == spec.database.resolve():
        raise ConfigError(f"{out}: is the job's database; give another path")
    return out


def _extracted_columns(spec: JobSpec, fmt: ExportFormat, flatten: bool) -> str:
    """What a row holds of the extraction: ``extracted``, or (``flatten``) a column per schema field."""
    if not flatten:
        # CSV has no nested values: the JSON goes in as its text.
        return "r.extracted::VARCHAR AS extracted" if fmt is ExportFormat.CSV else "r.extracted"
    columns = flat_columns(schema_fields(spec.schema_class), csv=fmt is ExportFormat.CSV)
    taken = {
        name.lower() for name in (*RESULT_EXPORT_COLUMNS, *HISTORY_EXPORT_COLUMNS, spec.source.id_column)
    }
    for name, _ in columns:
        if name.lower() in taken:
            raise ConfigError(
                f"{spec.source_file}: key 'schema': field {name!r} of {spec.schema_path} is also the name "
                "of an exported column; export --flatten cannot name two columns alike (without "
                "--flatten, `extracted` holds it)"
            )
    return select_list(columns)


def _result_columns(extracted: str, extra: tuple[str, ...] = ()) -> str:
    return ", ".join([extracted, *(f"r.{column}" for column in (*RESULT_EXPORT_COLUMNS[1:], *extra))])


def _results_sql(spec: JobSpec, extracted: str) -> str:
    id_column = quote(spec.source.id_column)
    return (
        f"SELECT s.{id_column} AS {id_column}, {_result_columns(extracted)} "
        f"FROM {quote(spec.output.results_table)} r "
        f"JOIN {source_relation(spec)} s ON s.{id_column} = r.record_id WHERE r.variant = $variant"
    )


def _history_sql(spec: JobSpec, extracted: str) -> str:
    """Every replaced result, also of ids no longer in the source (that is what a history is for)."""
    return (
        f"SELECT r.record_id AS {quote(spec.source.id_column)}, "
        f"{_result_columns(extracted, HISTORY_EXPORT_COLUMNS)} "
        f"FROM {quote(history_table(spec))} r WHERE r.variant = $variant"
    )


def _failures_sql(spec: JobSpec) -> str:
    id_column = quote(spec.source.id_column)
    columns = ", ".join(f"f.{column}" for column in FAILURE_EXPORT_COLUMNS)
    return (
        f"SELECT s.{id_column} AS {id_column}, {columns} FROM {quote(spec.output.failures_table)} f "
        f"JOIN {source_relation(spec)} s ON s.{id_column} = f.record_id WHERE f.variant = $variant"
    )


def _copy(
    connection: Database,
    variant: str,
    fmt: ExportFormat,
    sql: str,
    final: Path,
    *,
    written: list[tuple[Path, Path]],
) -> int:
    """COPY ``sql`` to a new temporary file beside ``final``; note it in ``written``; return the rows."""
    # DuckDB creates the file itself, so it gets the usual permissions (mkstemp's would be 0600).
    temporary = final.with_name(f".{final.name}.{secrets.token_hex(4)}.tmp")
    written.append((temporary, final))
    try:
        # DuckDB >= 2.0 takes the file name as a parameter: no quoting of the path in the SQL.
        copy = f"COPY ({sql}) TO $path ({_COPY_OPTIONS[fmt]})"
        row = connection.row(copy, {"path": str(temporary), "variant": variant})
    except DatabaseError as error:
        raise ConfigError(f"{final}: export failed ({error.reason})") from error
    return int(row[0]) if row else 0


def _move_into_place(written: list[tuple[Path, Path]]) -> None:
    for temporary, final in written:
        try:
            os.replace(temporary, final)  # same folder, so atomic: the old file or the new one, never half
        except OSError as exc:
            raise ConfigError(f"{final}: cannot write ({exc.strerror or exc})") from exc
