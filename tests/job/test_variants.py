"""Variants in the job file, ad-hoc variants, --prompt-file, and overrides checked like the job file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.job.spec import load_job
from pipeline.job.variants import prompt_file_changes
from pipeline.source.versions import version_of
from tests.support.jobs import write_job

EXAMPLE = {"input": {"title": "Nurse", "description": "Care."}, "output": {"title": "Nurse", "skills": []}}


def test_a_declared_variant_merges_prompt_and_endpoint_and_replaces_the_rest(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        endpoint={"base_url": "http://a:1/v1", "api_key_env": "KEY_A"},
        prompt={"examples": [EXAMPLE]},
        variants={
            "big": {
                "model": "big-model",
                "endpoint": {"base_url": "http://b:2/v1"},
                "prompt": {"system": "Be thorough."},
                "max_tokens": 999,
                "extra_body": {"top_k": 3},
            },
            "zero-shot": {"prompt": {"examples": []}},
        },
    )
    spec = load_job(path)
    big = spec.for_variant("big")
    assert (big.variant, big.model, big.max_tokens, big.extra_body) == ("big", "big-model", 999, {"top_k": 3})
    assert (big.endpoint.base_url, big.endpoint.api_key_env) == ("http://b:2/v1", "KEY_A")
    assert (big.prompt.system, big.prompt.user, len(big.prompt.examples)) == (
        "Be thorough.",
        spec.prompt.user,
        1,
    )
    zero = spec.for_variant("zero-shot")
    assert zero.prompt.examples == [] and zero.prompt.system == spec.prompt.system
    assert version_of(zero).prompt_hash != version_of(spec).prompt_hash
    assert version_of(zero).settings_hash == version_of(spec).settings_hash
    assert spec.variant == "main" and spec.for_variant("main") is spec


def test_a_variant_can_drop_an_examples_file_and_another_can_bring_one(tmp_path: Path) -> None:
    (tmp_path / "examples.jsonl").write_text(json.dumps(EXAMPLE) + "\n")
    path = write_job(
        tmp_path,
        prompt={"examples_file": "examples.jsonl"},
        variants={"zero": {"prompt": {"examples": []}}, "two": {"prompt": {"examples": [EXAMPLE, EXAMPLE]}}},
    )
    spec = load_job(path)
    assert len(spec.prompt.examples) == 1
    assert spec.for_variant("zero").prompt.examples == []
    assert len(spec.for_variant("two").prompt.examples) == 2


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            f"{json.dumps(EXAMPLE)}\n{{not json\n",
            "line 2: invalid JSON (unexpected character, expected a string key, column 2)",
        ),
        (f"{json.dumps(EXAMPLE)}\n\n[]\n", "line 3: expected a JSON object, got list"),
        (f'\n{json.dumps(EXAMPLE)}\n{{"input": {{}}}}\n', "line 3: output: Field required"),
    ],
)
def test_a_bad_examples_file_names_the_key_the_file_and_the_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    examples = tmp_path / "examples.jsonl"
    examples.write_text(text)
    path = write_job(tmp_path, prompt={"examples_file": "examples.jsonl"})
    with pytest.raises(ConfigError) as refused:
        load_job(path)
    assert str(refused.value) == f"{path}: key 'prompt.examples_file': {examples.resolve()}: {problem}"


def test_an_examples_file_may_be_a_json_list(tmp_path: Path) -> None:
    (tmp_path / "examples.json").write_text(json.dumps([EXAMPLE, EXAMPLE], indent=2))
    spec = load_job(write_job(tmp_path, prompt={"examples_file": "examples.json"}))
    assert [example.model_dump() for example in spec.prompt.examples] == [EXAMPLE, EXAMPLE]


def test_an_undeclared_variant_keeps_the_jobs_settings_under_its_own_name(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path))
    rerun = spec.for_variant("main-rerun")
    assert rerun.variant == "main-rerun" and version_of(rerun) == version_of(spec)


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        ({"x": {"modle": "m"}}, r"key 'variants\.x\.modle': unknown key \(did you mean 'model'\?\)"),
        ({"x": {"prompt": {"sytem": "s"}}}, r"key 'variants\.x\.prompt\.sytem': unknown key \(did you mean"),
        ({"x": {"max_tokens": 0}}, r"key 'variants\.x': key 'max_tokens': Input should be greater than"),
        ({"x": {"prompt": {"user": "{salary}"}}}, r"variants\.x': prompt\.user uses \['salary'\]"),
        ({"main": {"model": "m"}}, r"'main' is the job itself"),
        ({"bad name!": {"model": "m"}}, r"key 'variants\.bad name!\.\[key\]': String should match pattern"),
        (
            {"x": {"prompt": {"examples": [{"input": {"title": "t"}, "output": {}}]}}},
            r"key 'variants\.x\.prompt\.examples'\[0\]\.input: no value for \['description'\]",
        ),
    ],
)
def test_bad_variants_fail_when_the_job_loads(
    tmp_path: Path, variants: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_job(write_job(tmp_path, variants=variants))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"base_url": "http://user:sk-secret@host/v1"}, "must not contain credentials"),
        ({"base_url": "ftp://host/v1"}, "must start with http:// or https://"),
        ({"concurrency": 0}, r"key 'concurrency': must be a number from 1 to 8192, or auto"),
        ({"stall_warning_s": 10, "stall_abort_s": 5}, "'stall_abort_s' must not be below 'stall_warning_s'"),
        ({"prompt": {"user": "{nope}"}}, r"prompt\.user uses \['nope'\]"),
    ],
)
def test_overrides_are_checked_like_the_job_file(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    spec = load_job(write_job(tmp_path))
    with pytest.raises(ConfigError, match=message) as caught:
        spec.with_overrides(**changes)
    assert "sk-secret" not in str(caught.value)
    assert str(caught.value).startswith(f"{spec.source_file} with the command-line options: ")


def test_overrides_keep_what_the_job_resolved(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path, prompt={"examples": [EXAMPLE]})).for_variant("trial")
    changed = spec.with_overrides(model="other", concurrency=3, database=tmp_path / "trial.duckdb")
    assert (changed.variant, changed.source_file, changed.model, changed.concurrency) == (
        "trial",
        spec.source_file,
        "other",
        3,
    )
    assert changed.database == tmp_path / "trial.duckdb" and len(changed.prompt.examples) == 1


def test_a_prompt_file_is_yaml_prompt_keys_or_a_system_prompt(tmp_path: Path) -> None:
    text = tmp_path / "system.txt"
    text.write_text("You are careful.\n")
    assert prompt_file_changes(text) == {"system": "You are careful.\n"}
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "ex.jsonl").write_text("")
    keys = tmp_path / "prompt.yaml"
    keys.write_text("system: Short.\nexamples_file: more/ex.jsonl\n")
    assert prompt_file_changes(keys) == {
        "system": "Short.",
        "examples_file": (tmp_path / "more" / "ex.jsonl").resolve(),
    }
    spec = load_job(write_job(tmp_path, prompt={"examples": [EXAMPLE]}))
    assert spec.with_overrides(prompt=prompt_file_changes(keys)).prompt.examples == []


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("p.yaml", "sytem: x\n", r"--prompt-file .*p\.yaml: key 'sytem': unknown key \(did you mean"),
        ("p.yaml", "system: [\n", r"--prompt-file .*p\.yaml: not valid YAML"),
        ("p.txt", "  \n", r"--prompt-file .*p\.txt: the file is empty"),
    ],
)
def test_bad_prompt_files(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        prompt_file_changes(path)
    with pytest.raises(ConfigError, match="cannot read it"):
        prompt_file_changes(tmp_path / "missing.txt")


def test_a_bad_variant_name_on_the_command_line(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path))
    with pytest.raises(ConfigError, match="variant 'a b': a variant name has letters, digits"):
        spec.for_variant("a b")
