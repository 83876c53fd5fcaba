"""Writing a judge's judgments as they are made: into the job's database at once, or into a journal beside
it while something else holds the database.

The judging page must not keep the database from a nightly ``pipeline run`` (DuckDB lets one process
open the file for writing), so :class:`JudgmentWriter` opens it for each write and closes it at once.
When a run (or a load, or a DuckDB shell) holds it, the judgments go to ``<database>.judgments-pending
.jsonl``, one JSON line per action, fsync'd before the page is told they are saved; the journal is
written into the table at the next write that finds the database free (and when judging starts).
Replaying it is idempotent: judgments the table already holds (a replay cut short) are skipped.

Undo of a journaled judgment removes it from the journal; undo of one already in the table deletes its
row, or, while the database is held, is journaled in its turn.

Blocking, like every DuckDB call: the server runs these in a worker thread, one call at a time.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson
import structlog

from pipeline.errors import ConfigError, DatabaseLockedError
from pipeline.job.spec import JobSpec
from pipeline.quality.judgments import Judgment, JudgmentVerdict
from pipeline.source.db import Database, open_database
from pipeline.source.lock import lock_holder
from pipeline.store.judgments import record_judgments, stored_judgment_ids, undo_judgment

log = structlog.get_logger("pipeline.judging.journal")

JOURNAL_SUFFIX = ".judgments-pending.jsonl"


def journal_path(database: Path) -> Path:
    return database.with_name(database.name + JOURNAL_SUFFIX)


class Saved(StrEnum):
    WRITTEN = "written"  # in the judgments table
    JOURNALED = "journaled"  # in the journal: written into the table when the database is free


@dataclass(slots=True)
class Pending:
    """What the journal holds: judgments not yet in the table, and ids of table rows to delete."""

    added: list[Judgment] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.added) + len(self.undone)


class Journal:
    """The journal file: appended to with fsync, rewritten atomically, read whole."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> Pending:
        """Its actions, in order. A last line cut short (the process was killed while writing it, so no
        page was told it was saved) is left out; any other bad line is a :class:`ConfigError`."""
        pending = Pending()
        try:
            lines = self.path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return pending
        except OSError as error:
            raise ConfigError(f"{self.path}: cannot read the judgments journal ({error.strerror})") from error
        numbered = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
        for position, (number, line) in enumerate(numbered):
            try:
                action = orjson.loads(line)
                pending.added += [_judgment(item) for item in action.get("add", ())]
                pending.undone += [str(item) for item in action.get("undo", ())]
            except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as error:
                if position == len(numbered) - 1:
                    log.warning("journal: last line cut short, left out", path=str(self.path), line=number)
                    break
                raise ConfigError(f"{self.path}:{number}: not a journaled judgment ({error})") from error
        return pending

    def append(self, *, added: Sequence[Judgment] = (), undone: Sequence[str] = ()) -> None:
        action: dict[str, Any] = {}
        if added:
            action["add"] = [_as_json(judgment) for judgment in added]
        if undone:
            action["undo"] = list(undone)
        created = not self.path.exists()
        with self.path.open("ab") as journal:
            journal.write(orjson.dumps(action) + b"\n")
            journal.flush()
            os.fsync(journal.fileno())
        if created:
            _sync_folder(self.path.parent)

    def drop(self, judgment_ids: Iterable[str]) -> set[str]:
        """Remove these journaled judgments; return the ids it held."""
        wanted = set(judgment_ids)
        pending = self.read()
        found = {judgment.judgment_id for judgment in pending.added} & wanted
        if found:
            kept = [judgment for judgment in pending.added if judgment.judgment_id not in found]
            self._rewrite(Pending(kept, pending.undone))
        return found

    def clear(self) -> None:
        with suppress(FileNotFoundError):
            self.path.unlink()
            _sync_folder(self.path.parent)

    def _rewrite(self, pending: Pending) -> None:
        if not pending:
            self.clear()
            return
        temporary = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        with temporary.open("wb") as journal:
            journal.write(orjson.dumps({"add": [_as_json(j) for j in pending.added], "undo": pending.undone}))
            journal.write(b"\n")
            journal.flush()
            os.fsync(journal.fileno())
        os.replace(temporary, self.path)  # the old journal or the new one, never half of one
        _sync_folder(self.path.parent)


class JudgmentWriter:
    """The one writer of a judging session's judgments: the table when the database is free, else the
    journal. Each call opens the database and closes it before it returns."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.journal = Journal(journal_path(spec.database))

    def save(self, judgments: Sequence[Judgment]) -> Saved:
        if self._written(lambda connection: record_judgments(connection, self.spec, judgments)):
            return Saved.WRITTEN
        self.journal.append(added=judgments)
        return Saved.JOURNALED

    def undo(self, judgments: Sequence[Judgment]) -> Saved:
        """Take back ``judgments`` (one action): from the journal, or from the table."""
        ids = [judgment.judgment_id for judgment in judgments]
        in_table = [judgment_id for judgment_id in ids if judgment_id not in self.journal.drop(ids)]
        if not in_table:
            return Saved.WRITTEN if not self.journal.path.exists() else Saved.JOURNALED

        def undo(connection: Database) -> None:
            for judgment_id in in_table:
                undo_judgment(connection, self.spec, judgment_id)

        if self._written(undo):
            return Saved.WRITTEN
        self.journal.append(undone=in_table)
        return Saved.JOURNALED

    def flush(self) -> bool:
        """Write the journal into the table if the database is free; True when nothing is left pending."""
        return not self.journal.path.exists() or self._written(lambda connection: None)

    def _written(self, write: Callable[[Database], object]) -> bool:
        """What the journal holds, then ``write``, on the database, closed before the journal is
        removed: a journal gone means its judgments are in the table and the file is free to open. A
        crash between the two leaves a journal whose replay skips what is written. False, with nothing
        done, while the database is held."""
        connection = self._open()
        if connection is None:
            return False
        try:
            self._replay(connection)
            write(connection)
        finally:
            connection.close()
        self.journal.clear()
        return True

    def pending(self) -> Pending:
        return self.journal.read()

    def _replay(self, connection: Database) -> None:
        pending = self.journal.read()
        if pending:
            added = pending.added
            written = stored_judgment_ids(connection, self.spec, [j.judgment_id for j in added])
            record_judgments(connection, self.spec, [j for j in added if j.judgment_id not in written])
            for judgment_id in pending.undone:
                undo_judgment(connection, self.spec, judgment_id)
            log.info("journal written into the table", judgments=len(added), undone=len(pending.undone))

    def _open(self) -> Database | None:
        """The database open for writing, or None while a run (or anything else) holds it."""
        database = self.spec.database
        if lock_holder(database) is not None:  # a run is starting or running: leave the file to it
            return None
        try:
            return open_database(database, memory_limit=self.spec.duckdb_memory_limit)
        except DatabaseLockedError:
            return None


def _as_json(judgment: Judgment) -> dict[str, Any]:
    return {
        "record_id": judgment.record_id,
        "variant": judgment.variant,
        "field": judgment.field,
        "value": judgment.value,
        "verdict": str(judgment.verdict),
        "judge": judgment.judge,
        "result_key": judgment.result_key,
        "judgment_id": judgment.judgment_id,
        "judged_at": judgment.judged_at.isoformat() if judgment.judged_at else None,
        "blind_between": judgment.blind_between,
    }


def _judgment(item: dict[str, Any]) -> Judgment:
    judged_at = item.get("judged_at")
    return Judgment(
        record_id=str(item["record_id"]),
        variant=str(item["variant"]),
        field=str(item["field"]),
        value=str(item["value"]),
        verdict=JudgmentVerdict(item["verdict"]),
        judge=str(item["judge"]),
        result_key=str(item["result_key"]),
        judgment_id=str(item["judgment_id"]),
        judged_at=dt.datetime.fromisoformat(judged_at) if judged_at else None,
        blind_between=str(item.get("blind_between") or ""),  # a journal of an earlier version has none
    )


def _sync_folder(folder: Path) -> None:
    """Make a file's creation, rename or removal durable (its folder's entry)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
