"""What is sent for a record: the static system prompt first, then the few-shot examples as
user/assistant turns (together one shared prefix for vLLM's prefix cache), then the record's fields in
the user template, last."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from pydantic import BaseModel

from pipeline.examples import Example
from pipeline.job import JobSpec
from pipeline.llm import ChatMessage, ChatRequest

SCHEMA_INSTRUCTION = "Reply with one JSON object that matches this JSON schema, and nothing else:"


def response_format_for(schema: type[BaseModel]) -> dict[str, Any]:
    """The ``response_format`` asking the server to constrain decoding to the schema."""
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema(), "strict": True},
    }


def as_sent(value: object) -> str:
    """A field value as the prompt carries it: NULL is empty, everything else its ``str``."""
    return "" if value is None else str(value)


class _FieldValues(Mapping[str, str]):
    """A record's fields as template text: missing values read as empty, everything as ``str``."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, object]) -> None:
        self._fields = fields

    def __getitem__(self, key: str) -> str:
        return as_sent(self._fields.get(key))

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


class PromptBuilder:
    """Builds each record's first request. The prefix (system message and examples) is one tuple of
    message objects shared by every request."""

    def __init__(self, spec: JobSpec) -> None:
        # The model only reads field descriptions if they are in the prompt: constrained decoding
        # enforces the shape but never shows the schema to the model.
        system = self.schema_system(spec) if spec.prompt.include_schema else spec.prompt.system.strip()
        self._template = spec.prompt.user
        self._fields = spec.content_fields()
        self._max_tokens = spec.max_tokens
        self.system_message: ChatMessage = {"role": "system", "content": system}
        turns = [message for example in spec.prompt.examples for message in self._example_turns(example)]
        self.prefix: tuple[ChatMessage, ...] = (self.system_message, *turns)

    @staticmethod
    def schema_system(spec: JobSpec) -> str:
        """The system prompt with the JSON schema appended."""
        schema_json = orjson.dumps(spec.schema_class.model_json_schema()).decode()
        return f"{spec.prompt.system.strip()}\n\n{SCHEMA_INSTRUCTION}\n{schema_json}"

    def texts(self, fields: Mapping[str, object]) -> dict[str, str]:
        """The record's fields the template reads, as sent, in template order."""
        return {name: as_sent(fields.get(name)) for name in self._fields}

    def _user_message(self, fields: Mapping[str, object]) -> ChatMessage:
        return {"role": "user", "content": self._template.format_map(_FieldValues(fields))}

    def _example_turns(self, example: Example) -> tuple[ChatMessage, ChatMessage]:
        answer: ChatMessage = {"role": "assistant", "content": orjson.dumps(example.output).decode()}
        return self._user_message(example.input), answer

    def request_for(self, fields: Mapping[str, object], max_tokens: int | None = None) -> ChatRequest:
        """The record's first request; ``max_tokens`` overrides the job's budget (a truncated record
        retried by a later run starts from a larger one)."""
        return ChatRequest(
            messages=(*self.prefix, self._user_message(fields)), max_tokens=max_tokens or self._max_tokens
        )
