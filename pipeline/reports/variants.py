"""Which variants a job has (:func:`known_variants`: main, those its file declares, those its database
holds), the check that a reader's ``--variant`` is one of them (:func:`check_variant`: a typo would
otherwise read as an empty variant), and the command-line options a variant's last run was given
(:func:`last_run_options`, :func:`made_with`). Blocking (DuckDB)."""

from __future__ import annotations

import orjson

from pipeline.errors import ConfigError
from pipeline.job.spec import MAIN_VARIANT, JobSpec
from pipeline.source.db import Database, quote
from pipeline.store.opening import open_for_reading


def stored_variants(connection: Database, spec: JobSpec) -> list[str]:
    """The variants with a result, a failure or a run in the job's tables (those that exist), sorted."""
    existing = connection.table_names()
    output = spec.output
    tables = [
        t for t in (output.results_table, output.failures_table, output.runs_table) if t.lower() in existing
    ]
    if not tables:
        return []
    union = " UNION ".join(f"SELECT DISTINCT variant FROM {quote(table)}" for table in tables)
    return sorted(str(name) for (name,) in connection.rows(f"SELECT variant FROM ({union})"))


def known_variants(connection: Database, spec: JobSpec) -> list[str]:
    """main, the variants the job file declares, and those the database holds."""
    stored = stored_variants(connection, spec)
    declared = [name for name in spec.variants if name not in stored]
    return [MAIN_VARIANT, *declared, *(name for name in stored if name != MAIN_VARIANT)]


def check_variant(connection: Database, spec: JobSpec) -> None:
    """A :class:`ConfigError` naming the known variants when ``spec.variant`` is none of them."""
    known = known_variants(connection, spec)
    if spec.variant in known:
        return
    raise ConfigError(
        f"--variant {spec.variant!r}: {spec.source_file} declares no such variant and {spec.database} holds "
        f"nothing of it; known variants: {', '.join(known)}"
    )


def require_known_variant(spec: JobSpec) -> None:
    """:func:`check_variant` on the job's database (its read copy while a run holds it), for a command
    that reads the variant through another connection; without a database that command says so."""
    if spec.variant == MAIN_VARIANT or not spec.database.exists():
        return
    connection = open_for_reading(spec)
    try:
        check_variant(connection, spec)
    finally:
        connection.close()


def last_run_options(connection: Database, spec: JobSpec, variant: str) -> tuple[str, ...]:
    """The command-line options ``variant``'s last run was given (``--model M``, ``--prompt-file F``...,
    as :class:`pipeline.run.options.VariantOptions` keeps them); none kept (an older database): none."""
    runs = spec.output.runs_table
    if runs.lower() not in connection.table_names() or "options" not in connection.column_names(runs):
        return ()
    row = connection.row(
        f"SELECT options FROM {quote(runs)} WHERE variant = $variant ORDER BY run_id DESC LIMIT 1",
        {"variant": variant},
    )
    words = orjson.loads(row[0]) if row and row[0] else []
    return tuple(str(word) for word in words) if isinstance(words, list) else ()


def made_with(spec: JobSpec, variant: str) -> tuple[str, ...]:
    """:func:`last_run_options` read from the job's database (while a run holds it, from its read copy:
    ``DatabaseLockedError`` when it has written none); none without a database."""
    if not spec.database.exists():
        return ()
    connection = open_for_reading(spec)
    try:
        return last_run_options(connection, spec, variant)
    finally:
        connection.close()
