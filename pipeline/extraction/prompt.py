"""What is sent for a record: the static system prompt first, then the few-shot examples as
user/assistant turns (together one shared prefix for vLLM's prefix cache), then the record's fields in
the user template, last; and what every request to an endpoint carries besides (:func:`client_settings`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from pydantic import BaseModel

from pipeline.job.examples import Example
from pipeline.job.spec import JobSpec
from pipeline.servers.client import ChatMessage, ChatRequest, ClientSettings
from pipeline.servers.config import EndpointConfig

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
        # What no record changes (system prompt, examples, the template with empty fields): what a
        # server's prefix cache holds once, and what the KV-cache fit and the chunk planner count.
        self.fixed_messages: tuple[ChatMessage, ...] = (*self.prefix, self._user_message({}))

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


def client_settings(spec: JobSpec, config: EndpointConfig | None = None) -> ClientSettings:
    """Everything about a request to this endpoint (default: the job's first) that is the same for
    every record."""
    config = config or spec.endpoint_configs()[0]
    return ClientSettings(
        base_url=config.base_url,
        model=config.model,
        api_key=spec.api_key(config.api_key_env),
        api_key_env=config.api_key_env,
        concurrency=config.most_in_flight,
        request_timeout_s=spec.request_timeout_s,
        temperature=spec.temperature,
        reasoning_effort=spec.reasoning_effort,
        response_format=response_format_for(spec.schema_class) if config.structured_output else None,
        extra_body=spec.extra_body,
        preflight_timeout_s=spec.operations.preflight_timeout_s,
        system_with_schema=None if spec.prompt.include_schema else PromptBuilder.schema_system(spec),
        max_model_len=config.max_model_len,
    )
