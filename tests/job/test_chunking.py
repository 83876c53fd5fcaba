"""The ``chunking:`` keys' other half: the merge strategies a schema declares, and which fit which field."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from pipeline.job.chunking import Merge, merge_strategies
from tests.support.schemas import Mentions


def test_defaults_union_lists_and_take_the_first_of_the_rest() -> None:
    assert merge_strategies(Mentions) == {
        "title": Merge.FIRST,
        "skills": Merge.UNION,
        "years": Merge.MAX,  # declared
        "tools": Merge.UNION,
    }


class Declared(BaseModel):
    model_config = ConfigDict(extra="forbid")

    a: list[str] = Field(json_schema_extra={"merge": "first"})
    b: str | None = Field(None, json_schema_extra={"merge": "most_common"})
    c: float | None = Field(None, json_schema_extra={"merge": "min"})


class Wrong(BaseModel):
    years: int | None = Field(None, json_schema_extra={"merge": "union"})


class Unknown(BaseModel):
    skills: list[str] = Field(json_schema_extra={"merge": "longest"})


def test_declared_strategies_must_fit_the_field() -> None:
    assert merge_strategies(Declared) == {"a": Merge.FIRST, "b": Merge.MOST_COMMON, "c": Merge.MIN}
    with pytest.raises(
        ValueError, match=r"^field 'years' \(number\) declares merge 'union', which does not "
    ):
        merge_strategies(Wrong)
    with pytest.raises(ValueError, match="use one of union, first$"):
        merge_strategies(Unknown)
