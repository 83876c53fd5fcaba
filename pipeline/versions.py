"""The version key of a result: the hashes of everything that produced it, kept part by part.

A result is *current* when every part equals what the job would send today; otherwise it is *stale*,
and the parts that differ say why:

* ``content``: the record's prompt fields changed in the source (the answer is about text that no
  longer exists). A plain run redoes these.
* ``prompt``: the system prompt, the user template, the examples, whether the schema is included, or
  the set of fields the template reads.
* ``schema``: the Pydantic schema (its JSON schema).
* ``model``: the model name.
* ``settings``: what shapes the answer besides the prompt: ``max_tokens``, ``temperature``,
  ``reasoning_effort``, ``extra_body``, structured output on or off. Concurrency, timeouts, retry
  budgets and table names are not part of it.
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
from typing import Any

import orjson

from pipeline.db import quote
from pipeline.errors import ConfigError


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


@dataclass(frozen=True, slots=True)
class JobVersion:
    """The job's half of every result's version key (the record's content is the other half)."""

    prompt_hash: str
    schema_hash: str
    model: str
    settings_hash: str
    content_fields: str  # the fields the template reads, comma-separated, in template order

    @property
    def job_hash(self) -> str:
        return digest([self.prompt_hash, self.schema_hash, self.model, self.settings_hash])

    def parameters(self) -> dict[str, str]:
        """The named SQL parameters the staleness conditions compare against."""
        return {
            "prompt_hash": self.prompt_hash,
            "schema_hash": self.schema_hash,
            "model": self.model,
            "settings_hash": self.settings_hash,
            "content_fields": self.content_fields,
        }


def make_version(
    *,
    prompt: dict[str, Any],
    json_schema: dict[str, Any],
    model: str,
    settings: dict[str, Any],
    content_fields: Sequence[str],
) -> JobVersion:
    return JobVersion(
        prompt_hash=digest(prompt),
        schema_hash=digest(json_schema),
        model=model,
        settings_hash=digest(settings),
        content_fields=",".join(content_fields),
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
        StaleCause.MODEL: f"({versioned} AND {alias}.model IS DISTINCT FROM $model)",
        StaleCause.SETTINGS: f"({versioned} AND {alias}.settings_hash IS DISTINCT FROM $settings_hash)",
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
