"""Reading a job's results, failures and record texts for the quality reports: read-only, and filtered
in SQL, so that only the records a report is about reach Python.

Which records a query reads is a :class:`Scope`: a SQL condition on an id column, with its named
parameters. Scopes combine with :meth:`Scope.all_of`: the ids of a gold file, a seeded sample of the
source (:func:`pipeline.source.pending.sample_sql`, the one definition of ``--sample``), the records every
variant extracted, or attempted (a result or a failure each), or that any variant attempted.

Every id that reaches Python is keyed by :func:`~pipeline.quality.agreement.record_key`, as gold files
are: the gold id ``"42"`` is record ``42``. Stored grounding is read as
:class:`~pipeline.quality.grounding.GroundedValue` (:func:`~pipeline.quality.grounding.grounding_from_json`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.errors import ConfigError
from pipeline.extraction.prompt import as_sent
from pipeline.job.spec import JobSpec
from pipeline.quality.agreement import record_key
from pipeline.quality.grounding import GroundedValue, grounding_from_json
from pipeline.source.db import Database, quote
from pipeline.source.pending import sample_sql
from pipeline.source.relation import source_relation
from pipeline.store.opening import open_job_output
from pipeline.store.read_copy import read_copy_of


@dataclass(frozen=True, slots=True)
class Sample:
    """``--sample N --seed S``: the N source records with the smallest seeded hash of their id."""

    size: int
    seed: int = 0

    def describe(self) -> str:
        return f"sample of {self.size:,} source records (seed {self.seed})"


@dataclass(frozen=True, slots=True)
class Scope:
    """Which records a query reads: ``condition(id_column)`` is SQL using ``parameters`` (``$name``)."""

    condition: Callable[[str], str]
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def where(self, column: str) -> str:
        return self.condition(column)

    @staticmethod
    def all_of(*scopes: Scope) -> Scope:
        """The records in every one of ``scopes`` (their parameters must not clash)."""
        parameters: dict[str, Any] = {}
        for scope in scopes:
            for name, value in scope.parameters.items():
                if name in parameters and parameters[name] != value:
                    raise ValueError(f"scopes give parameter ${name} two values")
                parameters[name] = value
        return Scope(
            lambda column: " AND ".join(f"({s.where(column)})" for s in scopes) or "true", parameters
        )


EVERY_RECORD = Scope(lambda column: "true")


def sample_scope(spec: JobSpec, sample: Sample | None) -> Scope:
    """The records of ``sample`` (every record when it is None)."""
    if sample is None:
        return EVERY_RECORD
    ids = sample_sql(spec)
    return Scope(lambda column: f"{column} IN ({ids})", {"seed": sample.seed, "sample": sample.size})


def keys_scope(keys: Collection[str]) -> Scope:
    """The records whose :func:`record_key` is one of ``keys``, whatever the id column's type.

    The id as text is compared with the keys; an integer key also matches a float id (DuckDB writes
    ``42.0``). The caller keeps only exact keys (a text id ``"42.0"`` read here is another record)."""
    texts = sorted({*keys, *(f"{key}.0" for key in keys if _is_integer(key))})
    return Scope(
        lambda column: f"trim(CAST({column} AS VARCHAR)) IN (SELECT unnest($record_keys))",
        {"record_keys": texts},
    )


def _is_integer(text: str) -> bool:
    return text.lstrip("+-").isdigit()


@dataclass(frozen=True, slots=True)
class StoredResult:
    record_id: str  # record_key of the stored id
    extracted: dict[str, Any]
    model: str | None
    # Over every attempt (a result from before totals were kept counts its last attempt).
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    latency_s: float
    grounding: tuple[GroundedValue, ...] | None  # None: stored without grounding
    chunks: int | None = None  # merged from this many chunks of a long record (None: sent whole)


@dataclass(frozen=True, slots=True)
class StoredFailure:
    record_id: str
    failure_class: str
    message: str
    model: str | None


class JobOutput:
    """A job's output tables and source, open read-only (see :func:`open_output`)."""

    def __init__(self, connection: Database, spec: JobSpec) -> None:
        self.connection = connection
        self.spec = spec
        # A run holds the database: this reads its read copy (how old it is, and which run).
        self.read_copy = read_copy_of(connection)
        self.results_table = quote(spec.output.results_table)
        self.failures_table = quote(spec.output.failures_table)

    def _rows(self, sql: str, parameters: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return self.connection.rows(sql, parameters)

    def variants_with_results(self) -> list[str]:
        rows = self._rows(f"SELECT DISTINCT variant FROM {self.results_table} ORDER BY 1", {})
        return [str(row[0]) for row in rows]

    def require_results(self, variant: str, *, or_failures: bool = False) -> None:
        """A :class:`ConfigError` unless ``variant`` has a result (or, with ``or_failures``, a failure)."""
        tables = [self.results_table, *([self.failures_table] if or_failures else [])]
        for table in tables:
            if self._rows(f"SELECT 1 FROM {table} WHERE variant = $variant LIMIT 1", {"variant": variant}):
                return
        known = self.variants_with_results()
        what = "results or failures" if or_failures else "results"
        shown = f" (variants with results: {', '.join(known)})" if known else " (no variant has any yet)"
        raise ConfigError(f"{self.spec.database}: variant {variant!r} has no {what}{shown}")

    def extracted_by_all(self, variants: Sequence[str]) -> Scope:
        """The records every one of ``variants`` has a result for."""
        sql = (
            f"SELECT record_id FROM {self.results_table} WHERE variant IN (SELECT unnest($extracted_by)) "
            "GROUP BY record_id HAVING count(DISTINCT variant) = $extracted_count"
        )
        parameters = {"extracted_by": list(variants), "extracted_count": len(set(variants))}
        return Scope(lambda column: f"{column} IN ({sql})", parameters)

    def _attempted(self, parameter: str) -> str:
        return " UNION ALL ".join(
            f"SELECT variant, record_id FROM {table} WHERE variant IN (SELECT unnest(${parameter}))"
            for table in (self.results_table, self.failures_table)
        )

    def attempted_by_all(self, variants: Sequence[str]) -> Scope:
        """The records every one of ``variants`` has a result or a failure for."""
        sql = (
            f"SELECT record_id FROM ({self._attempted('attempted_by')}) "
            "GROUP BY record_id HAVING count(DISTINCT variant) = $attempted_count"
        )
        parameters = {"attempted_by": list(variants), "attempted_count": len(set(variants))}
        return Scope(lambda column: f"{column} IN ({sql})", parameters)

    def attempted_by_any(self, variants: Sequence[str]) -> Scope:
        """The records some one of ``variants`` has a result or a failure for."""
        sql = f"SELECT record_id FROM ({self._attempted('attempted_by_any')})"
        return Scope(lambda column: f"{column} IN ({sql})", {"attempted_by_any": list(variants)})

    def count_attempted(self, variants: Sequence[str], scope: Scope) -> int:
        """How many records of ``scope`` some one of ``variants`` has a result or a failure for."""
        sql = (
            f"SELECT count(DISTINCT record_id) FROM ({self._attempted('counted_variants')}) "
            f"WHERE {scope.where('record_id')}"
        )
        rows = self._rows(sql, {**scope.parameters, "counted_variants": list(variants)})
        return int(rows[0][0])

    def results(self, variants: Sequence[str], scope: Scope) -> dict[str, dict[str, StoredResult]]:
        """variant -> record key -> result, for the records of ``scope``."""
        sql = (
            "SELECT variant, record_id, extracted, model, coalesce(total_prompt_tokens, prompt_tokens), "
            "coalesce(total_completion_tokens, completion_tokens), "
            "coalesce(total_reasoning_tokens, reasoning_tokens), coalesce(total_latency_s, latency_s), "
            f"grounding, CAST(chunks->>'chunks' AS INTEGER) FROM {self.results_table} "
            f"WHERE variant IN (SELECT unnest($variants)) AND {scope.where('record_id')}"
        )
        found: dict[str, dict[str, StoredResult]] = {name: {} for name in variants}
        for (
            variant,
            record_id,
            extracted,
            model,
            prompt,
            completion,
            reasoning,
            latency,
            grounding,
            chunks,
        ) in self._rows(sql, {**scope.parameters, "variants": list(variants)}):
            key = record_key(record_id)
            found[str(variant)][key] = StoredResult(
                record_id=key,
                extracted=_json_object(extracted),
                model=model,
                prompt_tokens=int(prompt or 0),
                completion_tokens=int(completion or 0),
                reasoning_tokens=int(reasoning or 0),
                latency_s=float(latency or 0.0),
                grounding=grounding_from_json(grounding),
                chunks=chunks,
            )
        return found

    def failures(self, variants: Sequence[str], scope: Scope) -> dict[str, dict[str, StoredFailure]]:
        """variant -> record key -> failure, for the records of ``scope``."""
        sql = (
            f"SELECT variant, record_id, failure_class, message, model FROM {self.failures_table} "
            f"WHERE variant IN (SELECT unnest($variants)) AND {scope.where('record_id')}"
        )
        found: dict[str, dict[str, StoredFailure]] = {name: {} for name in variants}
        for variant, record_id, failure_class, message, model in self._rows(
            sql, {**scope.parameters, "variants": list(variants)}
        ):
            key = record_key(record_id)
            found[str(variant)][key] = StoredFailure(key, str(failure_class), message or "", model)
        return found

    def texts(self, scope: Scope, fields: Sequence[str] | None = None) -> dict[str, dict[str, str]]:
        """record key -> the record's prompt ``fields`` as sent (default: those the job's template
        reads, in its order), for the source records of ``scope``."""
        spec = self.spec
        fields = tuple(fields) if fields is not None else spec.content_fields()
        id_column = f"s.{quote(spec.source.id_column)}"
        columns = ", ".join([id_column, *(f"s.{quote(name)}" for name in fields)])
        sql = f"SELECT {columns} FROM {source_relation(spec)} s WHERE {scope.where(id_column)}"
        return {
            record_key(row[0]): {name: as_sent(value) for name, value in zip(fields, row[1:], strict=True)}
            for row in self._rows(sql, scope.parameters)
        }

    def source_keys(self, scope: Scope) -> set[str]:
        """The keys of the source records in ``scope``."""
        id_column = f"s.{quote(self.spec.source.id_column)}"
        sql = f"SELECT {id_column} FROM {source_relation(self.spec)} s WHERE {scope.where(id_column)}"
        return {record_key(row[0]) for row in self._rows(sql, scope.parameters)}


@contextmanager
def open_output(spec: JobSpec) -> Iterator[JobOutput]:
    """The job's database, read-only, for the length of the block.

    Raises :class:`ConfigError` (no database or no output tables yet) or ``DatabaseLockedError``
    (a run holds the database)."""
    connection = open_job_output(spec, [spec.output.results_table, spec.output.failures_table])
    try:
        yield JobOutput(connection, spec)
    finally:
        connection.close()


def _json_object(text: Any) -> dict[str, Any]:
    value = orjson.loads(text) if isinstance(text, str | bytes) else text
    return value if isinstance(value, dict) else {}
