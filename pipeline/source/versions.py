"""The version key of a result: the hashes of everything that produced it, kept part by part.

A result is *current* when every part equals what the job would send today; otherwise it is *stale*,
and the parts that differ say why:

* ``content``: the record's prompt fields changed in the source (the answer is about text that no
  longer exists). A plain run redoes these.
* ``prompt``: the system prompt, the user template, the examples, whether the schema is included, or
  the set of fields the template reads.
* ``schema``: the Pydantic schema (its JSON schema).
* ``model``: the model name: a result is current when the job's model made it, or the model an
  endpoint of the job serves instead (``endpoints[].model``).
* ``settings``: what shapes the answer besides the prompt: ``max_tokens``, ``temperature``,
  ``reasoning_effort``, ``extra_body``, structured output on or off, and for a result merged from a
  long record's chunks the ``chunking:`` settings too (a record sent whole keeps the key it had without
  them, so turning chunking on makes no short record stale). Concurrency, timeouts, retry budgets and
  table names are not part of it.
* ``unknown``: the result has no version key (written before results carried one).

Only ``content`` needs the source text. It is hashed inside DuckDB (``content_hash_sql``), both when a
record is fetched for a request and when pending records are looked for, so the comparison never
moves record text into Python. md5 is used because it is stable across DuckDB versions (DuckDB's own
``hash()`` is not), and an upgrade must not make a whole backlog look edited. Its lower 64 bits are
kept, as an unsigned integer: comparing 10^6 of them fits DuckDB's memory limit beside the text being
hashed (hex strings did not), and a missed edit would take a 2^-64 coincidence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import orjson

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.source.db import Database, quote
from pipeline.source.relation import source_relation


class StaleCause(StrEnum):
    CONTENT = "content"
    PROMPT = "prompt"
    SCHEMA = "schema"
    MODEL = "model"
    SETTINGS = "settings"
    UNKNOWN = "unknown"


#: The causes that come from the job, not the data: a plain run reports them and --redo-stale redoes them.
JOB_CAUSES: tuple[StaleCause, ...] = (
    StaleCause.PROMPT,
    StaleCause.SCHEMA,
    StaleCause.MODEL,
    StaleCause.SETTINGS,
    StaleCause.UNKNOWN,
)


def digest(value: object) -> str:
    """A short, stable hash of a JSON-able value (keys sorted)."""
    # 12 hex digits: DuckDB stores strings up to 12 bytes inline, which keeps joins over them small.
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]


#: The version key's columns in the results and failures tables, in the order the writer fills them
#: (:meth:`JobVersion.key_values`).
VERSION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("content_hash", "UBIGINT"),
    ("content_fields", "VARCHAR"),
    ("prompt_hash", "VARCHAR"),
    ("schema_hash", "VARCHAR"),
    ("model", "VARCHAR"),
    ("settings_hash", "VARCHAR"),
)


@dataclass(frozen=True, slots=True)
class JobVersion:
    """The job's half of every result's version key (the record's content is the other half)."""

    prompt_hash: str
    schema_hash: str
    model: str
    settings_hash: str
    content_fields: str  # the fields the template reads, comma-separated, in template order
    # The models some endpoints serve instead of the job's (``endpoints[].model``): what they make is
    # as current as what the job's model makes.
    endpoint_models: tuple[str, ...] = ()
    # The settings with the ``chunking:`` settings, for what is made from chunks; None without them.
    chunked_settings_hash: str | None = None

    @property
    def models(self) -> tuple[str, ...]:
        """Every model a current result may have been made by: the job's first."""
        return tuple(dict.fromkeys((self.model, *self.endpoint_models)))

    @property
    def job_hash(self) -> str:
        parts: list[object] = [self.prompt_hash, self.schema_hash, self.model, self.settings_hash]
        # Only when there are some: the hash of every job without them stays what it was.
        if self.endpoint_models:
            parts.append(sorted(self.models))
        if self.chunked_settings_hash is not None:
            parts.append(self.chunked_settings_hash)
        return digest(parts)

    def key_values(
        self, content_hash: int | None, model: str | None = None, *, chunked: bool = False
    ) -> list[object]:
        """A stored row's version key, in :data:`VERSION_COLUMNS` order. ``model``: the one that
        answered (an endpoint may serve its own), when it is not the job's; ``chunked``: made from a
        long record's chunks (its settings hash holds the chunking settings)."""
        return [
            content_hash,
            self.content_fields,
            self.prompt_hash,
            self.schema_hash,
            model or self.model,
            self.chunked_settings_hash if chunked and self.chunked_settings_hash else self.settings_hash,
        ]

    def parameters(self) -> dict[str, str | list[str]]:
        """The named SQL parameters the staleness conditions compare against."""
        return {
            "prompt_hash": self.prompt_hash,
            "schema_hash": self.schema_hash,
            "models": list(self.models),
            "settings_hash": self.settings_hash,
            # Without chunking the same hash again, so the condition is exactly what it was.
            "chunked_settings_hash": self.chunked_settings_hash or self.settings_hash,
            "content_fields": self.content_fields,
        }


def version_of(spec: JobSpec) -> JobVersion:
    """The job's half of the key: everything that changes what a result means; not concurrency,
    timeouts or table names. It hashes the schema, so a run computes it once (its context does)."""
    prompt = spec.prompt
    settings = {
        "max_tokens": spec.max_tokens,
        "reasoning_effort": spec.reasoning_effort,
        "temperature": spec.temperature,
        "structured_output": spec.endpoint.structured_output,
        "extra_body": spec.extra_body,
    }
    chunking = spec.chunking
    return JobVersion(
        prompt_hash=digest(
            {
                "system": prompt.system,
                "user": prompt.user,
                "include_schema": prompt.include_schema,
                "examples": [example.model_dump(mode="json") for example in prompt.examples],
            }
        ),
        schema_hash=digest(spec.schema_class.model_json_schema()),
        model=spec.model,
        endpoint_models=tuple(
            config.model for config in spec.endpoint_configs() if config.model != spec.model
        ),
        settings_hash=digest(settings),
        chunked_settings_hash=(
            None if chunking is None else digest({**settings, "chunking": chunking.settings()})
        ),
        content_fields=",".join(spec.content_fields()),
    )


def content_hash_sql(fields: Sequence[str], alias: str = "s") -> str:
    """SQL for the hash of a record's prompt fields as sent (NULL is sent as an empty string).

    Each value is prefixed with its length in bytes, so no text can shift into the next field.
    """
    parts = []
    for name in fields:
        value = f"coalesce(CAST({alias}.{quote(name)} AS VARCHAR), '')"
        parts.append(f"CAST(strlen({value}) AS VARCHAR), ':', {value}")
    return f"md5_number_lower(concat({', '.join(parts)}))"


def stale_conditions(alias: str) -> dict[StaleCause, str]:
    """For each job cause, the SQL condition that a results/failures row ``alias`` is stale for it.

    Rows without a version key are ``unknown`` and nothing else: their old hashes mean nothing today.
    The parameters are :meth:`JobVersion.parameters`.
    """
    versioned = f"{alias}.content_hash IS NOT NULL"
    return {
        StaleCause.PROMPT: f"({versioned} AND ({alias}.prompt_hash IS DISTINCT FROM $prompt_hash "
        f"OR {alias}.content_fields IS DISTINCT FROM $content_fields))",
        StaleCause.SCHEMA: f"({versioned} AND {alias}.schema_hash IS DISTINCT FROM $schema_hash)",
        StaleCause.MODEL: f"({versioned} AND NOT coalesce(list_contains($models, {alias}.model), false))",
        StaleCause.SETTINGS: f"({versioned} AND {alias}.settings_hash IS DISTINCT FROM $settings_hash "
        f"AND {alias}.settings_hash IS DISTINCT FROM $chunked_settings_hash)",
        StaleCause.UNKNOWN: f"({alias}.content_hash IS NULL)",
    }


def parse_causes(values: Sequence[str], where: str) -> frozenset[StaleCause]:
    """``prompt,schema`` (commas or repeated) as job causes; empty means all of them."""
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    allowed = [str(cause) for cause in JOB_CAUSES]
    for name in names:
        if name not in allowed:
            hint = " (content changes are always redone)" if name == StaleCause.CONTENT else ""
            raise ConfigError(f"{where} {name!r}: not a cause to redo{hint}; use {', '.join(allowed)}")
    return frozenset(StaleCause(name) for name in names) or frozenset(JOB_CAUSES)


def stale_counts_sql(spec: JobSpec) -> str:
    """Counts over the variant's results: total, orphaned (id no longer in the source), stale for a
    job cause, and per job cause. No record text is read (content: the pending queries' own count)."""
    id_column = quote(spec.source.id_column)
    conditions = stale_conditions("r")
    in_source = f"s.{id_column} IS NOT NULL"
    counts = [
        f"count(*) FILTER (WHERE {in_source} AND {sql}) AS {cause}" for cause, sql in conditions.items()
    ]
    anything = " OR ".join(conditions.values())
    return (
        f"SELECT count(*) AS results, count(*) FILTER (WHERE NOT {in_source}) AS orphaned, "
        f"count(*) FILTER (WHERE {in_source} AND ({anything})) AS stale, {', '.join(counts)} "
        f"FROM {quote(spec.output.results_table)} r "
        f"LEFT JOIN (SELECT {id_column} FROM {source_relation(spec)}) s ON s.{id_column} = r.record_id "
        "WHERE r.variant = $variant"
    )


def read_stale_counts(connection: Database, spec: JobSpec, version: JobVersion) -> dict[str, int]:
    """The variant's results counted as :func:`stale_counts_sql` does: ``results``, ``orphaned``,
    ``stale`` and one count per job cause, every one present. Blocking."""
    return connection.counts(stale_counts_sql(spec), {**version.parameters(), "variant": spec.variant})


def stale_models_sql(spec: JobSpec) -> str:
    """The variant's results of records still in the source that are stale for the model: how many each
    model that is not the job's made, most first."""
    id_column = quote(spec.source.id_column)
    return (
        f"SELECT r.model, count(*) FROM {quote(spec.output.results_table)} r "
        f"WHERE r.variant = $variant AND {stale_conditions('r')[StaleCause.MODEL]} "
        f"AND r.record_id IN (SELECT {id_column} FROM {source_relation(spec)}) "
        "GROUP BY ALL ORDER BY 2 DESC, 1"
    )


def read_stale_models(connection: Database, spec: JobSpec, version: JobVersion) -> dict[str, int]:
    """Which models made the results that are stale for the model, and how many each (see
    :func:`stale_models_sql`): what a status shows beside the job's own models. Blocking."""
    rows = connection.rows(stale_models_sql(spec), {**version.parameters(), "variant": spec.variant})
    return {str(model): int(count) for model, count in rows}
