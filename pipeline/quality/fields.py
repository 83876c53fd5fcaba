"""What a schema's fields are, for measuring extractions: each top-level field's kind, its sub-fields
and whether its values should be found in the record text (grounding).

Kinds are about how values compare, not about Python types: ``Annotated[str, StringConstraints(...)]``
is text, ``int | None`` is a number, ``Literal[...]`` and enums are choices. A field is *grounded* when
it says so with ``Field(json_schema_extra={"grounded": True})``; inside a list of objects the mark goes
on the sub-field (``Requirement.text``), which grounds the values at ``requirements[].text``.

Paths name values inside one extraction: ``company``, ``salary.minimum`` (a field of a nested object),
``requirements[].text`` (``[]`` walks every object of a list). :func:`scored_paths` lists the paths the
agreement metrics score: every field, except that a nested object is scored field by field and a list
of objects both as a whole and sub-field by sub-field.
"""

from __future__ import annotations

import dataclasses
import decimal
import difflib
import enum
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from pipeline.errors import ConfigError


class FieldKind(StrEnum):
    TEXT = "text"
    NUMBER = "number"
    BOOLEAN = "boolean"
    CHOICE = "choice"  # Literal[...] or an Enum
    LIST = "list"  # a list of scalars (text, numbers, booleans or choices)
    OBJECT_LIST = "object_list"  # a list of models
    OBJECT = "object"  # one nested model
    OTHER = "other"  # anything else (dicts, unions of several types, dates): compared as given


#: Kinds whose values are single JSON scalars.
SCALAR_KINDS = frozenset({FieldKind.TEXT, FieldKind.NUMBER, FieldKind.BOOLEAN, FieldKind.CHOICE})


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    kind: FieldKind
    grounded: bool = False
    subfields: tuple[FieldSpec, ...] = ()  # OBJECT and OBJECT_LIST: the model's fields
    item_kind: FieldKind | None = None  # LIST: the kind of its items
    choices: tuple[Any, ...] = ()  # CHOICE (and a LIST of choices): the allowed values
    integer: bool = False  # NUMBER (and a LIST of numbers): whole numbers only (an int)
    # The type one value is declared as, Optional and Annotated unwrapped (date, Decimal, an Enum, a
    # Literal; a list's items'); None for a model. What `export --flatten` types a column by.
    value_type: Any = dataclasses.field(default=None, compare=False)
    listed: bool = False  # a list (set, tuple[X, ...]) of value_type: LIST, or OTHER of such items
    # A Decimal's max_digits and decimal_places, where the schema gives them.
    digits: tuple[int | None, int | None] = (None, None)


@dataclass(frozen=True, slots=True)
class _TypeShape:
    kind: FieldKind
    model: type[BaseModel] | None = None
    item_kind: FieldKind | None = None
    choices: tuple[Any, ...] = ()
    integer: bool = False
    value_type: Any = None
    listed: bool = False


def schema_fields(schema: type[BaseModel]) -> tuple[FieldSpec, ...]:
    """The top-level fields of ``schema``, in declaration order, with their sub-fields."""
    return _model_fields(schema, frozenset())


def _model_fields(schema: type[BaseModel], expanded: frozenset[type[BaseModel]]) -> tuple[FieldSpec, ...]:
    return tuple(_field_spec(name, info, expanded) for name, info in schema.model_fields.items())


def _field_spec(name: str, info: FieldInfo, expanded: frozenset[type[BaseModel]]) -> FieldSpec:
    shape = _shape(info.annotation)
    subfields: tuple[FieldSpec, ...] = ()
    # A model inside itself (a tree) is described once more, without going further.
    if shape.model is not None and shape.model not in expanded:
        subfields = _model_fields(shape.model, expanded | {shape.model})
    return FieldSpec(
        name=name,
        kind=shape.kind,
        grounded=_marked_grounded(info),
        subfields=subfields,
        item_kind=shape.item_kind,
        choices=shape.choices,
        integer=shape.integer,
        value_type=shape.value_type,
        listed=shape.listed,
        digits=_decimal_digits(info),
    )


def _decimal_digits(info: FieldInfo) -> tuple[int | None, int | None]:
    """``max_digits`` and ``decimal_places`` wherever the schema gives them: ``Field(...)``,
    ``condecimal(...)``, an ``Annotated`` layer, a list's items."""
    pending: list[Any] = [*info.metadata, info.annotation]
    while pending:
        item = pending.pop()
        if isinstance(item, FieldInfo):
            pending.extend(item.metadata)
        elif getattr(item, "decimal_places", None) is not None:
            return getattr(item, "max_digits", None), item.decimal_places
        else:
            pending.extend(typing.get_args(item))  # Annotated, Optional, list[...]: their members
    return None, None


def _marked_grounded(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("grounded") is True


def _unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` is X; ``X | None`` is X (several non-None members stay a union)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _scalar_shape(annotation: Any) -> _TypeShape | None:
    if typing.get_origin(annotation) is Literal:
        return _TypeShape(FieldKind.CHOICE, choices=typing.get_args(annotation), value_type=annotation)
    if not isinstance(annotation, type):
        return None
    if issubclass(annotation, enum.Enum):
        choices = tuple(member.value for member in annotation)
        return _TypeShape(FieldKind.CHOICE, choices=choices, value_type=annotation)
    if issubclass(annotation, bool):
        return _TypeShape(FieldKind.BOOLEAN, value_type=annotation)
    if issubclass(annotation, int | float | decimal.Decimal):
        return _TypeShape(FieldKind.NUMBER, integer=issubclass(annotation, int), value_type=annotation)
    if issubclass(annotation, str):
        return _TypeShape(FieldKind.TEXT, value_type=annotation)
    return None


def _item_annotation(annotation: Any) -> Any | None:
    """The item type of a homogeneous collection annotation, else None."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (list, set, frozenset, Sequence) and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _shape(annotation: Any) -> _TypeShape:
    annotation = _unwrap(annotation)
    scalar = _scalar_shape(annotation)
    if scalar is not None:
        return scalar
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _TypeShape(FieldKind.OBJECT, model=annotation)
    item = _item_annotation(annotation)
    if item is None:
        return _TypeShape(FieldKind.OTHER, value_type=annotation)
    item = _unwrap(item)
    item_scalar = _scalar_shape(item)
    if item_scalar is not None:
        return _TypeShape(
            FieldKind.LIST,
            item_kind=item_scalar.kind,
            choices=item_scalar.choices,
            integer=item_scalar.integer,
            value_type=item,
            listed=True,
        )
    if isinstance(item, type) and issubclass(item, BaseModel):
        return _TypeShape(FieldKind.OBJECT_LIST, model=item)
    return _TypeShape(FieldKind.OTHER, value_type=item, listed=True)


def grounded_paths(schema: type[BaseModel]) -> tuple[str, ...]:
    """Paths of every grounded value, in schema order, e.g. ``("company", "requirements[].text")``.

    A grounded mark on an object or a list of objects grounds all of its text sub-fields."""
    return tuple(_grounded_paths(schema_fields(schema), prefix="", inherited=False))


def _grounded_paths(specs: Sequence[FieldSpec], prefix: str, inherited: bool) -> list[str]:
    paths: list[str] = []
    for spec in specs:
        grounded = inherited or spec.grounded
        if spec.kind is FieldKind.OBJECT:
            paths += _grounded_paths(spec.subfields, f"{prefix}{spec.name}.", grounded)
        elif spec.kind is FieldKind.OBJECT_LIST:
            paths += _grounded_paths(spec.subfields, f"{prefix}{spec.name}[].", grounded)
        elif spec.grounded or (inherited and FieldKind.TEXT in (spec.kind, spec.item_kind)):
            paths.append(f"{prefix}{spec.name}")
    return paths


def raw_values_at(data: Mapping[str, Any], path: str) -> list[Any]:
    """Every non-null value at ``path``: a scalar gives one item, lists are flattened, ``name[]`` walks
    a list of objects; a missing or null step gives no values."""
    current: list[Any] = [data]
    for segment in path.split("."):
        name = segment.removesuffix("[]")
        following: list[Any] = []
        for item in current:
            value = item.get(name) if isinstance(item, Mapping) else None
            if isinstance(value, list) and segment.endswith("[]"):
                following.extend(value)
            elif value is not None:
                following.append(value)
        current = following
    flat: list[Any] = []
    for value in current:
        if isinstance(value, list):
            flat.extend(value)
        else:
            flat.append(value)
    return [value for value in flat if value is not None]


def values_at(data: Mapping[str, Any], path: str) -> list[str]:
    """The string values at ``path`` (see :func:`raw_values_at`); values of other types are left out."""
    return [value for value in raw_values_at(data, path) if isinstance(value, str)]


# --- what the agreement metrics score ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScoredPath:
    """One thing scored: a top-level field, a nested object's field or an object list's sub-field."""

    path: str  # "title", "salary.minimum", "requirements", "requirements[].text"
    kind: FieldKind  # a scalar kind or OTHER (scored as scalars), LIST or OBJECT_LIST
    field: str  # the top-level field it belongs to
    item_kind: FieldKind | None = None  # LIST: how items compare
    subfields: tuple[FieldSpec, ...] = ()  # OBJECT_LIST: the objects' fields
    in_overall: bool = True  # False for the sub-field paths of an object list


def scored_paths(specs: Sequence[FieldSpec]) -> tuple[ScoredPath, ...]:
    """Everything scored for these top-level fields, in schema order."""
    paths: list[ScoredPath] = []
    for spec in specs:
        paths += _paths_of(spec, spec.name, spec.name)
    return tuple(paths)


def _paths_of(spec: FieldSpec, path: str, top: str) -> list[ScoredPath]:
    if spec.kind is FieldKind.OBJECT:
        return [sp for sub in spec.subfields for sp in _paths_of(sub, f"{path}.{sub.name}", top)]
    if spec.kind is FieldKind.OBJECT_LIST:
        head = ScoredPath(path, spec.kind, top, subfields=spec.subfields)
        return [head, *_list_subpaths(spec.subfields, f"{path}[].", top)]
    return [ScoredPath(path, spec.kind, top, item_kind=spec.item_kind)]


def _list_subpaths(specs: Sequence[FieldSpec], prefix: str, top: str) -> list[ScoredPath]:
    """Sub-fields of the objects in a list, each scored as the list of its values."""
    paths: list[ScoredPath] = []
    for spec in specs:
        if spec.kind is FieldKind.OBJECT:
            paths += _list_subpaths(spec.subfields, f"{prefix}{spec.name}.", top)
        elif spec.kind is FieldKind.OBJECT_LIST:
            paths += _list_subpaths(spec.subfields, f"{prefix}{spec.name}[].", top)
        else:
            item_kind = spec.item_kind if spec.kind is FieldKind.LIST else spec.kind
            paths.append(ScoredPath(f"{prefix}{spec.name}", FieldKind.LIST, top, item_kind, in_overall=False))
    return paths


def top_field(path: str) -> str:
    """The top-level field of a path: ``salary.minimum`` and ``requirements[].text`` -> their first name."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or nothing."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def select_paths(
    specs: Sequence[FieldSpec], reference: Iterable[Mapping[str, Any]], fields: Sequence[str] | None = None
) -> tuple[ScoredPath, ...]:
    """The paths to score: those of ``fields`` (top-level names or scored paths), or by default of every
    field some reference record gives. A name the schema lacks is a :class:`ConfigError`."""
    names = [spec.name for spec in specs]
    mentioned: set[str] = set()
    for record in reference:
        mentioned.update(record)
    unknown = sorted(mentioned - set(names))
    if unknown:
        hint = did_you_mean(unknown[0], names)
        raise ConfigError(f"the reference gives field {unknown[0]!r}, which the schema does not have{hint}")
    every_path = scored_paths(specs)
    if fields is None:
        return tuple(path for path in every_path if path.field in mentioned)
    known = [*names, *(path.path for path in every_path if path.path not in names)]
    for name in fields:
        if name not in known:
            raise ConfigError(f"field {name!r} is not in the schema{did_you_mean(name, known)}")
    return tuple(path for path in every_path if path.field in fields or path.path in fields)
