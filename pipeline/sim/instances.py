"""Valid instances of a JSON schema, as a server with constrained decoding would produce.

Covers what Pydantic emits: objects, arrays, strings, numbers, booleans, null, enum/const,
anyOf/oneOf/allOf, ``$ref`` into ``$defs``, and the usual bounds. Numbers rise through an object in
field order, so pairs like minimum/maximum come out in order.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from re import _parser  # type: ignore[attr-defined]  # the stdlib's own regex parser
from typing import Any

_WORDS = (
    "analysis",
    "budget",
    "client",
    "data",
    "delivery",
    "design",
    "engineering",
    "finance",
    "growth",
    "leadership",
    "operations",
    "planning",
    "quality",
    "reporting",
    "safety",
    "sales",
    "service",
    "strategy",
    "support",
    "systems",
    "team",
    "testing",
    "training",
    "writing",
)


class InstanceGenerator:
    """``words``: text values are runs of one to three of these in a row (a phrase copied from the
    record), where the schema allows; without them, words of a fixed list."""

    def __init__(self, schema: dict[str, Any], rng: random.Random, words: Sequence[str] = ()) -> None:
        self._root = schema
        self._rng = rng
        self._counter = 0
        self._words = words

    def generate(self) -> Any:
        return self._value(self._root, depth=0)

    def top_level_properties(self) -> dict[str, Any] | None:
        """The root object's properties (None when the root is not an object of fields)."""
        root = self._resolve(self._root)
        properties = root.get("properties")
        return properties if root.get("type", "object") == "object" and isinstance(properties, dict) else None

    def value_with(self, schema: dict[str, Any], rng: random.Random) -> Any:
        """A value of a top-level field's ``schema`` drawn from ``rng``."""
        self._rng = rng
        return self._value(schema, depth=1)

    def empty(self, schema: dict[str, Any]) -> Any:
        """The empty value of a field: null if it may be null, else [] for a list and "" for text."""
        schema = self._resolve(schema)
        options = [self._resolve(option) for option in schema.get("anyOf", schema.get("oneOf", []))]
        kinds = schema.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "null" in kinds or any(option.get("type") == "null" for option in options):
            return None
        if "array" in kinds:
            return []
        return "" if "string" in kinds else None

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            reference = str(schema["$ref"])
            if not reference.startswith("#/"):
                raise ValueError(f"only local $ref is supported, got {reference}")
            node: Any = self._root
            for part in reference[2:].split("/"):
                node = node[part]
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
        return schema

    def _value(self, schema: dict[str, Any], depth: int) -> Any:
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self._rng.choice(schema["enum"])
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                options = [self._resolve(option) for option in schema[combinator]]
                non_null = [option for option in options if option.get("type") != "null"]
                return self._value(non_null[0] if non_null else options[0], depth)
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(self._resolve(part))
            return self._value(merged, depth)
        kind = schema.get("type", "object" if "properties" in schema else "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        return self._of_type(str(kind), schema, depth)

    def _of_type(self, kind: str, schema: dict[str, Any], depth: int) -> Any:
        if kind == "object":
            properties = schema.get("properties", {})
            return {name: self._value(sub, depth + 1) for name, sub in properties.items()}
        if kind == "array":
            low = int(schema.get("minItems", 1 if depth < 3 else 0))
            high = int(schema.get("maxItems", max(low, 3)))
            count = self._rng.randint(low, max(low, min(high, low + 3)))
            return [self._value(schema.get("items", {}), depth + 1) for _ in range(count)]
        if kind in ("integer", "number"):
            return self._number(kind, schema)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema)

    def _number(self, kind: str, schema: dict[str, Any]) -> int | float:
        self._counter += 1
        low = float(schema.get("minimum", schema.get("exclusiveMinimum", 0)))
        high = float(schema.get("maximum", schema.get("exclusiveMaximum", low + 1000)))
        value = min(high, low + self._counter)
        if "exclusiveMinimum" in schema and value <= low:
            value = low + 1
        return int(value) if kind == "integer" else float(value)

    def _string(self, schema: dict[str, Any]) -> str:
        if "pattern" in schema:
            return _matching(str(schema["pattern"]), self._rng)
        low = int(schema.get("minLength", 1))
        high = int(schema.get("maxLength", 60))
        if self._words:
            start = self._rng.randrange(len(self._words))
            quoted = " ".join(self._words[start : start + self._rng.randint(1, 3)])
            if low <= len(quoted) <= high:
                return quoted
        text = " ".join(self._rng.sample(_WORDS, 2))
        while len(text) < low:
            text += " " + self._rng.choice(_WORDS)
        return text[:high]


def _matching(pattern: str, rng: random.Random) -> str:
    """A string that fully matches ``pattern`` (literals, classes, groups, alternation, repeats)."""
    text = "".join(_from_tokens(_parser.parse(pattern), rng))
    if not re.fullmatch(pattern, text):
        raise ValueError(f"cannot generate a string for the pattern {pattern!r}")
    return text


def _from_tokens(tokens: Any, rng: random.Random) -> list[str]:
    out: list[str] = []
    for op, value in tokens:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(value))
        elif name == "IN":
            out.append(_from_class(value, rng))
        elif name == "ANY":
            out.append(rng.choice("abcxyz"))
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            low, high, inner = value
            for _ in range(rng.randint(low, min(high, low + 3))):
                out.extend(_from_tokens(inner, rng))
        elif name == "SUBPATTERN":
            out.extend(_from_tokens(value[-1], rng))
        elif name == "BRANCH":
            out.extend(_from_tokens(rng.choice(value[1]), rng))
        elif name != "AT":  # anchors produce nothing
            raise ValueError(f"unsupported regular expression element {name}")
    return out


def _from_class(items: Any, rng: random.Random) -> str:
    op, value = items[0]
    name = str(op)
    if name == "LITERAL":
        return chr(value)
    if name == "RANGE":
        return chr(rng.randint(value[0], value[1]))
    if name == "CATEGORY":
        return {"CATEGORY_DIGIT": "7", "CATEGORY_SPACE": " "}.get(str(value), "a")
    raise ValueError(f"unsupported character class element {name}")
