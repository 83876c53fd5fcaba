"""The columns of ``pipeline export --flatten``: one per schema field, so a spreadsheet needs no SQL.

Each column is a SQL expression over the stored ``extracted`` JSON, so DuckDB's COPY still writes the
file and no row passes through Python. The names are the schema's paths (:mod:`pipeline.quality.fields`):
a field of a nested object is a column of its own (``salary.minimum``), and a list of objects gives a
column per sub-field, each a list in the objects' order (``requirements[].text``,
``requirements[].mandatory``). Lists are arrays in Parquet and JSON lines and ``; ``-joined text in CSV
(an empty list and a null one are both an empty cell there). Types follow the schema: an ``int`` is
BIGINT, a ``float`` DOUBLE, a ``bool`` BOOLEAN, text and choices VARCHAR; anything else (a dict, a union
of several types) stays JSON (its text in CSV).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pipeline.quality.fields import FieldKind, FieldSpec
from pipeline.source.db import quote

CSV_LIST_SEPARATOR = "; "
_EXTRACTED = "r.extracted"


@dataclass(frozen=True, slots=True)
class _Leaf:
    name: str  # the column: the field's path
    json_path: str  # where its values are in the extracted JSON, e.g. $."requirements"[*]."text"
    kind: FieldKind  # a scalar kind, or OTHER
    integer: bool
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
        elif spec.kind is FieldKind.LIST:
            yield _Leaf(name, f"{at}[*]", spec.item_kind or FieldKind.OTHER, spec.integer, many=True)
        else:
            yield _Leaf(name, at, spec.kind, spec.integer, many)


def _sql_type(leaf: _Leaf) -> str:
    if leaf.kind is FieldKind.NUMBER:
        return "BIGINT" if leaf.integer else "DOUBLE"
    if leaf.kind is FieldKind.BOOLEAN:
        return "BOOLEAN"
    return "VARCHAR" if leaf.kind in (FieldKind.TEXT, FieldKind.CHOICE) else "JSON"


def _expression(leaf: _Leaf, csv: bool) -> str:
    sql_type, path = _sql_type(leaf), _text(leaf.json_path)
    if sql_type == "VARCHAR":  # unquoted text (a list path gives a VARCHAR[])
        value = f"json_extract_string({_EXTRACTED}, {path})"
    elif sql_type == "JSON":
        value = f"json_extract({_EXTRACTED}, {path})"
    else:
        value = f"CAST(json_extract({_EXTRACTED}, {path}) AS {sql_type}{'[]' if leaf.many else ''})"
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
