"""Turning a job file's text into values and its errors into one line: ``${VAR}`` interpolation,
pydantic's validation errors as ``key 'a.b': message`` with a "did you mean" for typo'd keys, and what
a schema module raised on import, with the file and line at fault. (A count said with its noun, for
every command's output, is :func:`pipeline.wording.counted`.)"""

from __future__ import annotations

import difflib
import os
import re
import sys
import traceback
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.errors import ConfigError

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: Any, job_file: Path, key: tuple[str, ...]) -> Any:
    if isinstance(value, Mapping):
        return {name: interpolate(item, job_file, (*key, str(name))) for name, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, job_file, (*key, str(index))) for index, item in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{job_file}: key '{'.'.join(key)}': environment variable {name} is not set")

    return _ENV_REFERENCE.sub(substitute, value)


def describe_validation_error(exc: ValidationError, root: type[BaseModel] | None = None) -> str:
    """Pydantic's errors as one line: ``key 'a.b': message; key 'c': message``.

    An unknown key gets a "did you mean" from the keys allowed where it stands; a key that looks like
    a secret (``api_key``, ``token``) is pointed at ``endpoint.api_key_env`` instead. Input values are
    never shown, except the rejected value of a SQL name (so the message says what was refused).
    """
    parts = []
    for error in exc.errors(include_url=False)[:5]:
        location = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            allowed = _keys_at(root, error["loc"][:-1]) if root and exc.title == root.__name__ else []
            message = "unknown key" + _unknown_key_hint(str(error["loc"][-1]), allowed)
        elif error["type"] == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") in _PATTERNS:
            message = _PATTERNS[error["ctx"]["pattern"]]
            if error["ctx"]["pattern"] == IDENTIFIER.pattern and isinstance(error.get("input"), str):
                message += f", got {_shorten(error['input'])}"
        else:
            message = error["msg"].removeprefix("Value error, ")
        parts.append(f"key '{location}': {message}" if location else message)
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


_PATTERNS = {
    IDENTIFIER.pattern: "must be a plain SQL name (letters, digits and _, not starting with a digit)",
    r"^[\w.]+:\w+$": "must be an import path like package.module:Class",
    r"^[A-Z_][A-Z0-9_]*$": "must be the name of an environment variable (A-Z, 0-9 and _), not the key itself",
}
_SECRET_WORDS = ("key", "token", "secret", "password")


def _keys_at(root: type[BaseModel], location: tuple[int | str, ...]) -> list[str]:
    """The keys a job file may give in the mapping at ``location`` ([] where that is not known).
    A mapping of named entries (``variants: {NAME: ...}``) is walked through its name."""
    model: type[BaseModel] = root
    parts = [str(part) for part in location]
    while parts:
        fields = {info.alias or name: info for name, info in model.model_fields.items()}
        info = fields.get(parts.pop(0))
        annotation = info.annotation if info is not None else None
        if isinstance(annotation, types.UnionType):  # X | None: the keys of X
            annotation = next((arg for arg in typing.get_args(annotation) if arg is not type(None)), None)
        if typing.get_origin(annotation) is dict and parts:
            annotation = typing.get_args(annotation)[1]
            parts.pop(0)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return [info.alias or name for name, info in model.model_fields.items() if not info.exclude]


def _unknown_key_hint(key: str, allowed: list[str]) -> str:
    secret_like = any(word in key.lower() for word in _SECRET_WORDS)
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.85 if secret_like else 0.6)
    if close:
        return f" (did you mean '{close[0]}'?)"
    if secret_like:
        return (
            " (a job file holds no secrets: put the API key in an environment variable and name "
            "that variable in endpoint.api_key_env)"
        )
    return ""


def _shorten(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def describe_import_error(exc: BaseException) -> str:
    """What importing a module raised, as ``Kind: message, at file:line``: the line of a SyntaxError,
    else the deepest frame outside Python's own and installed code (the module's line at fault)."""
    said = one_line(str(exc.msg if isinstance(exc, SyntaxError) else exc))
    text = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    where = _syntax_error_place(exc) if isinstance(exc, SyntaxError) else _deepest_own_frame(exc)
    return f"{text}, at {where}" if where else text


def _syntax_error_place(exc: SyntaxError) -> str | None:
    return f"{exc.filename}:{exc.lineno}" if exc.filename and exc.lineno else None


def _deepest_own_frame(exc: BaseException) -> str | None:
    # Not ours (the import call), not Python's (<frozen importlib._bootstrap>), not a library's.
    skipped = ("<", _PACKAGE, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    frames = [
        frame for frame in traceback.extract_tb(exc.__traceback__) if not frame.filename.startswith(skipped)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def one_line(text: str) -> str:
    return " ".join(text.split())
