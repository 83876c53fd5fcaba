from __future__ import annotations

from pathlib import Path

import orjson

from pipeline.extraction.prompt import SCHEMA_INSTRUCTION, PromptBuilder, client_settings, response_format_for
from pipeline.job.spec import load_job
from tests.support.jobs import write_job
from tests.support.schemas import Item


def test_system_prompt_is_static_and_first_record_is_last(tmp_path: Path) -> None:
    prompts = PromptBuilder(load_job(write_job(tmp_path)))
    first = prompts.request_for({"title": "A", "description": "one"})
    second = prompts.request_for({"title": "B", "description": "two"})
    assert first.messages[0] is second.messages[0]  # one shared prefix for the prefix cache
    assert first.messages[0]["content"].startswith("Extract the posting.")
    assert first.messages[1] == {"role": "user", "content": "Title: A\n\none"}
    assert first.max_tokens == 256


def test_schema_with_descriptions_is_in_the_system_prompt(tmp_path: Path) -> None:
    system = PromptBuilder(load_job(write_job(tmp_path))).system_message["content"]
    schema_text = system.split(SCHEMA_INSTRUCTION, 1)[1].strip()
    assert orjson.loads(schema_text) == Item.model_json_schema()
    without = PromptBuilder(load_job(write_job(tmp_path, prompt={"include_schema": False}))).system_message
    assert without["content"] == "Extract the posting."


def test_missing_values_render_empty_and_literal_braces_survive(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path, prompt={"user": "{{json}} {title}|{description}"}))
    request = PromptBuilder(spec).request_for({"title": None, "description": 42})
    assert request.messages[1]["content"] == "{json} |42"


def test_response_format_and_switching_it_off(tmp_path: Path) -> None:
    response_format = response_format_for(Item)
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"] == {
        "name": "Item",
        "schema": Item.model_json_schema(),
        "strict": True,
    }
    assert client_settings(load_job(write_job(tmp_path))).response_format == response_format
    off = load_job(write_job(tmp_path, endpoint={"structured_output": False}))
    assert client_settings(off).response_format is None
