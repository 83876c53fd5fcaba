"""Valid instances of a JSON schema, as a server with constrained decoding would produce.

Covers every construct Pydantic emits: objects (required and optional fields), dicts
(``additionalProperties``, ``patternProperties``, ``propertyNames``, ``min/maxProperties``), arrays
(``min/maxItems``, ``uniqueItems``, tuples as ``prefixItems``), strings (``format``: see
:mod:`pipeline.sim.formats`; ``pattern``: see :mod:`pipeline.sim.patterns`; lengths; JSON in a
string), numbers (integer or not, inclusive and exclusive bounds, ``multipleOf``), booleans, null,
``enum``/``const``, ``anyOf``/``oneOf`` (discriminated unions too), ``allOf``, and ``$ref`` into
``$defs``, recursive models included: past a depth only what the schema requires is written, so a
tree ends. Numbers rise through an object in field order, so pairs like minimum/maximum come out in
order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import orjson

from pipeline.sim.formats import formatted
from pipeline.sim.patterns import matching

WORDS = (
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
_DEEP = 5  # from this depth on, lists and dicts get their fewest items, optional fields none: trees end
_BOTTOM = 64  # a schema still nesting here requires itself: no finite instance exists
_UNIQUE_ATTEMPTS = 20  # draws of one item of a uniqueItems array before giving up on that item
# Values of each JSON type, to put where a schema refuses that type (the schema_invalid fault).
_WRONG: tuple[tuple[str, Any], ...] = (
    ("object", {"unexpected_field": 1}),
    ("array", ["unexpected"]),
    ("string", "unexpected"),
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

    def spoiled(self, value: Any) -> Any:
        """Valid JSON the root schema refuses, as a model without guided decoding gets it wrong: a
        required field left out (or, without one, a field of a type it refuses) and a field it does not
        declare; an answer with nothing that can be refused is put in a list, which no object is."""
        properties = self.top_level_properties()
        if properties is None or not isinstance(value, dict):
            wrong = self._refused(self._root)
            return wrong[0] if wrong else [value]
        spoiled = dict(value)
        required = [name for name in self._resolve(self._root).get("required", []) if name in spoiled]
        refusing = [(name, self._refused(properties[name])) for name in spoiled if name in properties]
        refusing = [(name, wrong) for name, wrong in refusing if wrong]
        if required:
            spoiled.pop(required[0])
        elif refusing:
            spoiled[refusing[0][0]] = refusing[0][1][0]
        spoiled["unexpected_field"] = 1
        return spoiled if required or refusing else [spoiled]

    def _refused(self, schema: dict[str, Any]) -> list[Any]:
        """Values of a JSON type ``schema`` does not take (none if it takes any type)."""
        kinds = self._kinds(schema, 0)
        return [] if kinds is None else [value for kind, value in _WRONG if kind not in kinds]

    def _kinds(self, schema: dict[str, Any], depth: int) -> set[str] | None:
        """The JSON types ``schema`` takes, or None for any."""
        schema = self._resolve(schema)
        options = schema.get("anyOf", schema.get("oneOf"))
        if isinstance(options, list) and depth < _BOTTOM:
            kinds: set[str] = set()
            for option in options:
                found = self._kinds(option, depth + 1)
                if found is None:
                    return None
                kinds |= found
            return kinds
        if "type" not in schema and not ({"const", "enum", "properties", "items"} & schema.keys()):
            return None
        return {_kind(schema)}

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            reference = str(schema["$ref"])
            if not reference.startswith("#"):
                raise ValueError(f"only local $ref is supported, got {reference}")
            node: Any = self._root
            for part in filter(None, reference[1:].split("/")):
                node = node[unquote(part).replace("~1", "/").replace("~0", "~")]
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
        if "allOf" in schema:
            schema = self._merged(schema)
        return schema

    def _merged(self, schema: dict[str, Any]) -> dict[str, Any]:
        """``allOf``'s parts as one schema: their properties and required fields together."""
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            for key, value in self._resolve(part).items():
                if key == "properties":
                    merged[key] = {**merged.get(key, {}), **value}
                elif key == "required":
                    merged[key] = [*merged.get(key, []), *value]
                else:
                    merged.setdefault(key, value)
        return merged

    def _value(self, schema: dict[str, Any], depth: int) -> Any:
        if depth > _BOTTOM:
            raise ValueError("the schema has no finite instance: a required field nests its own type")
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self._rng.choice(schema["enum"])
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                return self._value(self._option(schema[combinator], depth), depth)
        return self._of_type(_kind(schema), schema, depth)

    def _option(self, options: list[dict[str, Any]], depth: int) -> dict[str, Any]:
        """The option of a union drawn: null only deep down (a recursive model's end). A string beside
        another type is the lax side of a type (Decimal's number or text, ByteSize's integer or text)
        whose text has a grammar the schema does not give: the other side is drawn."""
        resolved = [self._resolve(option) for option in options]
        typed = [option for option in resolved if option.get("type") != "null"]
        if not typed or (depth >= _DEEP and len(typed) < len(resolved)):
            return {"type": "null"}
        preferred = [option for option in typed if option.get("type") != "string"] or typed
        return preferred[0] if len(preferred) == 1 else self._rng.choice(preferred)

    def _of_type(self, kind: str, schema: dict[str, Any], depth: int) -> Any:
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            self._counter += 1
            return number_in(schema, kind == "integer", self._counter)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema, depth)

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        required = set(schema.get("required", ()))
        value = {
            name: self._value(sub, depth + 1)
            for name, sub in properties.items()
            if depth < _DEEP or name in required
        }
        return value if properties else self._entries(schema, depth)

    def _entries(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        """A dict's entries: keys of ``propertyNames`` or a ``patternProperties`` pattern, else numbers
        (``dict[int, X]`` has the schema of ``dict[str, X]``: a number is a key both take)."""
        patterns = schema.get("patternProperties") or {}
        values = schema.get("additionalProperties", True)
        if not patterns and values is False:
            return {}
        count = self._count(schema, "minProperties", "maxProperties", depth)
        entries: dict[str, Any] = {}
        for attempt in range(count * _UNIQUE_ATTEMPTS):
            if len(entries) == count:
                break
            if patterns:
                pattern, sub = self._rng.choice(list(patterns.items()))
                key = matching(pattern, self._rng) or str(attempt + 1)
            else:
                sub = values if isinstance(values, dict) else {}
                key = self._key(schema.get("propertyNames"), len(entries) + 1, depth)
            if key not in entries:
                entries[key] = self._value(sub, depth + 1)
        return entries

    def _key(self, names: dict[str, Any] | None, number: int, depth: int) -> str:
        if names is None:
            return str(number)
        key = self._value(names, depth + 1)
        return key if isinstance(key, str) else orjson.dumps(key).decode()

    def _count(self, schema: dict[str, Any], least: str, most: str, depth: int, fixed: int = 0) -> int:
        """How many items (or entries): at least one near the top, up to three more than the least."""
        low = int(schema.get(least, 1 if depth < 3 else 0))
        high = int(schema.get(most, max(low, fixed, 3)))
        if depth >= _DEEP:
            return max(low, fixed)
        return max(fixed, self._rng.randint(low, max(low, min(high, low + 3))))

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", {})
        closed = items is False or ("items" not in schema and prefix)
        count = len(prefix) if closed else self._count(schema, "minItems", "maxItems", depth, len(prefix))
        subs = [*prefix, *[items if isinstance(items, dict) else {}] * (count - len(prefix))]
        if not schema.get("uniqueItems"):
            return [self._value(sub, depth + 1) for sub in subs]
        values: list[Any] = []
        seen: set[bytes] = set()
        for sub in subs:  # an item drawn again and again until it is new, or left out
            for _ in range(_UNIQUE_ATTEMPTS):
                value = self._value(sub, depth + 1)
                key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
                if key not in seen:
                    seen.add(key)
                    values.append(value)
                    break
        return values

    def _string(self, schema: dict[str, Any], depth: int) -> str:
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if "contentSchema" in schema or schema.get("contentMediaType") == "application/json":
            return orjson.dumps(self._value(schema.get("contentSchema", {}), depth + 1)).decode()
        if "format" in schema:
            text = formatted(str(schema["format"]), self._rng, WORDS)
            if text is not None and low <= len(text) <= (len(text) if high is None else int(high)):
                return text
        if "pattern" in schema:
            found = matching(str(schema["pattern"]), self._rng, low, None if high is None else int(high))
            if found is not None:
                return found
            # No draw matched (a pattern Python cannot read, lookarounds or lengths no draw met): words,
            # as a model without guided decoding would write, rather than no answer at all.
        return self._text(max(low, 1), None if high is None else int(high))

    def _text(self, low: int, high: int | None) -> str:
        """Words, at least ``low`` characters and at most ``high``."""
        if self._words:
            start = self._rng.randrange(len(self._words))
            quoted = " ".join(self._words[start : start + self._rng.randint(1, 3)])
            if low <= len(quoted) <= (len(quoted) if high is None else high):
                return quoted
        text = " ".join(self._rng.sample(WORDS, 2))
        while len(text) < low:
            text += " " + self._rng.choice(WORDS)
        cut = text[:high].rstrip()
        return cut if len(cut) >= low else text[:high]


def _kind(schema: dict[str, Any]) -> str:
    """The JSON type a schema asks for: its ``type`` (the first besides null), else what its keywords
    imply (a schema of no keyword, Pydantic's ``Any``, gets text)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "const" in schema or "enum" in schema:
        values = schema.get("enum", [schema.get("const")])
        return _kind_of(values[0]) if values else "null"
    if {"properties", "additionalProperties", "patternProperties", "propertyNames"} & schema.keys():
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    numeric = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    return "number" if numeric & schema.keys() else "string"


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    kinds = {dict: "object", list: "array", str: "string", int: "integer", float: "number"}
    return next((kind for type_, kind in kinds.items() if isinstance(value, type_)), "null")


def number_in(schema: dict[str, Any], integer: bool, rise: int) -> int | float:
    """A number ``schema`` takes: ``rise`` above its lower bound (0 without one), within its bounds
    (inclusive or exclusive) and on its ``multipleOf`` grid (an integer's grid is at least 1)."""
    low, low_open = _bound(schema, "minimum", "exclusiveMinimum", max)
    high, high_open = _bound(schema, "maximum", "exclusiveMaximum", min)
    value: float = (low if low is not None else 0) + rise
    unit = schema.get("multipleOf")
    if integer and not (isinstance(unit, int | float) and unit == int(unit) and unit > 0):
        unit = 1
    if isinstance(unit, int | float) and unit > 0:
        first = None if low is None else math.ceil(low / unit)
        if first is not None and low is not None and low_open and first * unit <= low:
            first += 1
        last = None if high is None else math.floor(high / unit)
        if last is not None and high is not None and high_open and last * unit >= high:
            last -= 1
        steps = round(value / unit)
        steps = steps if last is None else min(steps, last)
        steps = steps if first is None else max(steps, first)  # none between the bounds: the lowest
        return int(steps * unit) if integer else float(steps * unit)
    if high is not None and (value > high or (high_open and value >= high)):
        value = high - 1 if high_open else high
    if low is not None and (value < low or (low_open and value <= low)):
        value = (low + high) / 2 if high is not None else low + 1
    return float(value)


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, tighter: Any) -> tuple[float | None, bool]:
    """The tighter of a bound's inclusive and exclusive forms (draft 4's boolean exclusive is ignored)."""
    closed = schema.get(inclusive)
    opened = schema.get(exclusive)
    closed = closed if isinstance(closed, int | float) and not isinstance(closed, bool) else None
    opened = opened if isinstance(opened, int | float) and not isinstance(opened, bool) else None
    if opened is None:
        return closed, False
    if closed is None or tighter(opened, closed) == opened:
        return opened, True
    return closed, False
