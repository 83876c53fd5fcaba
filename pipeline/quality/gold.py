"""Reading a gold file: the extractions a person (or a public data set) says are right, for some
records and some fields, keyed like the job's records.

Formats, by extension:

* ``.jsonl`` / ``.ndjson``: one JSON object per line (blank lines are skipped);
* ``.json``: one JSON list of objects (both read by :mod:`pipeline.quality.json_files`);
* ``.csv``: a header row, then one record per row. Cells are stripped; an empty cell means "not given"
  for that record. Numbers and booleans (true/false, yes/no, 1/0) are parsed for fields of those
  kinds. A list is a JSON array (``["SQL", "Excel"]``) or ``;``-separated values (``SQL; Excel``);
  lists of objects and objects are JSON.

The id is under ``id_column``, else under ``id``. Every other key or column must be a field of the
schema. Gold records may be partial, so they are not validated against the schema, except that a list
field must hold a list (of objects, for a list of objects) and an object field an object or null.
A field left out is unknown for that record: not scored. A JSON record may also list values known to be
wrong where nothing right is known (what ``pipeline judge --export-gold`` writes for a value judged
wrong), under :data:`~pipeline.quality.judgments.JUDGED_WRONG`: ``{"_judged_wrong": {"recruiter":
["Hays"], "salary.minimum": [35000]}}``, each a judged field path and a list; an answer giving one of
them is scored wrong, any other answer there not scored (:mod:`pipeline.quality.agreement`).
Every problem is a :class:`~pipeline.errors.ConfigError` naming the file and the line (or item).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from pipeline.errors import ConfigError
from pipeline.quality.agreement import record_key
from pipeline.quality.fields import FieldKind, FieldSpec, did_you_mean, schema_fields, top_field
from pipeline.quality.json_files import read_json_objects, read_text
from pipeline.quality.judgments import JUDGED_WRONG, judged_paths

SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv")
TRUE_WORDS = frozenset({"true", "yes", "1"})
FALSE_WORDS = frozenset({"false", "no", "0"})
_INTEGER = re.compile(r"[+-]?\d+")
GOLD_FILE = "the gold file"  # as an error that cannot read it says


@dataclass(frozen=True, slots=True)
class Gold:
    path: Path
    records: dict[str, dict[str, Any]]  # record_key(id) -> the fields it gives (without the id)
    fields: tuple[str, ...]  # the schema fields some record gives, in schema order


Row = tuple[str, dict[str, Any]]  # (where in the file, e.g. "line 3"; the raw row)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _csv_rows(path: Path, text: str) -> Iterator[Row]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    if not header:
        raise ConfigError(f"{path}: no header row")
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ConfigError(f"{path}: column {repeated[0]!r} appears twice in the header")
    for row in reader:
        if None in row:
            raise ConfigError(f"{path}: line {reader.line_num}: more cells than the header has columns")
        cells = {name: cell.strip() for name, cell in row.items() if cell is not None and cell.strip()}
        yield f"line {reader.line_num}", cells


def _id_key(row: Mapping[str, Any], id_column: str) -> str | None:
    """The key the id is under in ``row``: ``id_column``, else ``id``."""
    return next((key for key in (id_column, "id") if key in row), None)


def _check_columns(path: Path, columns: list[str], id_key: str, specs: Mapping[str, FieldSpec]) -> None:
    for name in columns:
        if name != id_key and name not in specs:
            raise ConfigError(
                f"{path}: column {name!r} is not a schema field{did_you_mean(name, [*specs, id_key])}"
            )


def _parse_scalar(spec_kind: FieldKind | None, choices: tuple[Any, ...], cell: str) -> Any:
    """A CSV cell as a value of this kind; raises ValueError saying what was expected."""
    if spec_kind is FieldKind.NUMBER:
        try:
            return int(cell) if _INTEGER.fullmatch(cell) else float(cell)
        except ValueError:
            raise ValueError(f"{cell!r} is not a number") from None
    if spec_kind is FieldKind.BOOLEAN:
        word = cell.casefold()
        if word not in TRUE_WORDS | FALSE_WORDS:
            raise ValueError(f"{cell!r} is not a boolean (true/false, yes/no, 1/0)")
        return word in TRUE_WORDS
    # A choice that is not a string (Literal[1, 2]) is written as text in CSV.
    return next((choice for choice in choices if not isinstance(choice, str) and str(choice) == cell), cell)


def _parse_cell(spec: FieldSpec, cell: str) -> Any:
    """A CSV cell as the value of a field; raises ValueError saying what is wrong."""
    if spec.kind in (FieldKind.OBJECT, FieldKind.OBJECT_LIST, FieldKind.OTHER) or (
        spec.kind is FieldKind.LIST and cell.startswith("[")
    ):
        try:
            return orjson.loads(cell)
        except orjson.JSONDecodeError as error:
            if spec.kind is FieldKind.OTHER:
                return cell
            raise ValueError(f"invalid JSON ({error.msg})") from None
    if spec.kind is FieldKind.LIST:
        items = [item.strip() for item in cell.split(";")]
        return [_parse_scalar(spec.item_kind, spec.choices, item) for item in items if item]
    return _parse_scalar(spec.kind, spec.choices, cell)


def _shape_problem(spec: FieldSpec, value: Any) -> str | None:
    """What is wrong with the shape of a gold value, if anything."""
    if spec.kind is FieldKind.LIST and not isinstance(value, list):
        return f"must be a list, got {_type_name(value)}"
    if spec.kind is FieldKind.OBJECT_LIST and not (
        isinstance(value, list) and all(isinstance(item, dict) for item in value)
    ):
        return f"must be a list of objects, got {_type_name(value)}"
    if spec.kind is FieldKind.OBJECT and not (value is None or isinstance(value, dict)):
        return f"must be an object or null, got {_type_name(value)}"
    return None


def _record_id(path: Path, where: str, row: Mapping[str, Any], id_key: str | None, id_column: str) -> str:
    raw = row.get(id_key) if id_key is not None else None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        expected = repr(id_column) if id_column == "id" else f"{id_column!r} or 'id'"
        raise ConfigError(f"{path}: {where}: no id (expected {expected})")
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ConfigError(f"{path}: {where}: the id must be a string or a number, got {_type_name(raw)}")
    return record_key(raw)


def _gold_fields(
    path: Path,
    where: str,
    row: Mapping[str, Any],
    id_key: str | None,
    specs: Mapping[str, FieldSpec],
    csv_cells: bool,
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, raw in row.items():
        if name == id_key:
            continue
        if name == JUDGED_WRONG and not csv_cells:
            fields[name] = _judged_wrong(f"{path}: {where}", raw, specs)
            continue
        spec = specs.get(name)
        if spec is None:
            hint = did_you_mean(name, specs)
            raise ConfigError(f"{path}: {where}: field {name!r} is not a schema field{hint}")
        try:
            value = _parse_cell(spec, raw) if csv_cells else raw
        except ValueError as error:
            raise ConfigError(f"{path}: {where}: column {name!r}: {error}") from None
        problem = _shape_problem(spec, value)
        if problem is not None:
            raise ConfigError(f"{path}: {where}: field {name!r} {problem}")
        fields[name] = value
    return fields


def _judged_wrong(where: str, raw: Any, specs: Mapping[str, FieldSpec]) -> dict[str, list[Any]]:
    """The values a record knows are wrong, per judged path: checked to be that."""
    paths = [scored.path for scored in judged_paths(list(specs.values()))]
    shape = f"{JUDGED_WRONG!r} must be an object of field paths to lists of values judged wrong"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {shape}, got {_type_name(raw)}")
    for name, values in raw.items():
        if name not in paths:
            raise ConfigError(
                f"{where}: {JUDGED_WRONG}: {name!r} is not a judged field path{did_you_mean(name, paths)}"
            )
        if not isinstance(values, list):
            raise ConfigError(f"{where}: {shape}: {name!r} holds {_type_name(values)}")
    return raw


def _rows(path: Path, id_column: str, specs: Mapping[str, FieldSpec]) -> Iterator[Row]:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        shown = repr(suffix) if suffix else "no extension"
        raise ConfigError(f"{path}: unknown gold file type ({shown}); use {', '.join(SUFFIXES)}")
    if suffix != ".csv":
        return ((found.where, found.value) for found in read_json_objects(path, GOLD_FILE))
    text = read_text(path, GOLD_FILE)
    header = next(csv.reader(io.StringIO(text, newline="")), [])
    id_key = _id_key(dict.fromkeys(header), id_column)
    if header and id_key is None:
        expected = repr(id_column) if id_column == "id" else f"{id_column!r} or 'id'"
        raise ConfigError(f"{path}: no id column (expected {expected})")
    _check_columns(path, header, id_key or id_column, specs)
    return _csv_rows(path, text)


def read_gold(path: Path, id_column: str, schema: type[BaseModel]) -> Gold:
    """The gold records in ``path``, keyed by :func:`~pipeline.quality.agreement.record_key` of their ids."""
    specs = {spec.name: spec for spec in schema_fields(schema)}
    csv_cells = path.suffix.lower() == ".csv"
    records: dict[str, dict[str, Any]] = {}
    first_seen: dict[str, str] = {}
    for where, row in _rows(path, id_column, specs):
        id_key = _id_key(row, id_column)
        key = _record_id(path, where, row, id_key, id_column)
        if key in records:
            raise ConfigError(f"{path}: {where}: duplicate id {key!r} (first on {first_seen[key]})")
        records[key] = _gold_fields(path, where, row, id_key, specs, csv_cells)
        first_seen[key] = where
    if not records:
        raise ConfigError(f"{path}: no gold records")
    given = {name for fields in records.values() for name in fields}
    given |= {top_field(name) for fields in records.values() for name in fields.get(JUDGED_WRONG, {})}
    return Gold(path, records, tuple(name for name in specs if name in given))
