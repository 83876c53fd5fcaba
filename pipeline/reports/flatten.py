"""The columns of ``pipeline export --flatten``: one per schema field, so a spreadsheet needs no SQL.

Each column is a SQL expression over the stored ``extracted`` JSON, so DuckDB's COPY still writes the
file and no row passes through Python. The names are the schema's paths (:mod:`pipeline.quality.fields`):
a field of a nested object is a column of its own (``salary.minimum``), and a list of objects gives a
column per sub-field, each a list in the objects' order (``requirements[].text``,
``requirements[].mandatory``). Lists are arrays in Parquet and JSON lines and ``; ``-joined text in CSV
(an empty list and a null one are both an empty cell there). Types follow the schema, ``X | None`` as X
(null where the answer has none): an ``int`` is BIGINT, a ``float`` DOUBLE, a ``Decimal`` DECIMAL with
the schema's ``max_digits`` and ``decimal_places`` (DOUBLE without them), a ``bool`` BOOLEAN, a
``date`` DATE, a ``datetime`` TIMESTAMP (one with an offset in UTC), a ``time`` TIME, text VARCHAR, and
so is any other value Pydantic writes as a JSON string (a UUID, a URL, a duration); an enum or a
``Literal`` takes the type its values share; a list of any of these is a list of it. Anything else (a
dict, a union of several types) stays JSON (its text in CSV).
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import PydanticUserError, TypeAdapter

from pipeline.quality.fields import FieldKind, FieldSpec
from pipeline.source.db import quote

CSV_LIST_SEPARATOR = "; "
#: What the connection that runs the columns is set to: a datetime written with an offset becomes
#: TIMESTAMP in UTC, and one written without stays as written.
SESSION_SETTINGS = ("SET TimeZone = 'UTC'",)
_EXTRACTED = "r.extracted"
_DECIMAL_MOST_DIGITS = 38  # DuckDB's widest DECIMAL
# The JSON string formats with a SQL type of their own (Pydantic's: date, datetime, AwareDatetime,
# PastDate..., time); any other string is VARCHAR.
_TEXT_FORMATS = {"date": "DATE", "date-time": "TIMESTAMP", "time": "TIME"}
# Read from the JSON text (a date, a timestamp, a time is a JSON string) rather than cast from JSON.
_FROM_TEXT = frozenset({"VARCHAR", "DATE", "TIME", "TIMESTAMP"})


@dataclass(frozen=True, slots=True)
class _Leaf:
    name: str  # the column: the field's path
    json_path: str  # where its values are in the extracted JSON, e.g. $."requirements"[*]."text"
    sql_type: str  # of one value: BIGINT, DATE, VARCHAR...; JSON when the schema gives no one type
    many: bool  # a list (of scalars, or of a sub-field of a list of objects)


def flat_columns(specs: Sequence[FieldSpec], *, csv: bool) -> list[tuple[str, str]]:
    """``(column name, SQL expression over r.extracted)`` for every field of ``specs``, in schema order."""
    return [(leaf.name, _expression(leaf, csv)) for leaf in _leaves(specs, "", "$", many=False)]


def _leaves(specs: Sequence[FieldSpec], prefix: str, json_path: str, *, many: bool) -> Iterator[_Leaf]:
    for spec in specs:
        name, at = f"{prefix}{spec.name}", f'{json_path}."{spec.name}"'
        if spec.kind is FieldKind.OBJECT:
            yield from _leaves(spec.subfields, f"{name}.", at, many=many)
        elif spec.kind is FieldKind.OBJECT_LIST:
            yield from _leaves(spec.subfields, f"{name}[].", f"{at}[*]", many=True)
        elif spec.listed and (spec.kind is FieldKind.LIST or _sql_type(spec) != "JSON"):
            yield _Leaf(name, f"{at}[*]", _sql_type(spec), many=True)
        else:  # a scalar, or a list of what has no one type (lists of lists, of unions): JSON
            yield _Leaf(name, at, "JSON" if spec.listed else _sql_type(spec), many)


def _sql_type(spec: FieldSpec) -> str:
    """The SQL type of one of the field's values (of a list: of one item)."""
    kind = spec.item_kind if spec.kind is FieldKind.LIST else spec.kind
    if kind is FieldKind.NUMBER:
        return "BIGINT" if spec.integer else _decimal_type(spec)
    if kind is FieldKind.BOOLEAN:
        return "BOOLEAN"
    if kind is FieldKind.TEXT:
        return "VARCHAR"
    if kind is FieldKind.CHOICE:
        return _choice_type(spec.choices)
    if not isinstance(spec.value_type, type):  # Any, a union of several types, dict[...]
        return "JSON"
    written = _written_as(spec.value_type)
    if written.get("type") != "string":
        return "JSON"
    return _TEXT_FORMATS.get(str(written.get("format")), "VARCHAR")


def _decimal_type(spec: FieldSpec) -> str:
    """A Decimal's DECIMAL(width, scale) as the schema bounds it; DOUBLE for a float, or a Decimal
    with no ``decimal_places`` (DuckDB's DECIMAL needs a scale)."""
    is_decimal = isinstance(spec.value_type, type) and issubclass(spec.value_type, decimal.Decimal)
    most, places = spec.digits
    if not is_decimal or places is None or places > _DECIMAL_MOST_DIGITS:
        return "DOUBLE"
    width = min(max(most or _DECIMAL_MOST_DIGITS, places), _DECIMAL_MOST_DIGITS)
    return f"DECIMAL({width}, {places})"


def _choice_type(choices: Sequence[Any]) -> str:
    """The type every allowed value of an enum or a ``Literal`` shares (None aside), else JSON."""
    values = [value for value in choices if value is not None]
    if values and all(isinstance(value, bool) for value in values):
        return "BOOLEAN"
    if values and all(isinstance(value, str) for value in values):
        return "VARCHAR"
    numbers = [value for value in values if isinstance(value, int | float) and not isinstance(value, bool)]
    if values and len(numbers) == len(values):
        return "BIGINT" if all(isinstance(value, int) for value in numbers) else "DOUBLE"
    return "JSON"


@functools.cache
def _written_as(value_type: type) -> dict[str, Any]:
    """The JSON schema of a value of this type as Pydantic writes it (``{}`` if it has none)."""
    try:
        return TypeAdapter(value_type).json_schema(mode="serialization")
    except (PydanticUserError, TypeError, ValueError):  # e.g. an arbitrary class the model allows
        return {}


def _expression(leaf: _Leaf, csv: bool) -> str:
    sql_type, path, many = leaf.sql_type, _text(leaf.json_path), "[]" if leaf.many else ""
    if sql_type == "JSON":
        value = f"json_extract({_EXTRACTED}, {path})"
    elif sql_type == "VARCHAR":  # unquoted text (a list path gives a VARCHAR[])
        value = f"json_extract_string({_EXTRACTED}, {path})"
    elif sql_type == "TIMESTAMP":  # an offset, if written, is applied (the session is in UTC)
        text = f"json_extract_string({_EXTRACTED}, {path})"
        value = f"CAST(CAST({text} AS TIMESTAMPTZ{many}) AS TIMESTAMP{many})"
    elif sql_type in _FROM_TEXT:
        value = f"CAST(json_extract_string({_EXTRACTED}, {path}) AS {sql_type}{many})"
    else:
        value = f"CAST(json_extract({_EXTRACTED}, {path}) AS {sql_type}{many})"
    if not leaf.many:
        return f"CAST({value} AS VARCHAR)" if csv and sql_type == "JSON" else value
    # A wildcard over a null or missing list gives []: keep null apart from empty.
    container = _text(leaf.json_path.split("[*]", 1)[0])
    value = f"CASE WHEN json_type({_EXTRACTED}, {container}) = 'ARRAY' THEN {value} END"
    if not csv:
        return value
    # A null item keeps its place (an empty piece), so the sub-field columns of a list still line up.
    pieces = f"list_transform({value}, lambda item: coalesce(CAST(item AS VARCHAR), ''))"
    return f"array_to_string({pieces}, {_text(CSV_LIST_SEPARATOR)})"


def _text(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def select_list(columns: Sequence[tuple[str, str]]) -> str:
    """The columns as the items of a SELECT: ``expression AS "name"``."""
    return ", ".join(f"{sql} AS {quote(name)}" for name, sql in columns)
