"""Valid instances of every schema construct Pydantic emits, numbers within their bounds, recursive
models that end, and answers the schema refuses (the schema_invalid fault)."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict, RootModel, ValidationError

from pipeline.sim.instances import InstanceGenerator, number_in
from schemas.linkedin import JobPosting
from tests.support.schema_constructs import EveryConstruct, Node
from tests.support.schemas import Item, Mentions

SEEDS = range(200)


def instances(model: type[BaseModel], seeds: range = SEEDS) -> list[Any]:
    schema = model.model_json_schema()
    return [InstanceGenerator(schema, random.Random(seed)).generate() for seed in seeds]


def test_every_construct_pydantic_emits_gets_valid_instances() -> None:
    for value in instances(EveryConstruct):
        EveryConstruct.model_validate_json(orjson.dumps(value))  # as the pipeline reads an answer


def test_instances_of_the_shipped_and_test_schemas_respect_bounds_and_validators() -> None:
    for model in (JobPosting, Item, Mentions):
        for value in instances(model):
            model.model_validate_json(orjson.dumps(value))


def test_instances_vary_as_a_model_s_answers_do() -> None:
    """Each side of a union, each member of an enum, lists of several lengths and trees of some depth
    turn up across records: the constructs are exercised, not answered the one way that validates."""
    answers = instances(EveryConstruct)
    assert {answer["pet"]["kind"] for answer in answers} == {"cat", "dog"}
    assert {answer["level"] for answer in answers} == {1, 2, 3}
    assert {type(answer["either"]) for answer in answers} == {int}  # the number side: see _option
    assert len({len(answer["few"]) for answer in answers}) == 3  # 2, 3 and 4 items
    assert max(depth(answer["tree"]) for answer in answers) >= 4
    assert all(len(set(answer["frozen"])) == len(answer["frozen"]) for answer in answers)
    assert len({answer["day"] for answer in answers}) > 150


def depth(node: dict[str, Any]) -> int:
    below = [*node.get("children", []), *([node["parent"]] if node.get("parent") else [])]
    return 1 + max((depth(child) for child in below), default=0)


def test_a_recursive_model_ends_within_a_bounded_depth() -> None:
    trees = instances(Node, range(500))
    for tree in trees:
        Node.model_validate(tree)
    assert max(depth(tree) for tree in trees) <= 6


def test_a_schema_whose_required_field_nests_itself_is_refused_with_the_reason() -> None:
    schema = {
        "$defs": {
            "Loop": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Loop"}}, "required": ["next"]}
        },
        "$ref": "#/$defs/Loop",
    }
    with pytest.raises(ValueError, match="no finite instance"):
        InstanceGenerator(schema, random.Random(1)).generate()


def test_hand_written_constructs_pydantic_no_longer_emits() -> None:
    """allOf (Pydantic before 2.9 wrapped a described $ref in it), a type list, a $ref with escapes, a
    draft-4 boolean exclusiveMinimum, a closed tuple without maxItems."""
    schema = {
        "$defs": {
            "a/b": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 5}},
                "required": ["x"],
            }
        },
        "type": "object",
        "properties": {
            "merged": {"allOf": [{"$ref": "#/$defs/a~1b"}, {"properties": {"y": {"type": "string"}}}]},
            "either": {"type": ["null", "integer"], "maximum": 3},
            "draft4": {"type": "number", "minimum": 2, "exclusiveMinimum": True},
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "boolean"}],
                "items": False,
            },
        },
    }
    for seed in range(50):
        value = InstanceGenerator(schema, random.Random(seed)).generate()
        assert value["merged"]["x"] >= 5 and isinstance(value["merged"]["y"], str)
        assert isinstance(value["either"], int) and value["either"] <= 3
        assert value["draft4"] >= 2
        assert [type(item) for item in value["pair"]] == [str, bool]


def test_unique_items_drawn_until_new_and_none_repeated_where_too_few_exist() -> None:
    schema = {
        "type": "array",
        "items": {"enum": ["a", "b"]},
        "uniqueItems": True,
        "minItems": 2,
        "maxItems": 5,
    }
    for seed in range(50):
        value = InstanceGenerator(schema, random.Random(seed)).generate()
        assert sorted(value) == ["a", "b"]


def test_dict_keys_follow_property_names_and_pattern_properties() -> None:
    answers = instances(EveryConstruct)
    assert {key for answer in answers for key in answer["by_key"]} == {"a", "b"}
    assert all(key[0] == "k" and key[1].isdigit() for answer in answers for key in answer["by_code"])
    assert all(1 <= len(answer["bounded_dict"]) <= 2 for answer in answers)
    assert all(int(key) for answer in answers for key in answer["by_number"])  # keys dict[int, X] takes


@pytest.mark.parametrize(
    ("schema", "integer"),
    [
        ({"minimum": 3, "maximum": 7, "multipleOf": 2}, True),
        ({"exclusiveMinimum": 0, "exclusiveMaximum": 1}, False),
        ({"exclusiveMinimum": 1, "multipleOf": 0.25}, False),
        ({"exclusiveMinimum": 0.3, "maximum": 0.5, "multipleOf": 0.1}, False),
        ({"exclusiveMaximum": 0}, True),
        ({"maximum": -5}, False),
        ({"minimum": 0.5, "maximum": 2.5}, True),
        ({"exclusiveMinimum": 10, "exclusiveMaximum": 12}, True),
        ({"minimum": 1e6}, False),
    ],
)
def test_numbers_keep_within_every_bound_and_on_their_grid(schema: dict[str, Any], integer: bool) -> None:
    for rise in range(1, 60):
        value = number_in(schema, integer, rise)
        assert isinstance(value, int if integer else float)
        assert value >= schema.get("minimum", -math.inf) and value <= schema.get("maximum", math.inf)
        assert value > schema.get("exclusiveMinimum", -math.inf)
        assert value < schema.get("exclusiveMaximum", math.inf)
        if "multipleOf" in schema:
            steps = value / schema["multipleOf"]
            assert math.isclose(steps, round(steps), abs_tol=1e-9)


def test_numbers_rise_in_field_order_so_ordered_pairs_stay_ordered() -> None:
    values = [number_in({"minimum": 0}, True, rise) for rise in range(1, 10)]
    assert values == sorted(values) and len(set(values)) == len(values)


class _Optional(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = None
    count: int = 0


class _Open(BaseModel):
    anything: Any = None


@pytest.mark.parametrize(
    "model", [Item, JobPosting, EveryConstruct, _Optional, _Open, RootModel[list[int]], RootModel[str]]
)
def test_a_spoiled_answer_is_refused_by_its_schema(model: type[BaseModel]) -> None:
    """A required field left out, else a field of a type it refuses, else not even an object: whatever
    the schema, the schema_invalid fault's answer never validates (yet is valid JSON)."""
    schema = model.model_json_schema()
    for seed in range(20):
        generator = InstanceGenerator(schema, random.Random(seed))
        valid = generator.generate()
        model.model_validate_json(orjson.dumps(valid))
        spoiled = generator.spoiled(valid)
        with pytest.raises(ValidationError):
            model.model_validate_json(orjson.dumps(spoiled))


def test_a_spoiled_answer_leaves_out_the_first_required_field_and_adds_one() -> None:
    generator = InstanceGenerator(Item.model_json_schema(), random.Random(1))
    valid = generator.generate()
    spoiled = generator.spoiled(valid)
    assert "title" not in spoiled and spoiled["unexpected_field"] == 1
    assert {k: v for k, v in spoiled.items() if k != "unexpected_field"} == {
        k: v for k, v in valid.items() if k != "title"
    }


def test_the_empty_value_of_a_field() -> None:
    schema = Mentions.model_json_schema()
    generator = InstanceGenerator(schema, random.Random(1))
    properties = schema["properties"]
    assert [generator.empty(properties[name]) for name in ("title", "skills", "years")] == [None, [], None]
    assert generator.empty({"type": "string"}) == ""


def test_text_is_copied_from_the_record_where_the_schema_allows() -> None:
    words = ("Python", "and", "SQL", "in", "Berlin")
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string", "maxLength": 2}},
    }
    seen: Counter[str] = Counter()
    for seed in range(30):
        value = InstanceGenerator(schema, random.Random(seed), words).generate()
        assert value["a"] in " ".join(words) and len(value["b"]) <= 2
        seen[value["a"]] += 1
    assert len(seen) > 3
