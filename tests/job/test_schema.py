"""The job's schema class: one that Pydantic validates with but cannot put into a JSON schema is refused
when the job loads, in one line naming the class and the field (the import errors are tested with the
job file, in test_spec.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.job.schema import resolve_schema
from pipeline.job.spec import load_job
from tests.support.jobs import write_job
from tests.support.schemas import Item

NO_JSON_SCHEMA = {
    "WithCallback": ("normalise", "core_schema.CallableSchema"),
    "WithArbitraryType": ("contacts.handle", "IsInstanceSchema (<class 'tests.support.schemas.Handle'>)"),
    "Node": ("hook", "core_schema.CallableSchema"),
}


@pytest.mark.parametrize("name", sorted(NO_JSON_SCHEMA))
def test_a_schema_without_a_json_schema_names_the_class_and_the_field(tmp_path: Path, name: str) -> None:
    field, reason = NO_JSON_SCHEMA[name]
    job = write_job(tmp_path, schema=f"tests.support.schemas:{name}")
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    said = str(caught.value)
    assert said.startswith(
        f"{job}: key 'schema': tests.support.schemas:{name}: field '{field}' cannot be put into a "
        "JSON schema, which every request sends (Cannot generate a JsonSchema for "
    ), said
    assert reason in said
    assert said.endswith("give it a type JSON can hold (str, int, float, bool, a list, a nested model)")
    assert "\n" not in said


def test_a_schema_whose_settings_fail_is_refused_without_blaming_a_field(tmp_path: Path) -> None:
    module = tmp_path / "refusing_schema.py"
    module.write_text(
        "from pydantic import BaseModel, ConfigDict\n"
        "class Thing(BaseModel):\n"
        "    model_config = ConfigDict(json_schema_extra=lambda schema: schema['no such key'])\n"
        "    title: str\n"
    )
    with pytest.raises(ConfigError) as caught:
        resolve_schema("refusing_schema:Thing", tmp_path / "job.yaml")
    said = str(caught.value)
    assert said.startswith(
        f"{tmp_path / 'job.yaml'}: key 'schema': refusing_schema:Thing: cannot be put into a JSON schema"
    ), said
    assert "field" not in said.split("(")[0] and "'no such key'" in said


def test_a_schema_with_a_json_schema_is_the_class_itself() -> None:
    assert resolve_schema("tests.support.schemas:Item", Path("jobs/job.yaml")) is Item
