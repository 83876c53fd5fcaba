"""What a run has to do, and how current the results are: SQL over the source, results and failures.

A source record is *pending* for a variant when

* it has no result and no failure (new);
* its failure is transient, or of a class ``--retry-failed`` / ``--only-failed`` names;
* its prompt fields changed since its result or failure was made (``content``, always redone);
* with ``--redo-stale``: its result (or failure) was made by an older version of the job, for one of
  the causes asked for; a record that already failed under today's version is not redone again;

and it is not *blank* (:mod:`pipeline.source.blank`: every prompt field empty): a record a run would
take that has nothing to extract from is never sent, and counted blank instead of pending.

A re-run (variant ``A~rerun``) takes only records that have a current result of ``A`` (made by the
version of the job it repeats): it measures how much ``A`` differs from itself, on ``A``'s records.

The first four need no record text and are found by one join over ids and version columns (phase
*metadata*). Content changes need every record's text hashed (phase *content*): that query runs while
the first requests are already out, so resuming a large job is as quick as before. Whether a record is
blank needs its text too: the reader looks only at the ids a phase found (:meth:`blank_among_sql`),
whose text a run reads anyway, so the metadata phase still reads none of the others'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import FailureClass
from pipeline.job.spec import JobSpec
from pipeline.job.variants import rerun_of
from pipeline.source.blank import SHOWN_IDS, BlankRecords, blank_condition, blank_ids_sql
from pipeline.source.db import Database, quote
from pipeline.source.relation import source_relation
from pipeline.source.versions import JOB_CAUSES, JobVersion, StaleCause, content_hash_sql, stale_conditions


@dataclass(frozen=True, slots=True)
class Selection:
    """Which records a run takes, beyond the new and the content-changed ones."""

    # The failure classes taken again (a plain run: transient only; those say nothing about the record).
    retry: frozenset[FailureClass] = frozenset({FailureClass.TRANSIENT})
    only_failed: bool = False  # take nothing but failures of the ``retry`` classes
    redo: frozenset[StaleCause] = frozenset()  # job causes whose stale results are redone
    sample: int | None = None  # only inside a fixed, seeded sample of the source
    seed: int = 0
    limit: int | None = None


def sample_sql(spec: JobSpec) -> str:
    """The ids of the seeded sample: the same records for every variant and every re-run."""
    id_column = quote(spec.source.id_column)
    return (
        f"SELECT {id_column} FROM {source_relation(spec)} "
        f"ORDER BY md5(concat(CAST($seed AS VARCHAR), ':', CAST({id_column} AS VARCHAR))), {id_column} "
        "LIMIT $sample"
    )


def sampled_fields(connection: Database, spec: JobSpec, records: int, seed: int) -> list[dict[str, object]]:
    """The job's source fields of the seeded sample of ``records`` records (``--sample N --seed S``):
    what the job would send for them, read once for probes and sweeps; a blank one is never sent, so
    it is left out."""
    names = spec.source.fields
    sql = (
        f"SELECT {', '.join(quote(name) for name in names)} FROM {source_relation(spec)} s "
        f"WHERE {quote(spec.source.id_column)} IN ({sample_sql(spec)}) "
        f"AND NOT {blank_condition(spec.content_fields(), 's')}"
    )
    rows = connection.rows(sql, {"seed": seed, "sample": records})
    return [dict(zip(names, row, strict=True)) for row in rows]


@dataclass(frozen=True, slots=True)
class PendingQueries:
    """The SQL of both phases for one spec (its variant and version) and one selection."""

    spec: JobSpec
    version: JobVersion  # the spec's, computed once by the caller (it hashes the schema)
    selection: Selection = field(default_factory=Selection)

    def parameters(self) -> dict[str, Any]:
        """Every named parameter the queries may use (:func:`pipeline.source.db.bind` keeps those one
        uses)."""
        selection = self.selection
        return {
            **self.version.parameters(),
            "variant": self.spec.variant,
            "retry_classes": sorted(str(name) for name in selection.retry),
            "seed": selection.seed,
            "sample": selection.sample,
            "rerun_of": rerun_of(self.spec.variant),
        }

    def _joined(self, relation: str, *, failure_class: bool = False) -> str:
        """``relation`` (as ``s``) with what each record has: its result ``r`` (is it stale for a cause
        to redo?) and its failure ``f`` (is it retried? stale? and, for the accounting, its class).
        Only ids and booleans are joined to find what is pending, so the hash tables stay small for
        10^6 results."""
        out, id_column = self.spec.output, quote(self.spec.source.id_column)
        redo = self.selection.redo
        return (
            f"FROM {relation} s "
            f"LEFT JOIN (SELECT record_id, {_any_of(stale_conditions('r'), redo)} AS stale "
            f"FROM {quote(out.results_table)} r WHERE variant = $variant) r ON r.record_id = s.{id_column} "
            f"LEFT JOIN (SELECT record_id, {'failure_class, ' if failure_class else ''}"
            "failure_class IN (SELECT unnest($retry_classes)) AS retried, "
            f"{_any_of(stale_conditions('f'), redo)} AS stale FROM {quote(out.failures_table)} f "
            f"WHERE variant = $variant) f ON f.record_id = s.{id_column}"
        )

    def _metadata_condition(self) -> str:
        retried = "(f.record_id IS NOT NULL AND f.retried)"
        if self.selection.only_failed:
            return retried
        conditions = ["(r.record_id IS NULL AND f.record_id IS NULL)", retried]
        if self.selection.redo:
            # A record that already failed under today's job is not redone again (--retry-failed is).
            conditions.append("(r.record_id IS NOT NULL AND r.stale AND (f.record_id IS NULL OR f.stale))")
            conditions.append("(r.record_id IS NULL AND f.record_id IS NOT NULL AND f.stale)")
        return "(" + " OR ".join(conditions) + ")"

    def _restricted(self) -> str:
        """The sample's condition, and a re-run's: only records with a current result of what it repeats."""
        id_column = quote(self.spec.source.id_column)
        sql = f" AND s.{id_column} IN ({sample_sql(self.spec)})" if self.selection.sample else ""
        if rerun_of(self.spec.variant) is not None:
            stale = " OR ".join(stale_conditions("o").values())
            sql += (
                f" AND s.{id_column} IN (SELECT record_id FROM {quote(self.spec.output.results_table)} o "
                f"WHERE o.variant = $rerun_of AND NOT ({stale}))"
            )
        return sql

    def changed_sql(self) -> str:
        """Ids (as ``source.id_column``) whose result or failure was made from other text in the same
        fields. Only the id and the 64-bit hash of each made row are joined to the source being
        hashed, which keeps 10^6 of them within DuckDB's memory limit."""
        spec, id_column = self.spec, quote(self.spec.source.id_column)
        made = " UNION ALL ".join(
            f"SELECT record_id, content_hash FROM {quote(table)} WHERE variant = $variant "
            "AND content_hash IS NOT NULL AND content_fields = $content_fields"
            for table in (spec.output.results_table, spec.output.failures_table)
        )
        return (
            f"SELECT DISTINCT s.{id_column} FROM {source_relation(spec)} s JOIN ({made}) v "
            f"ON v.record_id = s.{id_column} "
            f"WHERE v.content_hash <> {content_hash_sql(spec.content_fields(), 's')}"
        )

    def ids_sql(self, phase: str, changed: str | None = None) -> str:
        """The ids a phase finds, blank ones among them: of phase ``metadata``, or of ``content``: the
        ``changed`` ids (a table of :meth:`changed_sql`'s rows; by default that query itself) less those
        the metadata phase takes. With a limit, in the order a limited run takes them (the stream
        stops at the limit, once the blank ones are set aside)."""
        id_column = quote(self.spec.source.id_column)
        if phase == "metadata":
            relation, condition = source_relation(self.spec), self._metadata_condition()
        else:
            relation = changed or f"({self.changed_sql()})"
            condition = f"NOT coalesce({self._metadata_condition()}, false)"
        ordered = self.selection.limit is not None
        return f"SELECT s.{id_column} {self._joined(relation)} WHERE {condition}{self._restricted()}" + (
            f" ORDER BY {_FIRST_TAKEN}, s.{id_column}" if ordered else ""
        )

    def blank_among_sql(self, table: str) -> str:
        """The ids of ``table`` (one column of source ids, as :meth:`ids_sql` finds them) whose record
        is blank. Only those records' text is read: a job's new records are its last rows, whose row
        groups alone DuckDB scans."""
        spec = self.spec
        id_column = spec.source.id_column
        where = f"s.{quote(id_column)} IN (SELECT * FROM {table})"
        return blank_ids_sql(source_relation(spec), id_column, spec.content_fields(), where)

    def accounting_sql(self) -> str:
        """Every source record counted once, by what a run of this selection makes of it: rows of
        ``(state, reason, failure_class, count, first_ids)``. ``pending``, with why: ``new``,
        ``retried`` (its failure's class is retried), ``stale`` (redone on request), ``content`` (its
        text changed); ``blank``: a record it would take, with every prompt field empty (not sent; the
        reason it would be taken for); ``done``: a result the run keeps (reason ``failed_redo`` when a
        redo of it failed since); ``failed``: a failure the run does not retry; ``outside``: a re-run's
        record without a current result of what it repeats. The counts add up to the source's records
        (``pipeline status``); ``first_ids``: the group's first few ids, in order."""
        id_column = quote(self.spec.source.id_column)
        restricted = self._restricted()
        metadata = f"{self._metadata_condition()}{restricted}"
        changed = f"s.{id_column} IN (SELECT * FROM ({self.changed_sql()})){restricted}"
        content = changed if self.has_content_phase else "false"
        kept = "r.record_id IS NOT NULL"
        blank = blank_condition(self.spec.content_fields(), "s")
        state = (
            f"CASE WHEN ({metadata} OR {content}) AND {blank} THEN 'blank' "
            f"WHEN {metadata} OR {content} THEN 'pending' WHEN {kept} THEN 'done' "
            "WHEN f.record_id IS NOT NULL THEN 'failed' ELSE 'outside' END"
        )
        reason = (
            f"CASE WHEN {metadata} THEN (CASE WHEN f.record_id IS NOT NULL AND f.retried THEN 'retried' "
            "WHEN r.record_id IS NULL AND f.record_id IS NULL THEN 'new' ELSE 'stale' END) "
            f"WHEN {content} THEN 'content' WHEN {kept} AND f.record_id IS NOT NULL THEN 'failed_redo' END"
        )
        return (
            f"SELECT {state} AS state, {reason} AS reason, f.failure_class, count(*) AS records, "
            f"min(s.{id_column}, {SHOWN_IDS}) AS first_ids "
            f"{self._joined(source_relation(self.spec), failure_class=True)} GROUP BY ALL"
        )

    def changed_count_sql(self) -> str:
        """How many of the variant's results were made from text that has changed since (``content``):
        a plain run redoes them, so they are pending, not stale. Of those, how many are stale for a job
        cause too (``job_stale``, and ``stale_<cause>`` per cause): what a stale count takes out."""
        spec, id_column = self.spec, quote(self.spec.source.id_column)
        conditions = stale_conditions("r")
        per_cause = "".join(f", ({sql}) AS stale_{cause}" for cause, sql in conditions.items())
        counts = "".join(f", count(*) FILTER (WHERE stale_{cause}) AS stale_{cause}" for cause in conditions)
        return (
            f"SELECT count(*) AS content, count(*) FILTER (WHERE job_stale) AS job_stale{counts} "
            f"FROM {source_relation(spec)} s JOIN (SELECT record_id, content_hash, "
            f"({' OR '.join(conditions.values())}) AS job_stale{per_cause} "
            f"FROM {quote(spec.output.results_table)} r WHERE variant = $variant "
            "AND content_hash IS NOT NULL AND content_fields = $content_fields) r "
            f"ON r.record_id = s.{id_column} "
            f"WHERE r.content_hash <> {content_hash_sql(spec.content_fields(), 's')}"
        )

    def any_stale_sql(self) -> str:
        """Whether any result of the variant is stale for a job cause: stops at the first, joins
        nothing, so the usual answer of a nightly run (none) costs one scan of small columns."""
        anything = " OR ".join(stale_conditions("r").values())
        return (
            f"SELECT 1 FROM {quote(self.spec.output.results_table)} r "
            f"WHERE r.variant = $variant AND ({anything}) LIMIT 1"
        )

    @property
    def has_content_phase(self) -> bool:
        return not self.selection.only_failed

    def longest_sql(self, top: int) -> str:
        """The id and prompt fields of the ``top`` pending records (of both phases) whose prompts are
        longest, by the UTF-8 bytes of the fields the template reads (as the budget's estimate counts
        them): where the records too long for a context are, found in one scan of the text. A blank
        record is not pending (a run never sends it), so it is never one of them."""
        spec, id_column = self.spec, quote(self.spec.source.id_column)
        phases = [self.ids_sql("metadata")] + ([self.ids_sql("content")] if self.has_content_phase else [])
        columns = ", ".join(f"s.{quote(name)}" for name in spec.source.fields)
        size = " + ".join(
            f"strlen(coalesce(CAST(s.{quote(name)} AS VARCHAR), ''))" for name in spec.content_fields()
        )
        return (
            f"SELECT s.{id_column}, {columns} FROM {source_relation(spec)} s "
            f"WHERE s.{id_column} IN ({' UNION ALL '.join(phases)}) "
            f"AND NOT {blank_condition(spec.content_fields(), 's')} "
            f"ORDER BY {size or '0'} DESC, s.{id_column} LIMIT {int(top)}"
        )

    def records_sql(self) -> str:
        """The id, prompt fields and content hash of the ids in ``$ids``, with what their failure says
        of their fit (:class:`~pipeline.source.reader.SourceRecord`'s fields, in order): a truncated
        one's last budget, and a too_long one's counts, when made by today's job from today's text."""
        spec, id_column = self.spec, quote(self.spec.source.id_column)
        columns = ", ".join(f"s.{quote(name)}" for name in spec.source.fields)
        content_hash = content_hash_sql(spec.content_fields(), "s")
        stale = " OR ".join(stale_conditions("f").values())
        current = (
            f"f.failure_class = '{FailureClass.TOO_LONG}' AND f.content_hash = {content_hash} "
            f"AND NOT ({stale})"
        )
        return (
            f"SELECT s.{id_column}, {columns}, {content_hash}, "
            f"CASE WHEN f.failure_class = '{FailureClass.TRUNCATED}' THEN f.last_max_tokens END, "
            f"CASE WHEN {current} THEN f.counted_prompt_tokens END, "
            f"CASE WHEN {current} THEN f.answer_cut_at END FROM {source_relation(spec)} s "
            f"LEFT JOIN {quote(spec.output.failures_table)} f ON f.variant = $variant "
            f"AND f.record_id = s.{id_column} "
            f"AND f.failure_class IN ('{FailureClass.TRUNCATED}', '{FailureClass.TOO_LONG}') "
            f"WHERE s.{id_column} IN (SELECT unnest($ids))"
        )


#: Which records a limited run takes first: the failures it retries (``--retry-failed --limit 50`` is
#: for them), then new records, then stale results it redoes. Without a limit there is no order to pay
#: for: every pending record is taken.
_FIRST_TAKEN = (
    "CASE WHEN f.record_id IS NOT NULL AND f.retried THEN 0 "
    "WHEN r.record_id IS NULL AND f.record_id IS NULL THEN 1 ELSE 2 END"
)


def pending_count(connection: Database, queries: PendingQueries) -> int:
    """The records a run of ``queries``' selection takes, its limit aside (of a plain run's: what
    ``status`` calls pending), counted as :meth:`PendingQueries.accounting_sql` counts them. Blocking."""
    rows = connection.rows(queries.accounting_sql(), queries.parameters())
    return sum(int(row[3]) for row in rows if row[0] == "pending")


def accounted_blank(rows: Iterable[Sequence[Any]], spec: JobSpec) -> BlankRecords:
    """The blank records of :meth:`PendingQueries.accounting_sql`'s rows: how many, the first ids."""
    found = BlankRecords(spec.content_fields())
    for state, _, _, count, first_ids in rows:
        if state == "blank":
            found = found.plus(BlankRecords(found.fields, int(count), tuple(first_ids or ())))
    return found


def read_blank(connection: Database, queries: PendingQueries) -> BlankRecords:
    """The records a run of ``queries``' selection would take but does not send, being blank, counted
    as ``status`` counts them (what ``pipeline check`` says). Blocking."""
    rows = connection.rows(queries.accounting_sql(), queries.parameters())
    return accounted_blank(rows, queries.spec)


def _any_of(conditions: dict[StaleCause, str], causes: Iterable[StaleCause]) -> str:
    chosen = [conditions[cause] for cause in JOB_CAUSES if cause in set(causes)]
    return "(" + " OR ".join(chosen) + ")" if chosen else "false"
