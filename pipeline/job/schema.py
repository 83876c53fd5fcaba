"""The job's schema class (``schema: package.module:Class``): imported, and checked to be a Pydantic
model whose JSON schema can be built, since every request sends it (structured output, the prompt)
and the job's version hashes it. Each problem is one :class:`ConfigError` line naming the job file's
key 'schema', the class and, for a type JSON cannot describe, the field."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, create_model

from pipeline.errors import ConfigError
from pipeline.job.text import describe_import_error, one_line


def resolve_schema(import_path: str, job_file: Path) -> type[BaseModel]:
    """Import ``package.module:Class``; the job file's project folder is searched first."""
    module_name, _, class_name = import_path.partition(":")
    for folder in (job_file.resolve().parent.parent, job_file.resolve().parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    where = f"{job_file}: key 'schema'"
    try:
        module = importlib.import_module(module_name)
    # Whatever a module raises while it runs (a SyntaxError, a NameError, a bare raise, sys.exit) is
    # the job's configuration going wrong: one line, not a traceback.
    except (Exception, SystemExit) as exc:
        raise ConfigError(
            f"{where}: cannot import module '{module_name}' ({describe_import_error(exc)})"
        ) from exc
    found = getattr(module, class_name, None)
    if found is None:
        raise ConfigError(f"{where}: module '{module_name}' has no class '{class_name}'")
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise ConfigError(f"{where}: '{import_path}' is not a Pydantic model class")
    _check_json_schema(found, f"{where}: {import_path}")
    return found


def _check_json_schema(schema: type[BaseModel], where: str) -> None:
    """A model Pydantic can validate with but not describe in JSON (a ``Callable`` field, an arbitrary
    class allowed by ``arbitrary_types_allowed``, a forward reference never defined) is refused now,
    naming its field, instead of failing in every command that builds the prompt or the version."""
    reason = _json_schema_error(schema)
    if reason is None:
        return
    field = _field_without_json_schema(schema, (schema,))
    named = f"field '{field}' " if field else ""
    raise ConfigError(
        f"{where}: {named}cannot be put into a JSON schema, which every request sends ({reason}); "
        "give it a type JSON can hold (str, int, float, bool, a list, a nested model)"
    )


def _json_schema_error(schema: type[BaseModel]) -> str | None:
    """Why Pydantic cannot build ``schema``'s JSON schema, in one line; None when it can."""
    try:
        schema.model_json_schema()
    # Pydantic's own errors, or whatever a schema's custom __get_pydantic_json_schema__ raises: the
    # job's schema going wrong either way.
    except Exception as exc:
        return one_line(str(getattr(exc, "message", None) or exc))
    return None


def _field_without_json_schema(schema: type[BaseModel], seen: tuple[type[BaseModel], ...]) -> str | None:
    """The dotted path of the first field whose type has no JSON schema, into the nested model at
    fault (of a list, an optional, a dict's values); None if no single field is at fault. ``seen``:
    the models on the way here, whose fields (a tree's children) are tried last, since they fail
    whenever any field of theirs does."""
    if not _describable(schema, {}):  # its settings fail (a json_schema_extra that raises): no field
        return None
    fields = sorted(
        schema.model_fields.items(),
        key=lambda item: any(model in seen for model in _models_in(item[1].annotation)),
    )
    for name, field in fields:
        if _describable(schema, {name: (field.annotation, field)}):
            continue
        for nested in _models_in(field.annotation):
            inner = None if nested in seen else _field_without_json_schema(nested, (*seen, nested))
            if inner is not None:
                return f"{name}.{inner}"
        return name
    return None


def _describable(schema: type[BaseModel], fields: dict[str, Any]) -> bool:
    """Whether a model of ``schema``'s settings (arbitrary types allowed or not) with only ``fields``
    (name: (type, FieldInfo)) has a JSON schema."""
    try:
        probe = create_model(schema.__name__, __config__=schema.model_config, **fields)
    except Exception:  # a field Pydantic cannot even build a model of is one at fault
        return False
    return _json_schema_error(probe) is None


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The Pydantic models a field's type holds: itself, or in ``list[...]``, ``X | None``, ..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in get_args(annotation):
        yield from _models_in(argument)
