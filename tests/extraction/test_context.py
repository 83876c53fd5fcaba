from __future__ import annotations

from pathlib import Path

from pipeline.extraction.context import RunContext
from pipeline.extraction.prompt import PromptBuilder
from pipeline.job.spec import load_job
from pipeline.run.runner import run_job, run_job_locally, runner_for
from pipeline.source.versions import version_of
from tests.support.jobs import write_job


def test_the_context_holds_what_a_run_decides_once(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path))
    context = RunContext.of(spec)
    assert context.version == version_of(spec)
    assert [config.base_url for config in context.endpoints] == ["http://testserver/v1"]
    assert context.database == spec.database
    assert (context.auto, context.most_in_flight) == (False, 8)
    # the fixed part is the record's request with no field filled: system prompt, examples, template
    fixed = PromptBuilder(spec).request_for({}).messages
    assert context.prompts.fixed_messages == fixed
    assert context.prompts.fixed_messages[0]["content"] == context.prompts.system_message["content"]
    assert context.client_settings(context.endpoints[0]).base_url == "http://testserver/v1"


def test_the_running_context_is_rebuilt_only_for_another_spec(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path))
    context = RunContext.of(spec)
    assert context.running(spec) is context
    moved = context.running(spec.with_overrides(base_url="http://127.0.0.1:9/v1", model="other"))
    assert [config.base_url for config in moved.endpoints] == ["http://127.0.0.1:9/v1"]
    assert (moved.version.model, context.version.model) == ("other", "test-model")  # computed anew


def test_auto_is_any_endpoint_without_a_fixed_concurrency(tmp_path: Path) -> None:
    endpoints = [{"base_url": "http://a:8000/v1", "concurrency": 4}, {"base_url": "http://b:8000/v1"}]
    spec = load_job(write_job(tmp_path, endpoints=endpoints, endpoint={"base_url": None}, concurrency="auto"))
    assert RunContext.of(spec).auto


def test_one_place_decides_a_local_run(tmp_path: Path) -> None:
    plain = load_job(write_job(tmp_path))
    (tmp_path / "local").mkdir()
    local = load_job(write_job(tmp_path / "local", endpoint={"base_url": "local"}))
    assert (plain.runs_locally, local.runs_locally) == (False, True)
    assert runner_for(plain) is run_job
    assert runner_for(plain, local=True) is run_job_locally  # --local
    assert runner_for(local) is run_job_locally
