"""What a model judge is asked, and the shape its answer must have.

One request per record and variant: the system message (the judge's prompt, what each field of the
schema asks for, and the answer's shape) is the same for every request of a job, so vLLM's prefix
cache serves it once; the user message is the record's text and its values, numbered. The answer is
one JSON object with a verdict per number, ``"correct"`` or ``"wrong"``, every number required: sent
as ``response_format``, guided decoding can give exactly one verdict per value and nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from pipeline.errors import (
    BadOutputError,
    ContextLengthError,
    PermanentRecordError,
    RepetitionLoopError,
    TruncatedError,
)
from pipeline.extraction.parse import larger_budget_request, loop_reask_request, reask_request
from pipeline.extraction.prompt import response_format_for
from pipeline.job.judge import JudgeSettings
from pipeline.quality.fields import FieldKind, FieldSpec, ScoredPath, schema_fields
from pipeline.quality.judgments import JudgmentVerdict, ValueToJudge, judged_paths
from pipeline.servers.client import ChatMessage, ChatRequest

ANSWER_INSTRUCTION = (
    'Reply with one JSON object whose keys are the numbers of the values ("1", "2", ...) and whose '
    'values are "correct" or "wrong": one verdict for every number, and nothing else.'
)
RECORD_HEADING = "The record:"
VALUES_HEADING = "The values to judge (number. field: value):"


def _verdict_word(value: object) -> object:
    """``"Correct"``, `` wrong `` as the words they are (a server without guided decoding)."""
    return value.strip().lower() if isinstance(value, str) else value


Verdict = Annotated[Literal["correct", "wrong"], BeforeValidator(_verdict_word)]


@functools.lru_cache(maxsize=256)
def verdicts_model(count: int) -> type[BaseModel]:
    """The answer for ``count`` values: properties ``"1"`` to ``"count"``, each a verdict, all required."""
    fields: dict[str, Any] = {f"v{n}": (Verdict, Field(alias=str(n))) for n in range(1, count + 1)}
    config = ConfigDict(extra="forbid", populate_by_name=False)
    return create_model(f"Verdicts{count}", __config__=config, **fields)


def verdicts_of(answer: BaseModel, count: int) -> list[JudgmentVerdict]:
    """The verdicts of a validated answer, in the values' order."""
    return [JudgmentVerdict(getattr(answer, f"v{n}")) for n in range(1, count + 1)]


class JudgePrompts:
    """Builds each record's request for a job's schema and judge."""

    def __init__(self, schema: type[BaseModel], settings: JudgeSettings) -> None:
        guide = f"The fields and what each asks for:\n{field_guide(schema)}"
        system = f"{settings.prompt.strip()}\n\n{guide}\n\n{ANSWER_INSTRUCTION}"
        self.system_message: ChatMessage = {"role": "system", "content": system}
        self._max_tokens = settings.max_tokens

    def request_for(
        self, texts: Mapping[str, str], values: Sequence[ValueToJudge], *, structured: bool
    ) -> ChatRequest:
        """The first request for a record's ``values``; ``structured``: with the answer's JSON schema as
        ``response_format``."""
        user: ChatMessage = {"role": "user", "content": user_message(texts, values)}
        answer = response_format_for(verdicts_model(len(values))) if structured else None
        return ChatRequest((self.system_message, user), self._max_tokens, response_format=answer)


@dataclass(slots=True)
class Asking:
    """One record's requests: the first, and the next after a bad answer (a re-ask, with the rejected
    answer; a larger budget after a cut-off one) or a 400 naming the context (the budget it leaves).
    Each keeps the first's ``response_format``."""

    first: ChatRequest
    growth: float  # retry.truncation_growth
    ceiling: int  # the largest budget a cut-off answer grows to
    request: ChatRequest = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.request = self.first

    def after_bad_answer(self, error: BadOutputError) -> None:
        first, budget = self.first, self.request.max_tokens
        if isinstance(error, RepetitionLoopError):
            again = loop_reask_request(first, error, budget)
        elif isinstance(error, TruncatedError):
            again = larger_budget_request(self.request, self.growth, self.ceiling)
        else:
            again = reask_request(dataclasses.replace(first, max_tokens=budget), error)
        self.request = dataclasses.replace(again, response_format=first.response_format)

    def after_context_refused(self, error: ContextLengthError) -> None:
        """The budget the context leaves after the prompt, or (the prompt alone too long, or its tokens
        unknown) a :class:`PermanentRecordError`, which is not retried."""
        if error.prompt_tokens is not None and not error.prompt_at_least:
            room = error.context_length - error.prompt_tokens
            if 1 <= room < self.request.max_tokens:
                self.request = dataclasses.replace(self.request, max_tokens=room)
                return
        raise PermanentRecordError(
            f"the record and its values do not fit the judge's context: {error}"
        ) from error


def user_message(texts: Mapping[str, str], values: Sequence[ValueToJudge]) -> str:
    """The record's fields, each under its name, then its values numbered from 1."""
    record = "\n\n".join(f"[{name}]\n{text.strip()}" for name, text in texts.items())
    numbered = "\n".join(
        f"{n}. {value.field}: {' '.join(value.value.split())}" for n, value in enumerate(values, start=1)
    )
    return f"{RECORD_HEADING}\n\n{record}\n\n{VALUES_HEADING}\n{numbered}"


def field_guide(schema: type[BaseModel]) -> str:
    """One line per judged path of ``schema``: its description and, for choices, what it may be."""
    return "\n".join(_guide_line(schema, path) for path in judged_paths(schema_fields(schema)))


def _guide_line(schema: type[BaseModel], path: ScoredPath) -> str:
    info, spec = _field_at(schema, path.path)
    said = [_described(info, spec)]
    if path.kind is FieldKind.LIST:
        said.insert(0, "a list, each item judged as its own value.")
    elif path.kind is FieldKind.OBJECT_LIST:
        keys = "; ".join(
            f"{sub.name}: {_described(_sub_info(info, sub.name), sub).rstrip('.')}" for sub in spec.subfields
        )
        said.insert(0, "a list of objects, each object judged as one value (right only if all of it is).")
        said.append(f"Its keys: {keys}.")
    described = " ".join(part for part in said if part)
    return f"- {path.path}: {described}" if described else f"- {path.path}"


def _described(info: FieldInfo | None, spec: FieldSpec) -> str:
    text = (info.description or "").strip() if info is not None else ""
    if spec.choices:
        text = f"{text} One of: {', '.join(str(choice) for choice in spec.choices)}.".strip()
    return text


def _field_at(schema: type[BaseModel], path: str) -> tuple[FieldInfo | None, FieldSpec]:
    """The pydantic field and the field spec at ``path`` (``salary.minimum``, ``requirements``)."""
    model: type[BaseModel] | None = schema
    specs = schema_fields(schema)
    info: FieldInfo | None = None
    spec: FieldSpec | None = None
    for name in path.replace("[]", "").split("."):
        info = model.model_fields.get(name) if model is not None else None
        spec = next(candidate for candidate in specs if candidate.name == name)
        model = _model_in(info.annotation) if info is not None else None
        specs = spec.subfields
    assert spec is not None  # a path has at least one part
    return info, spec


def _sub_info(info: FieldInfo | None, name: str) -> FieldInfo | None:
    model = _model_in(info.annotation) if info is not None else None
    return model.model_fields.get(name) if model is not None else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, in a list, optional, or annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, typing.Annotated):
        for argument in typing.get_args(annotation):
            found = _model_in(argument)
            if found is not None:
                return found
    return None
