"""The ``judge:`` section: every key defaults to the job's own, and a bad key is one line naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.job.commands import command
from pipeline.job.judge import DEFAULT_JUDGE_PROMPT, JudgeSettings
from pipeline.job.spec import JobSpec, load_job
from tests.support.jobs import write_job


def judged_job(tmp_path: Path, judge: dict[str, Any] | None = None, **job: Any) -> JobSpec:
    return load_job(write_job(tmp_path, **job, **({"judge": judge} if judge is not None else {})))


def test_without_a_judge_section_the_job_judges_itself(tmp_path: Path) -> None:
    spec = judged_job(tmp_path)
    judge = spec.judge_settings()
    server = judge.endpoint
    assert (server.base_url, judge.model, server.concurrency) == ("http://testserver/v1", "test-model", 8)
    assert (judge.max_tokens, judge.reasoning_effort, judge.prompt) == (256, "low", DEFAULT_JUDGE_PROMPT)
    assert server.structured_output and server.api_key_env is None


@pytest.mark.parametrize(
    ("judge", "seen"),
    [
        ({"model": "big-judge"}, ("model", "big-judge")),
        ({"max_tokens": 1024}, ("max_tokens", 1024)),
        ({"concurrency": 32}, ("concurrency", 32)),
        ({"reasoning_effort": "high"}, ("reasoning_effort", "high")),
        ({"reasoning_effort": None}, ("reasoning_effort", None)),  # given as null: none is sent
        ({"prompt": "Is each value right?"}, ("prompt", "Is each value right?")),
        ({"endpoint": {"base_url": "http://judge:9/v1"}}, ("base_url", "http://judge:9/v1")),
        ({"endpoint": {"structured_output": False}}, ("structured_output", False)),
        ({"endpoint": {"api_key_env": "JUDGE_KEY"}}, ("api_key_env", "JUDGE_KEY")),
        ({"endpoint": {"max_model_len": 8192}}, ("max_model_len", 8192)),
    ],
)
def test_each_key_given_replaces_the_jobs_own(tmp_path: Path, judge: dict[str, Any], seen: Any) -> None:
    key, value = seen
    plain = _setting(judged_job(tmp_path).judge_settings(), key)
    assert _setting(judged_job(tmp_path, judge).judge_settings(), key) == value != plain


def _setting(settings: JudgeSettings, key: str) -> Any:
    return getattr(settings.endpoint if hasattr(settings.endpoint, key) else settings, key)


def test_the_job_keys_a_judge_leaves_out(tmp_path: Path) -> None:
    spec = judged_job(
        tmp_path,
        {"endpoint": {"base_url": "http://judge:9/v1"}},
        endpoint={"base_url": "http://testserver/v1", "api_key_env": "VLLM_KEY", "max_model_len": 4096},
        concurrency="auto",
        max_concurrency=64,
        reasoning_effort="medium",
    )
    judge = spec.judge_settings()
    # Another server: the job's key variable, concurrency (auto: its ceiling), effort and model; not the
    # context length the job gives for its own server.
    assert judge.endpoint.api_key_env == "VLLM_KEY"
    assert (judge.endpoint.concurrency, judge.reasoning_effort, judge.model) == (64, "medium", "test-model")
    assert judge.endpoint.max_model_len is None


def test_on_the_jobs_first_server_the_judge_is_the_model_served_there(tmp_path: Path) -> None:
    spec = judged_job(
        tmp_path,
        endpoint={"base_url": None},
        endpoints=[
            {"base_url": "http://a:1/v1", "model": "served-a", "concurrency": 4},
            {"base_url": "http://b:1/v1"},
        ],
    )
    judge = spec.judge_settings()
    assert (judge.endpoint.base_url, judge.model, judge.endpoint.concurrency) == (
        "http://a:1/v1",
        "served-a",
        4,
    )


def test_a_model_given_on_the_command_line_replaces_the_sections(tmp_path: Path) -> None:
    spec = judged_job(tmp_path, {"model": "from-the-file"})
    assert spec.judge_settings("from-the-command-line").model == "from-the-command-line"
    assert spec.judge_settings().model == "from-the-file"


def test_a_server_given_on_the_command_line_replaces_the_sections_as_if_it_named_it(tmp_path: Path) -> None:
    spec = judged_job(tmp_path, {"endpoint": {"structured_output": False}, "concurrency": 4})
    judge = spec.judge_settings(base_url="http://judge:9/v1")
    server = judge.endpoint
    # Another server than the job's: its model is the job's, the section's other keys stay.
    assert (server.base_url, judge.model, server.concurrency) == ("http://judge:9/v1", "test-model", 4)
    assert not server.structured_output
    both = spec.judge_settings("big-judge", "http://judge:9/v1")
    assert (both.model, both.endpoint.base_url) == ("big-judge", "http://judge:9/v1")
    assert spec.judge_settings().endpoint.base_url == "http://testserver/v1"
    with pytest.raises(ConfigError, match="the judge's key 'endpoint': base_url 'local' is not served"):
        spec.judge_settings(base_url="local")


def test_a_variant_keeps_the_jobs_judge(tmp_path: Path) -> None:
    spec = judged_job(tmp_path, {"model": "big-judge"}, variants={"other": {"model": "small"}})
    assert spec.for_variant("other").judge_settings().model == "big-judge"


@pytest.mark.parametrize(
    ("judge", "message"),
    [
        ({"modle": "x"}, r"key 'judge.modle': unknown key \(did you mean 'model'\?\)"),
        ({"model": ""}, r"key 'judge.model': String should have at least 1 character"),
        ({"prompt": ""}, r"key 'judge.prompt': String should have at least 1 character"),
        ({"max_tokens": 0}, r"key 'judge.max_tokens': Input should be greater than or equal to 1"),
        ({"concurrency": 0}, r"key 'judge.concurrency': Input should be greater than or equal to 1"),
        ({"concurrency": "auto"}, r"key 'judge.concurrency': Input should be a valid integer"),
        ({"reasoning_effort": "extreme"}, r"key 'judge.reasoning_effort': Input should be 'minimal'"),
        ({"endpoint": {"base_url": "judge:8000"}}, r"key 'judge.endpoint.base_url': must start with http://"),
        ({"endpoint": {"base_url": "local"}}, r"key 'judge.endpoint': .*base_url 'local' is not served"),
        ({"endpoint": {"url": "http://x/v1"}}, r"key 'judge.endpoint.url': unknown key"),
        ({"endpoint": {"api_key_env": "sk-123"}}, r"key 'judge.endpoint.api_key_env': must be the name of"),
        ("gpt-oss", r"key 'judge': Input should be a valid dictionary"),
    ],
)
def test_a_bad_judge_key_is_one_line_naming_it(tmp_path: Path, judge: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        judged_job(tmp_path, judge)
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"{tmp_path / 'job.yaml'}: ")


def test_a_local_judge_is_told_the_command_that_serves_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        judged_job(tmp_path, {"endpoint": {"base_url": "local"}})
    assert str(raised.value).endswith(f"(`{command('serve-local')}` prints one)")  # pasted anywhere
