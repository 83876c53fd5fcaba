"""Small schemas for tests (the LinkedIn schema is tested on its own)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
