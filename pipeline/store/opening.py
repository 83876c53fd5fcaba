"""Opening the job's database: for a run (load the seed file, check the source, create or upgrade the
output tables), for a load, and for reading (read-only, brought up to date first), and what earlier
runs left for the next one (the knees `concurrency: auto` found).

The one place a job's database is created: a new one is built beside where it goes and put there only
when the load or the run's set-up succeeded (:func:`new_database`), so a command that fails on its
input creates nothing."""

from __future__ import annotations

import glob
import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import orjson
import structlog

from pipeline.errors import (
    AlreadyRunningError,
    ConfigError,
    DatabaseError,
    DatabaseFailure,
)
from pipeline.job.commands import Asked
from pipeline.job.spec import JobSpec
from pipeline.servers.config import EndpointConfig
from pipeline.servers.knee_search import KneeMemory
from pipeline.source.db import UTC_NOW, Database, memory_limit_or_default, open_database, quote
from pipeline.source.loader import LoadReport, load_file
from pipeline.source.lock import missing_folders, remove_folders
from pipeline.source.relation import describe_source
from pipeline.store.read_copy import open_read_copy
from pipeline.store.run_profiles import BENCH
from pipeline.store.tables import create_output_tables, needs_upgrade

log = structlog.get_logger("pipeline.store.opening")


def prepare_database(spec: JobSpec) -> Database:
    """Open the job's database, load the seed file into an absent source table, check the source and
    create (or bring up to date) the output tables. Blocking; raises :class:`ConfigError` before any
    request is sent. A database that does not exist yet is created only if all of that succeeds."""
    new = not spec.database.exists()
    if new:
        with new_database(spec.database, spec.duckdb_memory_limit, where=_key_database(spec)) as building:
            _prepare(building, spec)
    connection = _open(spec.database, spec)
    if new:
        return connection
    with connection.closed_on_error():
        _prepare(connection, spec)
    return connection


def _open(database: Path, spec: JobSpec) -> Database:
    try:
        return open_database(database, memory_limit=spec.duckdb_memory_limit)
    except ConfigError as error:
        raise ConfigError(f"{_key_database(spec)}{error}") from error


def _key_database(spec: JobSpec) -> str:
    return f"{spec.source_file}: key 'database': "


def _prepare(connection: Database, spec: JobSpec) -> None:
    try:
        table, seed = spec.source.table, spec.source.seed_file
        if table is not None and seed is not None and table.lower() not in connection.table_names():
            try:
                report = load_file(connection, spec, seed)
            except ConfigError as error:
                raise ConfigError(f"{spec.source_file}: key 'source.seed_file': {error}") from error
            log.info("loaded seed file", file=str(seed), table=table, records=report.inserted)
        shape = describe_source(connection, spec)
        create_output_tables(connection, spec, shape.id_type)
        # Only one process can open the database for writing, so a run still "running" was killed
        # (also when this run then finds nothing to do and records no run of its own).
        runs = quote(spec.output.runs_table)
        connection.execute(f"UPDATE {runs} SET status = 'abandoned' WHERE status = 'running'")
    except DatabaseError as error:
        raise _setup_error(spec, error) from error


def load_source(
    spec: JobSpec,
    path: str | Path,
    *,
    table: str | None = None,
    rename: Mapping[str, str] | None = None,
    replace: bool = False,
    file_format: str | None = None,
) -> LoadReport:
    """``pipeline load``: :func:`~pipeline.source.loader.load_file` into the job's own database, opened
    (created, if it is new and the load succeeds) and closed here. Blocking; raises :class:`ConfigError`
    for what it cannot load, ``DatabaseLockedError`` while a run holds the database."""

    def load(connection: Database) -> LoadReport:
        return load_file(
            connection, spec, Path(path), table=table, rename=rename, replace=replace, file_format=file_format
        )

    if not spec.database.exists():
        with new_database(spec.database, spec.duckdb_memory_limit) as building:
            return load(building)
    connection = open_database(spec.database, memory_limit=spec.duckdb_memory_limit)
    try:
        return load(connection)
    finally:
        connection.close()


@contextmanager
def new_database(database: Path, memory_limit: str | None, *, where: str = "") -> Iterator[Database]:
    """A database that does not exist yet, built in a file beside ``database`` (its folder made if
    missing) and put in its place when the block ends without an error; after an error, nothing it
    made is left (the file, its folder). Never replaces a database another process made meanwhile.
    ``where``: what an error opening it is said of first (the job file's key)."""
    made = missing_folders(database.parent)
    if not made:
        _remove_abandoned(database)
    # The pid says whose it is; the token keeps two builds of one process (two threads) apart.
    building = database.with_name(f".{database.name}.{os.getpid()}-{secrets.token_hex(4)}.new")
    try:
        try:
            connection = open_database(building, memory_limit=memory_limit)
        except ConfigError as error:  # said of the database, not of the file it is built in
            raise ConfigError(where + str(error).replace(str(building), str(database))) from error
        try:
            yield connection
            connection.execute("CHECKPOINT")  # all of it in the file: its WAL is not moved along
        finally:
            connection.close()
        _put_in_place(building, database)
    except DatabaseError as error:  # said of the database, not of the file it was built in
        _undo(building, made)
        raise DatabaseError(error.reason, kind=error.kind, database=database) from error
    except BaseException:
        _undo(building, made)
        raise


def _remove_abandoned(database: Path) -> None:
    """What a build of ``database`` whose process is gone left (killed with -9, a power cut)."""
    prefix = f".{database.name}."
    for leftover in database.parent.glob(f"{glob.escape(prefix)}*.new*"):
        pid = leftover.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with suppress(OSError):  # another process removed it first
                leftover.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal sent: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    return True


def _put_in_place(building: Path, database: Path) -> None:
    """``building`` becomes ``database``, unless one appeared there meanwhile (a hard link, unlike a
    rename, refuses to replace it)."""
    try:
        os.link(building, database)
    except FileExistsError:
        raise ConfigError(
            f"{database}: another process created this database meanwhile; run the command again"
        ) from None
    os.unlink(building)


def _undo(building: Path, made: list[Path]) -> None:
    for leftover in (building, building.with_name(building.name + ".wal")):
        with suppress(OSError):  # never made (or its folder is a file): the error is the block's
            leftover.unlink()
    remove_folders(made)


def _setup_error(spec: JobSpec, error: DatabaseError) -> ConfigError:
    """DuckDB failed while the database was opened and checked, before any request: one line naming
    the database, or the job's key when DuckDB ran out of memory (a memory limit of a few KB)."""
    if error.kind is DatabaseFailure.OUT_OF_MEMORY:
        return ConfigError(
            f"{spec.source_file}: key 'duckdb_memory_limit': "
            f"{memory_limit_or_default(spec.duckdb_memory_limit)} is too small "
            f"for {spec.database} ({error.reason})"
        )
    return ConfigError(f"{spec.database}: cannot check the database ({error.reason})")


def known_knees(connection: Database, spec: JobSpec) -> dict[str, KneeMemory]:
    """What the job's latest runs (any variant's: the knee is the server's and the model's, and prompts
    of one job are alike) learned of each server's best level, keyed by :attr:`EndpointConfig.knee_key`:
    a bracketed knee, or the best level measured and the levels that did worse. Rows of earlier
    versions hold a plain level, a bracketed knee; a value neither reads as is skipped."""
    rows = connection.rows(
        f"SELECT knees FROM {quote(spec.output.runs_table)} WHERE knees IS NOT NULL "
        "ORDER BY run_id DESC LIMIT 100"
    )
    knees: dict[str, KneeMemory] = {}
    for (text,) in rows:
        for key, value in orjson.loads(text).items():
            known = KneeMemory.from_json(value)
            if known is not None:
                knees.setdefault(key, known)
    return knees


def seed_knee(spec: JobSpec, endpoint: EndpointConfig, knee: KneeMemory, message: str) -> int:
    """Keep a knee measured outside a run (a ``pipeline bench`` sweep) in the job's database as a row
    of the runs table with status :data:`~pipeline.store.run_profiles.BENCH` (no run: status and report
    pass over it), where :func:`known_knees` reads it as it reads a run's: the next `concurrency: auto`
    run on that server starts there, until a later run learns better.
    Returns the row's run id. Blocking; raises ``DatabaseLockedError`` while a run holds the database."""
    connection = prepare_database(spec)
    try:
        runs = quote(spec.output.runs_table)
        run_id = connection.scalar(f"SELECT coalesce(max(run_id), 0) + 1 FROM {runs}")
        connection.execute(
            f"INSERT INTO {runs} (run_id, job_name, variant, model, base_url, concurrency, started_at, "
            f"updated_at, ended_at, status, pending_at_start, message, knees) "
            f"VALUES (?, ?, ?, ?, ?, ?, {UTC_NOW}, {UTC_NOW}, {UTC_NOW}, ?, 0, ?, ?)",
            [
                run_id,
                spec.name,
                spec.variant,
                endpoint.model,
                endpoint.base_url,
                knee.level,
                BENCH,
                message,
                orjson.dumps({endpoint.knee_key: knee.as_json()}).decode(),
            ],
        )
    finally:
        connection.close()
    return run_id


def open_for_reading(spec: JobSpec, *, memory_limit: str | None = None) -> Database:
    """The job's database, read-only; while a run holds it, the run's read copy
    (:mod:`pipeline.store.read_copy`: :func:`read_copy_of` says so and how old it is), and
    ``DatabaseLockedError`` when the run has written none.

    A database written by an earlier version is brought up to date first, which needs it writable
    for a moment: reading it as it is would count its results wrongly."""
    limit = memory_limit or spec.duckdb_memory_limit
    try:
        connection = open_database(spec.database, read_only=True, memory_limit=limit, made_by=_made_by(spec))
    except AlreadyRunningError as running:  # a run holds the database for its whole length
        return open_read_copy(spec, running)
    # Any other holder (a `load`, a DuckDB shell) writes no read copy: waiting for one would only
    # delay the same error, so DatabaseLockedError goes on at once.
    with connection.closed_on_error():
        try:
            outdated = needs_upgrade(connection, spec)
        except DatabaseError as error:
            raise _setup_error(spec, error) from error
    if not outdated:
        return connection
    connection.close()
    prepare_database(spec).close()
    return open_database(spec.database, read_only=True, memory_limit=limit)


def _made_by(spec: JobSpec) -> tuple[str, str]:
    """The commands that create the job's database, as a reader's error names them."""
    asked = Asked.of(spec)
    return asked.command("load"), asked.command("run")


def open_job_output(spec: JobSpec, tables: Sequence[str], *, memory_limit: str | None = None) -> Database:
    """Open the job's database read-only and check the output ``tables`` exist. Blocking.

    Raises :class:`ConfigError` (no database, no tables yet) or ``DatabaseLockedError`` (a run holds it).
    """
    connection = open_for_reading(spec, memory_limit=memory_limit)
    with connection.closed_on_error():
        existing = connection.table_names()
        missing = [table for table in tables if table.lower() not in existing]
        if missing:
            raise ConfigError(
                f"{spec.database}: no table {missing[0]!r} yet; "
                f"nothing has been extracted (run `{Asked.of(spec).command('run')}` first)"
            )
    return connection
