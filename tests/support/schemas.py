"""Small schemas for tests (the LinkedIn schema is tested on its own)."""

from __future__ import annotations

from collections.abc import Callable
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


# Schemas Pydantic validates with but cannot put into a JSON schema, which every request sends.


class WithCallback(BaseModel):
    """A function among the fields."""

    title: str
    normalise: Callable[[str], str] | None = None


class Handle:
    """A class Pydantic takes as it is (``arbitrary_types_allowed``) and cannot describe in JSON."""


class Contact(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    handle: Handle


class WithArbitraryType(BaseModel):
    """An arbitrary class, in a nested model of a list."""

    title: str
    contacts: list[Contact] = Field(default_factory=list)


class Node(BaseModel):
    """A tree whose children are fine and whose hook is not: the hook is the field at fault."""

    children: list[Node] = Field(default_factory=list)
    hook: Callable[[], None] | None = None
