"""Few-shot examples: a few records with the answers they should get, checked when the job loads.

They are sent as user/assistant turns after the system prompt (:mod:`pipeline.extraction.prompt`), so each
example's input must fill the user template and its output must be valid for the schema: a wrong
example teaches the model a wrong answer on every record.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.errors import ConfigError, summarize_validation_error
from pipeline.quality.json_files import read_json_objects


class Example(BaseModel):
    """One few-shot example: a record's fields and the answer it should get."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: dict[str, Any]
    output: dict[str, Any]


def read_examples_file(path: Path, where: str) -> list[Example]:
    """A file of ``{"input": {...}, "output": {...}}`` objects, JSON lines or a ``.json`` list
    (:mod:`pipeline.quality.json_files`); ``where``: the job's key that names it, said first."""
    try:
        found = read_json_objects(path, "the examples")
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    examples = []
    for example in found:
        try:
            examples.append(Example.model_validate(example.value))
        except ValidationError as exc:
            said = summarize_validation_error(exc)
            raise ConfigError(f"{where}: {path}: {example.where}: {said}") from None
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
