"""``pipeline load``: a file of records into the job's DuckDB source table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.common import (
    DatabaseOption,
    app,
    fail,
    load_job_or_exit,
    run_or_exit,
    saying_a_new_database,
)
from pipeline.errors import ConfigError
from pipeline.wording import counted

if TYPE_CHECKING:  # what the load needs loads when it runs (see pipeline.cli)
    from pipeline.job.spec import JobSpec
    from pipeline.source.loader import LoadReport


def _parse_renames(pairs: list[str]) -> dict[str, str]:
    renames = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise fail(ConfigError(f"--rename {pair!r}: expected FILE_COLUMN=NAME"))
        renames[old] = new
    return renames


@app.command()
def load(
    file: Annotated[Path, typer.Argument(help="CSV, TSV, JSONL/NDJSON, JSON or Parquet file.")],
    job: Annotated[Path, typer.Option("--job", help="The job whose database and source table to fill.")],
    table: Annotated[str | None, typer.Option(help="Target table (default: the job's source.table).")] = None,
    rename: Annotated[
        list[str] | None, typer.Option(help="Rename a column: FILE_COLUMN=NAME (repeatable).")
    ] = None,
    replace: Annotated[
        bool, typer.Option(help="Make the table equal to the file (ids not in it are removed).")
    ] = False,
    file_format: Annotated[str | None, typer.Option("--format", help="Override the file type.")] = None,
    database: DatabaseOption = None,
) -> None:
    """Load records into the job's DuckDB source table: new ids are added, changed rows updated."""
    from pipeline.store.opening import load_source

    spec = load_job_or_exit(job, database)
    renames = _parse_renames(rename or [])
    with saying_a_new_database(spec, database):
        report = run_or_exit(
            lambda: load_source(
                spec, file, table=table, rename=renames, replace=replace, file_format=file_format
            )
        )
    typer.echo(_load_text(report, file, spec, replace))


def _load_text(report: LoadReport, file: Path, spec: JobSpec, replace: bool) -> str:
    from pipeline.job.commands import Asked

    database = spec.database
    text = (
        f"loaded {counted(report.rows_in_file, 'record')} from {file} into table {report.table} of "
        f"{database}: "
        f"{report.inserted:,} new, {report.updated:,} updated, {report.unchanged:,} unchanged"
    )
    if replace and report.removed:
        text += (
            f", {report.removed:,} removed (their results stay; `{Asked.of(spec).command('status')}` counts "
            "them as orphaned)"
        )
    if report.blank:
        text += f"\nblank:    {report.blank.not_sent()}"
    return text
