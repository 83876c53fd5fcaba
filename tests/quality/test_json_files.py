"""The one reader of files of JSON objects (gold, judgments, examples): a ``.json`` list or JSON lines,
each object with the line it starts on, and every problem one line naming the file and the line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.quality.json_files import read_json_objects


def read(path: Path, text: str | bytes) -> list[tuple[int, dict[str, object]]]:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return [(found.line, found.value) for found in read_json_objects(path, "the test file")]


def test_json_lines_give_each_object_its_line_and_skip_blank_ones(tmp_path: Path) -> None:
    text = '\ufeff{"a": 1}\n\n  \n{"b": "x\u2028y"}\r\n{"c": [1,\t2]}'  # a BOM, CRLF, U+2028 in a string
    assert read(tmp_path / "f.jsonl", text) == [(1, {"a": 1}), (4, {"b": "x\u2028y"}), (5, {"c": [1, 2]})]
    assert read(tmp_path / "f.anything", '{"a": 1}\n') == [(1, {"a": 1})]  # only .json is a list
    assert read(tmp_path / "empty.jsonl", "\n \n") == []


def test_a_json_list_gives_each_item_the_line_it_starts_on(tmp_path: Path) -> None:
    text = '[\n  {"a": 1},\n\n  {"b": {"c": [\n    2]}}, {"d": 3}\n]\n'
    assert read(tmp_path / "f.json", text) == [(2, {"a": 1}), (4, {"b": {"c": [2]}}), (5, {"d": 3})]
    assert read(tmp_path / "F.JSON", '\ufeff[{"a": 1}]') == [(1, {"a": 1})]
    assert read(tmp_path / "none.json", "[]") == read(tmp_path / "blank.json", " \n") == []


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("f.jsonl", '{"a": 1}\n{"a": 2,\n', "line 2: invalid JSON (unexpected end of data, column 9)"),
        ("f.jsonl", '{"a": 1}\n[1, 2]\n', "line 2: expected a JSON object, got list"),
        ("f.jsonl", "null\n", "line 1: expected a JSON object, got null"),
        ("f.json", '{"a": 1}', "expected a JSON list of objects, got dict"),
        ("f.json", '[{"a": 1},\n 2]', "line 2: expected a JSON object, got int"),
        ("f.json", '[{"a": 1},\n{"a": 2]', "line 2: invalid JSON (expecting ',' delimiter, column 8)"),
        ("f.json", '[{"a": 1}\n {"a": 2}]', "line 2: invalid JSON (expected ',' or ']', column 2)"),
        ("f.json", '[{"a": 1},\n{"a": NaN}]', "line 2: invalid JSON (NaN is not a JSON value, column 1)"),
        ("f.json", '[{"a": 1},\n', "line 2: invalid JSON (expecting value, column 1)"),
        ("f.json", '[{"a": 1}', "line 1: invalid JSON (unexpected end, column 10)"),
        ("f.json", '[{"a": 1}]\n[]', "line 2: invalid JSON (more after the list, column 1)"),
    ],
)
def test_every_problem_is_one_line_naming_the_file_and_the_line(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    path = tmp_path / name
    with pytest.raises(ConfigError, match="^" + re.escape(f"{path}: {problem}") + "$"):
        read(path, text)


def test_a_file_that_cannot_be_read_is_said_with_what_it_is(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ConfigError, match="^" + re.escape(f"{missing}: cannot read the test file (No such")):
        read_json_objects(missing, "the test file")
    latin1 = tmp_path / "latin1.jsonl"
    with pytest.raises(ConfigError, match="^" + re.escape(f"{latin1}: not UTF-8 text (byte 10)") + "$"):
        read(latin1, '{"a": "caf\xe9"}'.encode("latin-1"))
