"""``chunking:`` in a job: how a record whose long field does not fit is split, and extracted in passes.

::

    chunking:
      field: description        # the long field to split; the other fields go with every chunk
      max_chunk_tokens: auto    # or a number; auto fits the context with room for max_tokens
      overlap_tokens: 100
      passes: 1                 # more passes: each later pass asks again for what earlier ones missed

Only the keys are checked here (pure: the context is the server's, known when a run starts), and the
schema's ``merge`` strategies: their names and the field kinds each fits (:func:`merge_strategies`). How
each strategy merges is the document extractor's (:mod:`pipeline.extraction.merging`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from pipeline.errors import ConfigError
from pipeline.job.text import IDENTIFIER
from pipeline.quality.fields import FieldKind, schema_fields

AUTO: Literal["auto"] = "auto"
MIN_CHUNK_TOKENS = 64
MAX_CHUNK_TOKENS = 1_000_000
CHUNK_TOKENS_RULE = f"must be a number of tokens from {MIN_CHUNK_TOKENS} to {MAX_CHUNK_TOKENS:,}, or auto"
MAX_PASSES = 5
MERGE_KEY = "merge"  # Field(json_schema_extra={"merge": ...})


class Merge(StrEnum):
    """How a field's values from a long document's chunks become one (:mod:`pipeline.extraction.merging`)."""

    UNION = "union"
    FIRST = "first"
    MOST_COMMON = "most_common"
    MIN = "min"
    MAX = "max"


LIST_KINDS = frozenset({FieldKind.LIST, FieldKind.OBJECT_LIST})


def _chunk_tokens(value: object) -> int | str:
    """A chunk size in tokens, or ``auto``, in one message when it is neither."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(CHUNK_TOKENS_RULE)
    try:
        number = int(value)
    except ValueError:
        raise ValueError(CHUNK_TOKENS_RULE) from None
    if not MIN_CHUNK_TOKENS <= number <= MAX_CHUNK_TOKENS:
        raise ValueError(CHUNK_TOKENS_RULE)
    return number


ChunkTokens = Annotated[int | Literal["auto"], BeforeValidator(_chunk_tokens)]


class ChunkingSpec(BaseModel):
    """How a long record is split, and how many passes each chunk gets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field(pattern=IDENTIFIER.pattern, max_length=128)
    max_chunk_tokens: ChunkTokens = AUTO
    overlap_tokens: int = Field(default=100, ge=0, le=MAX_CHUNK_TOKENS)
    passes: int = Field(default=1, ge=1, le=MAX_PASSES)

    @model_validator(mode="after")
    def _overlap_below_half(self) -> ChunkingSpec:
        size = self.max_chunk_tokens
        if isinstance(size, int) and self.overlap_tokens * 2 > size:
            raise ValueError(
                f"overlap_tokens ({self.overlap_tokens}) must be at most half of max_chunk_tokens ({size})"
            )
        return self

    @property
    def auto(self) -> bool:
        return self.max_chunk_tokens == AUTO

    def settings(self) -> dict[str, object]:
        """What the chunking settings are, for the version key of the results they make."""
        return self.model_dump(mode="json")


def check_chunk_field(chunking: ChunkingSpec | None, template_fields: tuple[str, ...]) -> None:
    """The field to split must be one the prompt sends (the template reads it)."""
    if chunking is not None and chunking.field not in template_fields:
        raise ValueError(
            f"key 'chunking.field': {chunking.field!r} is not a field prompt.user sends "
            f"(it sends {', '.join(template_fields)})"
        )


def _fitting(kind: FieldKind) -> tuple[Merge, ...]:
    """The strategies that fit a field of ``kind``, its default first."""
    if kind in LIST_KINDS:
        return (Merge.UNION, Merge.FIRST)
    if kind is FieldKind.NUMBER:
        return (Merge.FIRST, Merge.MOST_COMMON, Merge.MIN, Merge.MAX)
    return (Merge.FIRST, Merge.MOST_COMMON)


def merge_strategies(schema: type[BaseModel]) -> dict[str, Merge]:
    """Each top-level field's strategy: the declared one, else the default of its kind. A strategy that
    is unknown or does not fit the field's kind is a ``ValueError`` naming the field."""
    strategies: dict[str, Merge] = {}
    for spec in schema_fields(schema):
        extra = schema.model_fields[spec.name].json_schema_extra
        declared = extra.get(MERGE_KEY) if isinstance(extra, dict) else None
        fitting = _fitting(spec.kind)
        if declared is None:
            strategies[spec.name] = fitting[0]
            continue
        if declared not in fitting:
            kind = "list" if spec.kind in LIST_KINDS else str(spec.kind)
            raise ValueError(
                f"field '{spec.name}' ({kind}) declares merge {declared!r}, which does not fit it; "
                f"use one of {', '.join(fitting)}"
            )
        strategies[spec.name] = Merge(str(declared))
    return strategies


def checked_merges(schema: type[BaseModel], where: str) -> None:
    """Every field's ``merge`` strategy fits its kind (:func:`merge_strategies`), or a
    :class:`ConfigError` at ``where`` (the file and key)."""
    try:
        merge_strategies(schema)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None
