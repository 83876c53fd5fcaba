"""The version key: which job changes make results stale, and for which cause."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec, load_job
from pipeline.source.versions import (
    JOB_CAUSES,
    JobVersion,
    StaleCause,
    content_hash_sql,
    digest,
    parse_causes,
    stale_conditions,
    version_of,
)
from tests.support.jobs import write_job


def version_parts(tmp_path: Path, **overrides: Any) -> tuple[str, str, str, str, str]:
    folder = tmp_path / str(len(list(tmp_path.iterdir())))
    folder.mkdir()
    version = version_of(load_job(write_job(folder, **overrides)))
    return (
        version.prompt_hash,
        version.schema_hash,
        version.model,
        version.settings_hash,
        version.content_fields,
    )


NOT_PART_OF_IT = [
    {"concurrency": 3},
    {"request_timeout_s": 5},
    {"retry": {"reasks": 0, "transient_retries": 1, "max_tokens_ceiling": 99999}},
    {"operations": {"shutdown_grace_s": 1, "stall_warning_s": 5}},
    {"output": {"results_table": "other_results"}},
    {"name": "renamed"},
    {"database": "elsewhere.duckdb"},
    {"endpoint": {"base_url": "http://elsewhere:9/v1", "api_key_env": "SOME_KEY"}},
    {"source": {"batch_size": 7}},
]


@pytest.mark.parametrize("overrides", NOT_PART_OF_IT)
def test_settings_that_do_not_shape_the_answer_change_nothing(tmp_path: Path, overrides: Any) -> None:
    assert version_parts(tmp_path, **overrides) == version_parts(tmp_path)


PART_OF_IT = [
    ({"prompt": {"system": "Other."}}, 0),
    ({"prompt": {"user": "{title}"}}, 0),
    ({"prompt": {"include_schema": False}}, 0),
    (
        {
            "prompt": {
                "examples": [
                    {
                        "input": {"title": "T", "description": "D"},
                        "output": {"title": "T", "skills": []},
                    }
                ]
            }
        },
        0,
    ),
    ({"schema": "tests.support.schemas:Item2"}, 1),
    ({"model": "other-model"}, 2),
    ({"max_tokens": 999}, 3),
    ({"temperature": 0.7}, 3),
    ({"reasoning_effort": "high"}, 3),
    ({"extra_body": {"top_k": 5}}, 3),
    ({"endpoint": {"structured_output": False}}, 3),
]


@pytest.mark.parametrize(("overrides", "part"), PART_OF_IT)
def test_each_change_moves_exactly_its_own_part(tmp_path: Path, overrides: Any, part: int) -> None:
    base, changed = version_parts(tmp_path), version_parts(tmp_path, **overrides)
    differing = [index for index in range(5) if base[index] != changed[index]]
    expected = [part, 4] if overrides.get("prompt", {}).get("user") == "{title}" else [part]
    assert differing == expected


def test_content_fields_are_the_template_fields_in_order_once(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path, prompt={"user": "{description} / {title} / {description}"}))
    assert spec.content_fields() == ("description", "title")
    assert version_of(spec).content_fields == "description,title"


def test_the_content_hash_is_stable_and_separates_fields() -> None:
    connection = duckdb.connect()
    connection.execute("CREATE TABLE t (id INT, a VARCHAR, b VARCHAR)")
    connection.execute("INSERT INTO t VALUES (1, 'ab', 'c'), (2, 'a', 'bc'), (3, NULL, 'c'), (4, '', 'c')")
    hashes = dict(connection.execute(f"SELECT id, {content_hash_sql(['a', 'b'])} FROM t s").fetchall())
    assert hashes[1] != hashes[2]  # the text cannot shift from one field into the next
    assert hashes[3] == hashes[4]  # NULL is sent as an empty string
    # the lower 64 bits of md5("2:ab1:c"): the same value in every DuckDB version, unlike DuckDB's hash()
    assert hashes[1] == int.from_bytes(hashlib.md5(b"2:ab1:c").digest()[8:], "little")


def test_redo_causes_parse(tmp_path: Path) -> None:
    assert parse_causes([], "--redo-stale") == frozenset(JOB_CAUSES)
    assert parse_causes(["prompt,schema"], "--redo-stale") == {StaleCause.PROMPT, StaleCause.SCHEMA}
    assert parse_causes(["prompt", "unknown"], "--redo-stale") == {StaleCause.PROMPT, StaleCause.UNKNOWN}
    with pytest.raises(ConfigError, match="'content': not a cause to redo .content changes are always"):
        parse_causes(["content"], "--redo-stale")
    with pytest.raises(ConfigError, match="--redo-stale 'promt': not a cause to redo; use prompt, schema"):
        parse_causes(["promt"], "--redo-stale")


def test_a_job_file_cannot_set_the_variant_directly(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant="other")
    with pytest.raises(ConfigError, match="key 'variant': unknown key"):
        load_job(path)


def test_version_is_not_cached_across_copies(tmp_path: Path) -> None:
    spec: JobSpec = load_job(write_job(tmp_path))
    before = version_of(spec)
    assert version_of(spec.with_overrides(model="other")).model == "other"
    assert version_of(spec) == before


def test_an_endpoint_with_its_own_model_adds_it_to_the_current_models(tmp_path: Path) -> None:
    one = load_job(write_job(tmp_path))
    endpoints = [
        {"base_url": "http://a:1/v1"},
        {"base_url": "http://b:1/v1", "model": "own-model"},
        {"base_url": "http://c:1/v1", "model": "test-model"},
    ]
    (tmp_path / "several").mkdir()
    several = load_job(write_job(tmp_path / "several", endpoint={"base_url": None}, endpoints=endpoints))
    assert version_of(one).models == ("test-model",)
    assert version_of(several).models == ("test-model", "own-model")
    (tmp_path / "plain").mkdir()
    plain = load_job(write_job(tmp_path / "plain", endpoint={"base_url": None}, endpoints=endpoints[:1]))
    assert version_of(plain).job_hash == version_of(one).job_hash  # the runs table's hash as before
    assert version_of(several).job_hash != version_of(one).job_hash


def test_without_chunking_the_key_is_what_it_always_was(tmp_path: Path) -> None:
    """A job without ``chunking:`` keeps its settings hash and its runs' job hash, byte for byte: no
    result made before chunking existed becomes stale."""
    spec = load_job(write_job(tmp_path))
    version = version_of(spec)
    settings = {
        "max_tokens": 256,
        "reasoning_effort": "low",
        "temperature": 0.0,
        "structured_output": True,
        "extra_body": {},
    }
    assert version.settings_hash == digest(settings)
    assert version.chunked_settings_hash is None
    parts = [version.prompt_hash, version.schema_hash, version.model, version.settings_hash]
    assert version.job_hash == digest(parts)
    assert version.key_values(7, chunked=True) == version.key_values(7)


def chunked(tmp_path: Path, name: str, **chunking: Any) -> JobSpec:
    (tmp_path / name).mkdir()
    return load_job(write_job(tmp_path / name, chunking={"field": "description", **chunking}))


def test_chunking_settings_are_in_the_key_of_what_chunks_made_only(tmp_path: Path) -> None:
    plain = version_of(load_job(write_job(tmp_path)))
    one = version_of(chunked(tmp_path, "one"))
    two = version_of(chunked(tmp_path, "two", passes=2))
    assert one.key_values(7) == plain.key_values(7)  # a record sent whole: the key it always had
    assert one.key_values(7, chunked=True)[-1] == one.chunked_settings_hash != plain.settings_hash
    assert two.chunked_settings_hash != one.chunked_settings_hash
    assert one.job_hash != plain.job_hash  # the runs say which chunking they ran with


def test_what_is_stale_for_the_settings_with_chunking(tmp_path: Path) -> None:
    """Turning chunking on makes no result stale; a result made from chunks is stale once the chunking
    settings change, or are taken away."""
    plain = version_of(load_job(write_job(tmp_path)))
    one = version_of(chunked(tmp_path, "one"))
    two = version_of(chunked(tmp_path, "two", overlap_tokens=10))
    rows = {
        "whole": plain.settings_hash,
        "chunks of one": one.chunked_settings_hash,
        "chunks of two": two.chunked_settings_hash,
    }

    def stale(version: JobVersion) -> set[str]:
        with duckdb.connect() as connection:
            connection.execute("CREATE TABLE r (name VARCHAR, content_hash UBIGINT, settings_hash VARCHAR)")
            connection.executemany("INSERT INTO r VALUES (?, 1, ?)", list(rows.items()))
            condition = stale_conditions("r")[StaleCause.SETTINGS]
            parameters = {
                name: value for name, value in version.parameters().items() if f"${name}" in condition
            }
            found = connection.execute(f"SELECT name FROM r WHERE {condition}", parameters).fetchall()
        return {name for (name,) in found}

    assert stale(plain) == {"chunks of one", "chunks of two"}
    assert stale(one) == {"chunks of two"}
    assert stale(two) == {"chunks of one"}
