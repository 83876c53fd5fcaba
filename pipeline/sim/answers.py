"""What the simulated model says: a valid instance of the requested JSON schema (or filler text),
reasoning that shares ``max_tokens`` with the answer, and the faults that spoil an answer.

Each top-level field of the instance depends only on the seed, the record's message and the field's name
(:class:`Draws`), as a model at temperature 0 would answer: a re-ask, a retry or a second run gets the
same content for a record. :class:`Variation` makes answers vary as a real server's do: some noise per
request (vLLM at temperature 0 is not deterministic across batches), fields that depend on the system
prompt (another prompt, another answer), and fields a changed source leaves empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.sim.instances import InstanceGenerator

# Re-exported: the tests of other packages count prompts through here.
from pipeline.sim.tokens import CHARS_PER_TOKEN as CHARS_PER_TOKEN
from pipeline.sim.tokens import prompt_tokens as prompt_tokens

DEFAULT_REASONING_TOKENS = {"minimal": 16, "low": 64, "medium": 256, "high": 1024}
DEFAULT_EFFORT = "medium"  # gpt-oss's default when the request names none
_REASONING_SENTENCE = "Let me work through the posting. "  # 6 tokens
_FILLER = "lorem ipsum dolor sit amet consectetur "
# How the pipeline's re-asks open ("Your previous reply was rejected: ...", "... was cut off ..."): a
# model asked again answers the same record, so a retry draws what the record's first request drew.
RETRY_INSTRUCTION_PREFIX = "Your previous reply"


@dataclass(frozen=True, slots=True)
class Answer:
    content: str | None
    reasoning: str | None
    finish_reason: str
    completion_tokens: int
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class Variation:
    """How answers vary besides the record."""

    noise: float = 0.0  # the chance that a top-level field is drawn afresh for a request
    prompt_sensitive: frozenset[str] = field(default_factory=frozenset)  # depend on the system prompt too
    empty: frozenset[str] = field(default_factory=frozenset)  # always answered empty: null, [] or ""
    quoted: bool = False  # text values are runs of words copied from the record, as an extractor's are


def _first(messages: list[dict[str, Any]], role: str) -> str:
    first = next((m.get("content") for m in messages if m.get("role") == role), None)
    return _text(first)


def _record(messages: list[dict[str, Any]]) -> str:
    """The record's message: the last user message that is not a retry's instruction. (Few-shot
    examples come first, as user/assistant turns, so the first user message is an example's.)"""
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    while len(users) > 1 and users[-1].startswith(RETRY_INSTRUCTION_PREFIX):
        users.pop()
    return users[-1] if users else ""


def _text(content: object) -> str:
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def _seeded(text: str) -> random.Random:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


class Draws:
    """Where an answer's values come from: per top-level field, a generator seeded by the seed, the
    record's message (:func:`_record`: a re-ask draws the same content) and the field's name, and for
    a prompt-sensitive field the system prompt too; with noise, now and then the request's own
    generator instead."""

    def __init__(
        self, seed: int, messages: list[dict[str, Any]], variation: Variation, request: random.Random
    ) -> None:
        self._seed = seed
        self._record = _record(messages)
        # A label of the prompt's template ("Title:") is not the record's: a copied phrase leaves it out.
        self.words = tuple(word for word in self._record.split() if not word.endswith(":"))
        self._system = _first(messages, "system") if variation.prompt_sensitive else ""
        self.variation = variation
        self._request = request

    def whole(self) -> random.Random:
        """For an answer that is not an object of fields."""
        return _seeded(f"{self._seed}\n{self._record}")

    def field(self, name: str) -> random.Random:
        if self.variation.noise and self._request.random() < self.variation.noise:
            return random.Random(self._request.getrandbits(64))
        system = self._system if name in self.variation.prompt_sensitive else ""
        return _seeded(f"{self._seed}\n{name}\n{system}\n{self._record}")


def plan_answer(
    body: dict[str, Any], draws: Draws, fault: str | None, reasoning_table: dict[str, int]
) -> Answer:
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1024)
    effort = str(body.get("reasoning_effort") or DEFAULT_EFFORT)
    reasoning_tokens = reasoning_table.get(effort, reasoning_table.get(DEFAULT_EFFORT, 256))
    if body.get("ignore_eos"):  # vLLM's benchmark switch: generate exactly max_tokens
        filler_tokens = max(0, max_tokens - reasoning_tokens)
        text = (_FILLER * (filler_tokens * CHARS_PER_TOKEN // len(_FILLER) + 1))[
            : filler_tokens * CHARS_PER_TOKEN
        ]
        return spend_budget(text, reasoning_tokens, max_tokens, force_length=False, exact=True)
    text = answer_text(body, draws, fault)
    return spend_budget(text, reasoning_tokens, max_tokens, fault == "length")


def answer_value(schema: dict[str, Any], draws: Draws, fault: str | None = None) -> Any:
    """A valid instance of ``schema``, each top-level field from its own draws (``empty`` ones empty);
    with the ``schema_invalid`` fault, one the schema refuses."""
    generator = InstanceGenerator(schema, draws.whole(), draws.words if draws.variation.quoted else ())
    properties = generator.top_level_properties()
    if properties is None:
        value = generator.generate()
    else:
        empty = draws.variation.empty
        value = {
            name: generator.empty(sub) if name in empty else generator.value_with(sub, draws.field(name))
            for name, sub in properties.items()
        }
    return generator.spoiled(value) if fault == "schema_invalid" else value


def answer_text(body: dict[str, Any], draws: Draws, fault: str | None) -> str:
    schema = requested_schema(body)
    value = answer_value(schema, draws, fault) if schema else {"answer": "simulated"}
    if fault == "schema_invalid" and not schema:
        value["unexpected_field"] = 1
    text = orjson.dumps(value).decode()
    return _cut(text) if fault == "invalid_json" else text


def _cut(text: str) -> str:
    """The answer cut halfway and an unclosed string begun: never JSON, even where the half left is
    (a bare number or text as the answer: then an object is opened before it)."""
    cut = text[: max(1, len(text) // 2)] + ' "'
    try:
        orjson.loads(cut)
    except orjson.JSONDecodeError:
        return cut
    return "{" + cut


def spend_budget(
    answer: str, reasoning_tokens: int, max_tokens: int, force_length: bool, exact: bool = False
) -> Answer:
    """Reasoning first, then the answer, all from one ``max_tokens`` budget, as gpt-oss does."""
    answer_tokens = (
        max(1, len(answer) // CHARS_PER_TOKEN) if not exact else max(0, max_tokens - reasoning_tokens)
    )
    reasoning = _REASONING_SENTENCE * max(1, reasoning_tokens // 6) if reasoning_tokens else None
    if reasoning_tokens >= max_tokens:
        cut = (reasoning or "")[: max_tokens * CHARS_PER_TOKEN]
        return Answer(None, cut, "length", max_tokens, max_tokens)
    room = max_tokens - reasoning_tokens
    if force_length:
        room = min(room, max(1, answer_tokens // 2))
    if answer_tokens > room:
        return Answer(
            answer[: room * CHARS_PER_TOKEN], reasoning, "length", reasoning_tokens + room, reasoning_tokens
        )
    finish = "length" if exact else "stop"
    return Answer(answer, reasoning, finish, reasoning_tokens + answer_tokens, reasoning_tokens)


def in_reasoning(answer: Answer) -> Answer:
    """The answer as gpt-oss's reasoning parser mangles it under structured output (vLLM issue 23694):
    the JSON in the reasoning field instead of the thinking, and content null."""
    if answer.content is None:
        return answer
    return dataclasses.replace(answer, content=None, reasoning=answer.content)


def requested_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema from ``response_format``, or else one embedded in the system prompt."""
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return schema if isinstance(schema, dict) else None
    for message in body.get("messages", []):
        if message.get("role") == "system" and (found := _embedded(str(message.get("content") or ""))):
            return found
    return None


def _embedded(content: str) -> dict[str, Any] | None:
    """The JSON object that ends ``content`` (the schema is the prompt's last part): an example of
    JSON in the words before it is not the schema."""
    start = content.find('{"')
    while start >= 0:
        try:
            found = orjson.loads(content[start:])
        except orjson.JSONDecodeError:
            start = content.find('{"', start + 1)
            continue
        return found if isinstance(found, dict) else None
    return None
