"""The ``judgments`` table: what people and models said of extracted values, one row per judgment.

Each row names the value (variant, record, field path, value), the verdict, the judge and the result it
judged: ``result_key``, a hash of the result's version key, the run that made it and its answer. Rows
are written as they are made, one transaction per call, and never rewritten: a judge who changes their
mind adds a row (the latest judgment of a value by a judge is the one that counts), and undo deletes
the row it undoes. When a record is redone its result key changes, so the judgments of the old result
are kept but read as *stale*, and stop counting.

The table sits beside the results (``results`` -> ``judgments``; another results table ``x`` ->
``x_judgments``), is created with the other output tables and travels in the read copy a run writes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.quality.agreement import record_key
from pipeline.quality.judgments import Judgment, JudgmentVerdict
from pipeline.source.db import UTC_NOW, Database, quote
from pipeline.source.versions import VERSION_COLUMNS

DEFAULT_RESULTS_TABLE = "results"
JUDGMENTS_SUFFIX = "_judgments"

# (name, type) after the key columns (variant, record_id); created_at (when judged) comes last.
JUDGMENT_COLUMNS = [
    ("judgment_id", "VARCHAR"),
    ("field", "VARCHAR"),
    ("value", "VARCHAR"),
    ("verdict", "VARCHAR"),
    ("judge", "VARCHAR"),
    ("result_key", "VARCHAR"),
    ("blind_between", "VARCHAR"),  # judged blind between these two variants (blind_pair); NULL: seen
]


def judgments_table(spec: JobSpec) -> str:
    results = spec.output.results_table
    return "judgments" if results == DEFAULT_RESULTS_TABLE else results + JUDGMENTS_SUFFIX


def result_key_sql(alias: str) -> str:
    """SQL for the key of the results row ``alias``: its version key, the run that made it and its
    answer, hashed. A redo changes it (a new run, at least), so it tells which result was judged."""
    parts = ["run_id", *(name for name, _ in VERSION_COLUMNS), "extracted"]
    cast = ", ".join(f"coalesce(CAST({alias}.{quote(part)} AS VARCHAR), '')" for part in parts)
    return f"md5(concat_ws('|', {cast}))"


def current_result_keys(
    connection: Database, spec: JobSpec, variant: str, records: Collection[str]
) -> dict[str, str]:
    """record key -> the key of its current result of ``variant``, for those of ``records`` that have one."""
    results = quote(spec.output.results_table)
    sql = (
        f"SELECT record_id, {result_key_sql('r')} FROM {results} r WHERE variant = $variant "
        "AND trim(CAST(record_id AS VARCHAR)) IN (SELECT unnest($records))"
    )
    rows = connection.rows(sql, {"variant": variant, "records": sorted(set(records))})
    return {record_key(record_id): str(key) for record_id, key in rows}


def record_judgments(connection: Database, spec: JobSpec, judgments: Sequence[Judgment]) -> list[Judgment]:
    """Write ``judgments`` in one transaction, each tied to the current result of its record; return
    them as stored (with their ids and result keys).

    A judgment that names its ``result_key`` (a page that showed that result) keeps it: if the record
    was redone since, the judgment is stored stale, as it would have become had it been written first.
    A judgment's ``judged_at``, when given, is its time in the table (one written late from a journal
    keeps the time it was made).

    Raises :class:`ConfigError`, and writes nothing, when a record of a judgment without a result key
    has no current result of that variant (it no longer exists, failed, or was never extracted)."""
    with connection.transaction():
        stored = _tied(connection, spec, judgments)
        _insert(connection, spec, stored)
    return stored


@dataclass(frozen=True, slots=True)
class Merged:
    """What :func:`merge_judgments` did with each judgment it was given."""

    added: int  # no judgment of that value by that judge for that result before
    replaced: int  # one with another verdict: the new one is now the latest, the one that counts
    unchanged: int  # the latest already said the same: nothing written

    @property
    def written(self) -> int:
        return self.added + self.replaced


def merge_judgments(connection: Database, spec: JobSpec, judgments: Sequence[Judgment]) -> Merged:
    """Write ``judgments`` as :func:`record_judgments` does, each once: per (variant, record, field,
    value, judge) of the result judged, one whose latest judgment says the same verdict is left as it
    is, and one that says another is written after it (the latest counts; the earlier row stays, as a
    judge's change of mind on the page does). ``judgments`` name each (value, judge) once. One
    transaction; raises :class:`ConfigError` as :func:`record_judgments` does, writing nothing."""
    with connection.transaction():
        tied = _tied(connection, spec, judgments)
        judges = {judgment.judge for judgment in tied}
        variants = sorted({judgment.variant for judgment in tied})
        latest = {
            (*judgment.key, judgment.result_key): judgment.verdict
            for judgment in read_judgments(connection, spec, variants, include_stale=True, judges=judges)
        }
        before = [(judgment, latest.get((*judgment.key, judgment.result_key))) for judgment in tied]
        changed = [(judgment, said) for judgment, said in before if said != judgment.verdict]
        _insert(connection, spec, [judgment for judgment, _ in changed])
    replaced = sum(said is not None for _, said in changed)
    return Merged(len(changed) - replaced, replaced, len(tied) - len(changed))


def _tied(connection: Database, spec: JobSpec, judgments: Sequence[Judgment]) -> list[Judgment]:
    """``judgments``, each tied to the result it judges: its own ``result_key``, else its record's
    current result (a :class:`ConfigError` for a record with none)."""
    keys: dict[str, dict[str, str]] = {}
    for variant in {judgment.variant for judgment in judgments if not judgment.result_key}:
        wanted = {j.record_id for j in judgments if j.variant == variant and not j.result_key}
        keys[variant] = current_result_keys(connection, spec, variant, wanted)
    tied = []
    for judgment in judgments:
        result_key = judgment.result_key or keys[judgment.variant].get(judgment.record_id)
        if result_key is None:
            raise ConfigError(
                f"{spec.database}: record {judgment.record_id!r} has no result of variant "
                f"{judgment.variant!r} to judge (not extracted, failed, or no longer in the source)"
            )
        tied.append(_with_key(judgment, result_key))
    return tied


def _with_key(judgment: Judgment, result_key: str) -> Judgment:
    return Judgment(
        record_id=judgment.record_id,
        variant=judgment.variant,
        field=judgment.field,
        value=judgment.value,
        verdict=JudgmentVerdict(judgment.verdict),
        judge=judgment.judge,
        result_key=result_key,
        judged_at=judgment.judged_at,
        judgment_id=judgment.judgment_id or uuid.uuid4().hex,
        blind_between=judgment.blind_between,
    )


def _insert(connection: Database, spec: JobSpec, judgments: Sequence[Judgment]) -> None:
    """One statement for the lot, column by column: a model judge writes thousands of judgments a
    batch, and a row at a time took 0.7 ms each (most of its time)."""
    if not judgments:
        return
    values = {
        "variant": [j.variant for j in judgments],
        "record_id": [j.record_id for j in judgments],
        "judgment_id": [j.judgment_id for j in judgments],
        "field": [j.field for j in judgments],
        "value": [j.value for j in judgments],
        "verdict": [str(j.verdict) for j in judgments],
        "judge": [j.judge for j in judgments],
        "result_key": [j.result_key for j in judgments],
        "blind_between": [j.blind_between or None for j in judgments],
        "created_at": [_utc(j.judged_at) for j in judgments],
    }
    # created_at: the judgment's own time (UTC, as every timestamp is stored), else now.
    selected = [f"unnest(${name})" for name in values if name != "created_at"]
    selected.append(f"coalesce(CAST(unnest($created_at) AS TIMESTAMP), {UTC_NOW})")
    table = quote(judgments_table(spec))
    connection.execute(
        f"INSERT INTO {table} ({', '.join(values)}) SELECT {', '.join(selected)}",
        values,
    )


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    """``moment`` as the naive UTC time the table stores (a naive time is taken as UTC already)."""
    if moment is None or moment.tzinfo is None:
        return moment
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def stored_judgment_ids(connection: Database, spec: JobSpec, judgment_ids: Collection[str]) -> set[str]:
    """Those of ``judgment_ids`` the table holds (a journal written again skips them)."""
    table = quote(judgments_table(spec))
    sql = f"SELECT judgment_id FROM {table} WHERE judgment_id IN (SELECT unnest($ids))"
    return {str(row[0]) for row in connection.rows(sql, {"ids": sorted(set(judgment_ids))})}


def undo_judgment(connection: Database, spec: JobSpec, judgment_id: str) -> bool:
    """Delete the judgment ``judgment_id``; False when there was none."""
    table = quote(judgments_table(spec))
    with connection.transaction():
        where = {"id": judgment_id}
        found = connection.scalar(f"SELECT count(*) FROM {table} WHERE judgment_id = $id", where)
        connection.execute(f"DELETE FROM {table} WHERE judgment_id = $id", where)
    return found > 0


def read_judgments(
    connection: Database,
    spec: JobSpec,
    variants: Sequence[str] | None = None,
    *,
    include_stale: bool = False,
    latest_only: bool = True,
    judges: Collection[str] | None = None,
) -> list[Judgment]:
    """The judgments of ``variants`` (all when None), oldest first.

    ``latest_only``: one per (variant, record, field, value, judge) of each result, the latest (what
    counts).
    ``include_stale``: also those whose result was redone since (``stale`` says which). ``judges``: only
    theirs (a page opening reads its own judge's, not a model's thousands)."""
    table, results = quote(judgments_table(spec)), quote(spec.output.results_table)
    latest = (
        "QUALIFY row_number() OVER (PARTITION BY j.variant, j.record_id, j.field, j.value, j.judge, "
        "j.result_key ORDER BY j.created_at DESC, j.rowid DESC) = 1"
        if latest_only
        else ""
    )
    sql = (
        "SELECT j.record_id, j.variant, j.field, j.value, j.verdict, j.judge, j.result_key, j.created_at, "
        f"j.judgment_id, r.record_id IS NULL AS stale, j.blind_between FROM {table} j LEFT JOIN {results} r "
        f"ON r.variant = j.variant AND r.record_id = j.record_id AND {result_key_sql('r')} = j.result_key "
        "WHERE ($all_variants OR j.variant IN (SELECT unnest($variants))) "
        f"AND ($all_judges OR j.judge IN (SELECT unnest($judges))) {latest} "
        "ORDER BY j.created_at, j.rowid"  # the order they were made in (one call's rows share a time)
    )
    rows = connection.rows(
        sql,
        {
            "all_variants": variants is None,
            "variants": list(variants or []),
            "all_judges": judges is None,
            "judges": sorted(judges or []),
        },
    )
    found = [_judgment(row) for row in rows]
    return found if include_stale else [judgment for judgment in found if not judgment.stale]


def _judgment(row: Sequence[object]) -> Judgment:
    record_id, variant, field, value, verdict, judge, result_key, judged_at, judgment_id, stale, blind = row
    return Judgment(
        record_id=record_key(record_id),
        variant=str(variant),
        field=str(field),
        value=str(value),
        verdict=JudgmentVerdict(str(verdict)),
        judge=str(judge),
        result_key=str(result_key),
        judged_at=judged_at if isinstance(judged_at, dt.datetime) else None,  # a TIMESTAMP column
        judgment_id=str(judgment_id),
        stale=bool(stale),
        blind_between=str(blind or ""),
    )
