"""Few-shot examples: a few records with the answers they should get, checked when the job loads.

They are sent as user/assistant turns after the system prompt (:mod:`pipeline.extraction.prompt`), so each
example's input must fill the user template and its output must be valid for the schema: a wrong
example teaches the model a wrong answer on every record.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.errors import ConfigError, summarize_validation_error


class Example(BaseModel):
    """One few-shot example: a record's fields and the answer it should get."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: dict[str, Any]
    output: dict[str, Any]


def read_examples_file(path: Path, where: str) -> list[Example]:
    """A JSON-lines file of ``{"input": {...}, "output": {...}}`` objects (blank lines skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path} ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: {path} is not UTF-8") from exc
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            examples.append(Example.model_validate(orjson.loads(line)))
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{where}: {path} line {number}: not valid JSON ({exc})") from exc
        except ValidationError as exc:
            raise ConfigError(f"{where}: {path} line {number}: {summarize_validation_error(exc)}") from exc
    return examples


def check_examples(
    examples: Sequence[Example],
    schema: type[BaseModel],
    *,
    template_fields: Sequence[str],
    source_fields: Sequence[str],
    where: str,
) -> None:
    """Each input fills the template with source fields only; each output validates against the schema."""
    for index, example in enumerate(examples):
        at = f"{where}[{index}]"
        missing = [name for name in template_fields if name not in example.input]
        if missing:
            raise ConfigError(f"{at}.input: no value for {missing} (the user template uses them)")
        unknown = sorted(set(example.input) - set(source_fields))
        if unknown:
            raise ConfigError(f"{at}.input: {unknown} are not in source.fields")
        try:
            schema.model_validate(example.output)
        except ValidationError as exc:
            raise ConfigError(
                f"{at}.output: not valid for the schema ({summarize_validation_error(exc)})"
            ) from exc
