"""Variants: the same job with another model, endpoint, prompt or settings, whose results live beside
the job's own (variant ``main``) in the same tables, so two can be compared record by record.

A job file declares them under ``variants:``; each gives only what differs. ``prompt`` and
``endpoint`` are merged key by key into the job's; every other key replaces the job's value. Giving a
variant ``examples`` drops the job's ``examples_file`` and the other way round, so ``examples: []`` is a
zero-shot variant of a few-shot job.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError
from pipeline.job.examples import Example
from pipeline.job.text import describe_validation_error

#: The variant a job's own settings make; others are declared under ``variants:`` or given by --variant.
MAIN_VARIANT = "main"

#: A variant's name: stored in every row and given on the command line.
VARIANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
VariantName = Annotated[str, Field(pattern=VARIANT_NAME_PATTERN)]
VARIANT_NAME_RULE = "letters, digits, '_', '.' and '-', at most 64, not starting with a symbol"


#: A re-run of variant A is stored as variant ``A~rerun``: A's settings exactly, its results kept apart,
#: to measure how much A differs from itself (the noise floor of ``pipeline compare``). ``~`` is not
#: allowed in a declared name, so a re-run's name never clashes with a variant's.
RERUN_SUFFIX = "~rerun"


def rerun_name(variant: str) -> str:
    return f"{variant}{RERUN_SUFFIX}"


def rerun_of(name: str) -> str | None:
    """The variant ``name`` re-runs (``A`` for ``A~rerun``), or None for any other name."""
    return name.removesuffix(RERUN_SUFFIX) if name.endswith(RERUN_SUFFIX) else None


def is_variant_name(name: str) -> bool:
    """A variant's name, or a re-run's (``A~rerun``)."""
    return re.match(VARIANT_NAME_PATTERN, rerun_of(name) or name) is not None


MERGED_KEYS = ("prompt", "endpoint")


class _Override(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EndpointOverride(_Override):
    base_url: str | None = None
    api_key_env: str | None = None
    structured_output: bool | None = None


class PromptOverride(_Override):
    system: str | None = None
    user: str | None = None
    include_schema: bool | None = None
    examples: list[Example] | None = None
    examples_file: Path | None = None


class VariantSpec(_Override):
    """What a variant changes; the values are checked as part of the whole job when it loads."""

    model: str | None = None
    endpoint: EndpointOverride | None = None
    prompt: PromptOverride | None = None
    concurrency: int | str | None = None
    request_timeout_s: float | None = None
    max_tokens: int | None = None
    reasoning_effort: str | None = None
    temperature: float | None = None
    extra_body: dict[str, Any] | None = None


def merge_changes(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a job as a mapping) with ``changes`` applied: ``prompt`` and ``endpoint`` key by key."""
    merged = dict(data)
    for key, value in changes.items():
        if key in MERGED_KEYS and isinstance(value, dict):
            section = {**merged.get(key, {}), **value}
            if key == "prompt":
                if "examples" in value and "examples_file" not in value:
                    section["examples_file"] = None
                if "examples_file" in value and "examples" not in value:
                    section["examples"] = []
            merged[key] = section
        else:
            merged[key] = value
    return merged


def variant_changes(variant: VariantSpec) -> dict[str, Any]:
    """Only what the variant gives (a ``null`` given on purpose included)."""
    return variant.model_dump(exclude_unset=True, mode="python")


def prompt_file_changes(path: Path) -> dict[str, Any]:
    """``--prompt-file``: a YAML mapping of prompt keys (``system``, ``user``, ``examples``, ...), or any
    other file's text as the system prompt. A relative ``examples_file`` is relative to this file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompt-file {path}: cannot read it ({exc})") from exc
    if path.suffix.lower() not in (".yaml", ".yml"):
        if not text.strip():
            raise ConfigError(f"--prompt-file {path}: the file is empty")
        return {"system": text}
    try:
        raw = yaml.safe_load(text)
        changes = PromptOverride.model_validate(raw).model_dump(exclude_unset=True)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--prompt-file {path}: not valid YAML ({' '.join(str(exc).split())})") from exc
    except ValidationError as exc:
        raise ConfigError(f"--prompt-file {path}: {describe_validation_error(exc, PromptOverride)}") from exc
    examples_file = changes.get("examples_file")
    if isinstance(examples_file, Path) and not examples_file.is_absolute():
        changes["examples_file"] = (path.resolve().parent / examples_file).resolve()
    return changes
