"""Reading a file of JSON objects a person wrote: a gold file, judgments to import, few-shot examples.

By name: ``.json`` is one JSON list of objects; anything else is JSON lines, one object a line (blank
lines skipped). Every object comes with the line it starts on, and every problem is one
:class:`~pipeline.errors.ConfigError` in one wording, naming the file and the line: ``gold.jsonl: line
3: invalid JSON (unexpected end of data)``. What the objects must hold is the caller's to check (and to
say in the same words, through :meth:`JsonObject.where`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import orjson

from pipeline.errors import ConfigError

#: The name of a file that holds one JSON list; any other is read as JSON lines.
JSON_LIST_SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class JsonObject:
    line: int  # where the object starts in its file, from 1
    value: dict[str, Any]

    @property
    def where(self) -> str:
        """Where it is, as every error about it says it after the file's name."""
        return f"line {self.line}"


def read_text(path: Path, what: str) -> str:
    """``path``'s text (UTF-8, a byte-order mark allowed); ``what`` names the file in an error."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read {what} ({error.strerror or error})") from None


def read_json_objects(path: Path, what: str) -> list[JsonObject]:
    """The objects in ``path`` (``what`` names the file in an error), in the file's order."""
    text = read_text(path, what)
    if path.suffix.lower() == JSON_LIST_SUFFIX:
        return _list_items(path, text)
    return _lines(path, text)


def _lines(path: Path, text: str) -> list[JsonObject]:
    objects = []
    # Split on newlines only: JSON strings may hold U+2028, which str.splitlines() would cut at.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            _invalid(path, number, error.colno, error.msg)
        objects.append(_object(path, number, value))
    return objects


def _list_items(path: Path, text: str) -> list[JsonObject]:
    """Each item of the one list with the line it starts on (the standard library's decoder reads one
    value at a place, which orjson cannot)."""
    decoder = json.JSONDecoder(parse_constant=_no_constant)
    at = _skip_space(text, 0)
    if at == len(text):
        return []  # as a JSON-lines file with no line: the caller says there is nothing in it
    if not text.startswith("[", at):
        value = _decoded(path, decoder, text, at)[0]
        raise ConfigError(f"{path}: expected a JSON list of objects, got {_type_name(value)}")
    objects: list[JsonObject] = []
    at = _skip_space(text, at + 1)
    while not text.startswith("]", at):
        if objects:
            if not text.startswith(",", at):
                _invalid_at(path, text, at, "expected ',' or ']'")
            at = _skip_space(text, at + 1)
        value, end = _decoded(path, decoder, text, at)
        objects.append(_object(path, text.count("\n", 0, at) + 1, value))
        at = _skip_space(text, end)
    if text[at + 1 :].strip():
        _invalid_at(path, text, _skip_space(text, at + 1), "more after the list")
    return objects


def _decoded(path: Path, decoder: json.JSONDecoder, text: str, at: int) -> tuple[Any, int]:
    try:
        return decoder.raw_decode(text, at)
    except json.JSONDecodeError as error:  # "Expecting value": said lower-case, as orjson says its own
        _invalid(path, error.lineno, error.colno, error.msg[:1].lower() + error.msg[1:])
    except ValueError as error:  # NaN or Infinity, which JSON has not
        _invalid_at(path, text, at, str(error))


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON value")


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _object(path: Path, line: int, value: Any) -> JsonObject:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: line {line}: expected a JSON object, got {_type_name(value)}")
    return JsonObject(line, value)


def _invalid_at(path: Path, text: str, at: int, reason: str) -> NoReturn:
    line = text.count("\n", 0, at) + 1
    _invalid(path, line, at - text.rfind("\n", 0, at), reason if at < len(text) else "unexpected end")


def _invalid(path: Path, line: int, column: int, reason: str) -> NoReturn:
    raise ConfigError(f"{path}: line {line}: invalid JSON ({reason}, column {column})") from None


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__
