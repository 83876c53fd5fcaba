"""Small schemas for the quality tests: one field of every kind, grounded marks, a tree.

(The LinkedIn schema is used as it is, as the realistic case.)
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, Field, JsonValue, StringConstraints

from pipeline.quality.fields import FieldSpec, schema_fields

GROUNDED: dict[str, JsonValue] = {"grounded": True}
Short = Annotated[str, StringConstraints(strip_whitespace=True, max_length=50)]


class Colour(Enum):
    RED = "red"
    GREEN = "green"


class Part(BaseModel):
    name: Short = Field(json_schema_extra=GROUNDED)
    kind: Literal["tool", "skill"]
    required: bool
    weight: float | None = None


class Pay(BaseModel):
    low: float | None = None
    high: float | None = None
    currency: str = "GBP"
    note: str | None = Field(None, json_schema_extra=GROUNDED)


class Posting(BaseModel):
    title: Short = Field(json_schema_extra=GROUNDED)
    company: str | None = Field(None, json_schema_extra=GROUNDED)
    level: Literal["junior", "senior"]
    colour: Colour | None = None
    remote: bool
    headcount: int | None = None
    skills: list[Short] = Field(default_factory=list, json_schema_extra=GROUNDED)
    tags: list[Literal["x", "y"]] = Field(default_factory=list)
    sizes: list[int] = Field(default_factory=list)
    parts: list[Part] = Field(default_factory=list)
    pay: Pay | None = None
    extra: dict[str, int] = Field(default_factory=dict)
    either: int | str | None = None


class Address(BaseModel):
    street: str
    town: str | None = None
    number: int | None = None
    lines: list[str] = Field(default_factory=list)


class Office(BaseModel):
    """A grounded mark on an object (and on a list of objects) grounds their text sub-fields."""

    address: Address | None = Field(None, json_schema_extra=GROUNDED)
    branches: list[Address] = Field(default_factory=list, json_schema_extra=GROUNDED)
    floors: int = Field(1, json_schema_extra=GROUNDED)  # a mark on any field is kept, whatever its kind


class Node(BaseModel):
    label: str
    children: list[Node] = Field(default_factory=list)


def posting_fields() -> tuple[FieldSpec, ...]:
    return schema_fields(Posting)


def by_name(specs: Sequence[FieldSpec]) -> dict[str, FieldSpec]:
    return {spec.name: spec for spec in specs}
