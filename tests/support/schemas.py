"""Small schemas for tests (the LinkedIn schema is tested on its own)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1)
    skills: list[str]
    years: int | None = Field(None, ge=0)
    low: int = 0
    high: int = 0

    @model_validator(mode="after")
    def _ordered(self) -> Item:
        if self.low > self.high:
            raise ValueError("low is larger than high")
        return self


NotAModel = dict


class Item2(Item):
    """Item with one more field: a schema edit."""

    seniority: str | None = None


class GroundedItem(Item):
    """Item whose skills are quoted from the posting: grounded after extraction."""

    skills: list[str] = Field(json_schema_extra={"grounded": True})


class Mentions(BaseModel):
    """What a long document mentions: a grounded title (the first), grounded skills (all of them), the
    most years asked for, and tools that are not grounded."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(None, json_schema_extra={"grounded": True})
    skills: list[str] = Field(default_factory=list, json_schema_extra={"grounded": True})
    years: int | None = Field(None, ge=0, json_schema_extra={"merge": "max"})
    tools: list[str] = Field(default_factory=list)


class MisdeclaredMerge(BaseModel):
    """A number that declares a list's merge."""

    years: int | None = Field(None, json_schema_extra={"merge": "union"})


class BoundedMentions(BaseModel):
    """Mentions with bounded lists and texts, for a small real model: constrained decoding closes the
    JSON within a few hundred tokens instead of looping to the budget."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(None, max_length=80, json_schema_extra={"grounded": True})
    skills: list[Annotated[str, StringConstraints(min_length=1, max_length=40)]] = Field(
        default_factory=list, max_length=30, json_schema_extra={"grounded": True}
    )


class ItemWithModel(Item):
    """Item with a field named like one of export's columns (``model``)."""

    model: str | None = None
