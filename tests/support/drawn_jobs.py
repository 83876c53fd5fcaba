"""Jobs and records drawn by Hypothesis: a schema as Python source, the rows of a load, in any format.

A drawn schema is a Pydantic model written as a module of its own (a user's schema is a file), each
field a construct users write: text, numbers, booleans, dates, choices, lists, tuples, optional
fields, a nested object and a list of them. Each field says the columns ``export --flatten`` gives it
and their types in Parquet, as the schema says them (None: not pinned, e.g. a tuple stays JSON).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import duckdb
import orjson
from hypothesis import strategies as st


@dataclass(frozen=True, slots=True)
class FieldKind:
    """A field's annotation (Python source) and its flattened columns: suffix -> Parquet type."""

    annotation: str
    columns: tuple[tuple[str, str | None], ...]
    required: bool = True


KINDS = (
    FieldKind("str", (("", "VARCHAR"),)),
    FieldKind("str | None", (("", "VARCHAR"),), required=False),
    FieldKind("int", (("", "BIGINT"),)),
    FieldKind("int | None", (("", "BIGINT"),), required=False),
    FieldKind("float", (("", "DOUBLE"),)),
    FieldKind("bool", (("", "BOOLEAN"),)),
    FieldKind("datetime.date", (("", "DATE"),)),
    FieldKind("datetime.date | None", (("", "DATE"),), required=False),
    FieldKind('Literal["junior", "mid", "senior"]', (("", "VARCHAR"),)),
    FieldKind("Level", (("", "VARCHAR"),)),
    FieldKind("list[str]", (("", "VARCHAR[]"),)),
    FieldKind("list[int]", (("", "BIGINT[]"),)),
    FieldKind("tuple[int, str]", (("", None),)),
    FieldKind("Part", ((".name", "VARCHAR"), (".years", "BIGINT"))),
    FieldKind("list[Part]", (("[].name", "VARCHAR[]"), ("[].years", "BIGINT[]"))),
)

_NAMES = ("skills", "seniority", "salary", "start", "remote", "title", "team", "hours", "tags", "parts")
_HEADER = '''"""A schema drawn by a property test."""

import datetime
from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field


class Level(Enum):
    LOW = "low"
    HIGH = "high"


class Part(BaseModel):
    name: str
    years: int | None = None


'''


@dataclass(frozen=True, slots=True)
class DrawnSchema:
    """A model class ``Record`` with these fields, in this order."""

    fields: tuple[tuple[str, FieldKind], ...]
    description: str = "What the record says."

    def source(self) -> str:
        lines = [f"class Record(BaseModel):\n    {orjson.dumps(self.description).decode()}\n"]
        for name, kind in self.fields:
            default = "" if kind.required else " = None"
            lines.append(f"    {name}: {kind.annotation}{default}\n")
        return _HEADER + "".join(lines)

    def flat_types(self) -> dict[str, str]:
        """The Parquet type of each flattened column the schema pins."""
        return {
            f"{name}{suffix}": sql_type
            for name, kind in self.fields
            for suffix, sql_type in kind.columns
            if sql_type is not None
        }

    def edited(self, kind: FieldKind) -> DrawnSchema:
        """The schema with one more field (or, when all names are taken, its first one retyped)."""
        taken = {name for name, _ in self.fields}
        free = [name for name in _NAMES if name not in taken]
        if free:
            return DrawnSchema((*self.fields, (free[0], kind)), self.description)
        (first, _), *rest = self.fields
        return DrawnSchema(((first, kind), *rest), self.description)


schemas = st.builds(
    DrawnSchema,
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=5).map(
        lambda kinds: tuple(zip(_NAMES, kinds, strict=False))
    ),
)

_modules = itertools.count()


def write_schema(folder: Path, schema: DrawnSchema) -> str:
    """``schema`` as a new module in ``folder``; its import path (``module:Record``). Each module has a
    name of its own: a process that ran a job keeps the modules it imported, so an edited schema is
    a new module, as a new process would read the edited file."""
    name = f"drawn_schema_{next(_modules)}"
    (folder / f"{name}.py").write_text(schema.source())
    return f"{name}:Record"


#: Text as records have it: any letter, digit, mark, symbol or space of Unicode, lines, and nothing
#: at all. Control characters and lone surrogates aside (no export holds them).
texts = st.text(
    st.characters(exclude_categories=("Cs", "Cc", "Co", "Cn")) | st.sampled_from("\n\t"), max_size=60
)


@dataclass(frozen=True, slots=True)
class Row:
    id: int
    title: str
    body: str

    @property
    def empty(self) -> bool:
        """Nothing to extract from: every prompt field empty or blank."""
        return not (self.title.strip() or self.body.strip())


FORMATS = ("csv", "jsonl", "parquet")


def write_rows(path: Path, rows: list[Row]) -> Path:
    """``rows`` as a file of ``path``'s format (by its suffix), as an export would write them."""
    as_dicts = [{"id": row.id, "title": row.title, "body": row.body} for row in rows]
    if path.suffix == ".jsonl":
        path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in as_dicts))
        return path
    with duckdb.connect() as connection:
        connection.execute("CREATE TABLE rows (id BIGINT, title VARCHAR, body VARCHAR)")
        connection.executemany("INSERT INTO rows VALUES (?, ?, ?)", [tuple(r.values()) for r in as_dicts])
        options = "(FORMAT parquet)" if path.suffix == ".parquet" else "(FORMAT csv, HEADER true)"
        connection.execute(f"COPY rows TO '{path}' {options}")
    return path


def long_text(tokens: int) -> str:
    """A body of about ``tokens`` tokens as the simulator counts them (four characters each) and at
    least as many by a tokenizer's floor (one a word)."""
    return "word " * ((tokens * 4) // 5)
