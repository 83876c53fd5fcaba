from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.job.spec import load_job, template_fields
from pipeline.servers.config import LOCAL_ENDPOINT, LOCAL_MODEL
from tests.support.jobs import job_dict, write_job
from tests.support.processes import REPO
from tests.support.schemas import Item


def test_loads_defaults_and_resolves_paths(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path))
    assert spec.database == (tmp_path / "test.duckdb").resolve()
    assert spec.schema_class is Item
    assert spec.reasoning_effort == "low"
    assert spec.retry.transient_retries == 6
    assert spec.output.results_table == "results"


def test_issue_defaults_for_concurrency_timeout_and_effort(tmp_path: Path) -> None:
    data = job_dict()
    for key in ("concurrency", "request_timeout_s", "max_tokens"):
        del data[key]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_job(path)
    assert (spec.concurrency, spec.request_timeout_s, spec.reasoning_effort) == (256, 900.0, "low")


def test_the_linkedin_job_loads() -> None:
    spec = load_job(REPO / "jobs" / "linkedin.yaml")
    assert spec.schema_class.__name__ == "JobPosting"
    assert spec.concurrency == 256
    assert spec.request_timeout_s >= 900
    assert spec.source.seed_file is not None and spec.source.seed_file.is_file()


def test_environment_interpolation_with_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_MODEL", "from-env")
    path = write_job(
        tmp_path, model="${TEST_MODEL}", endpoint={"base_url": "${TEST_URL:-http://fallback:1/v1}"}
    )
    spec = load_job(path)
    assert spec.model == "from-env"
    assert spec.endpoint.base_url == "http://fallback:1/v1"


def test_missing_environment_variable_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    path = write_job(tmp_path, model="${NOPE_NOT_SET}")
    with pytest.raises(
        ConfigError, match=r"job\.yaml: key 'model': environment variable NOPE_NOT_SET is not set"
    ):
        load_job(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"concurrncy": 4}, r"key 'concurrncy': unknown key"),
        ({"source": {"colour": "x"}}, r"key 'source.colour': unknown key"),
        ({"concurrency": "many"}, r"key 'concurrency': must be a number from 1 to 8192, or auto$"),
        ({"request_timeout_s": -1}, r"key 'request_timeout_s'"),
        ({"reasoning_effort": "extreme"}, r"key 'reasoning_effort'"),
        ({"endpoint": {"base_url": "localhost:8000"}}, r"key 'endpoint.base_url': .*http://"),
        ({"source": {"query": "SELECT 1"}}, r"exactly one of 'table' or 'query'"),
        ({"prompt": {"user": "{nope}"}}, r"prompt.user uses \['nope'\] which are not in source.fields"),
        ({"prompt": {"user": "{title.upper}"}}, r"plain field name"),
        ({"schema": "no colon"}, r"key 'schema'"),
        ({"output": {"results_table": "drop table;"}}, r"key 'output.results_table'"),
        ({"duckdb_memory_limit": "lots"}, r"key 'duckdb_memory_limit': String should match pattern"),
        ({"duckdb_memory_limit": 96}, r"key 'duckdb_memory_limit': Input should be a valid string$"),
        ({"duckdb_memory_limit": None}, r"key 'duckdb_memory_limit': Input should be a valid string$"),
        ({"operations": {"metrics_host": "http://0.0.0.0:9100"}}, r"key 'operations.metrics_host': 'http"),
        ({"operations": {"metrics_host": "999.1.1.1"}}, r"key 'operations.metrics_host': .*IP address"),
        ({"chunking": {"field": "body"}}, r"key 'chunking.field': 'body' is not a field prompt.user sends "),
        ({"chunking": {}}, r"key 'chunking.field': Field required"),
        ({"chunking": {"field": "description", "passes": 0}}, r"key 'chunking.passes'"),
        ({"chunking": {"field": "description", "overlap": 5}}, r"key 'chunking.overlap': unknown key"),
        (
            {"chunking": {"field": "description", "max_chunk_tokens": "big"}},
            r"key 'chunking.max_chunk_tokens': must be a number of tokens from 64 to 1,000,000, or auto$",
        ),
        (
            {"chunking": {"field": "description", "max_chunk_tokens": 100, "overlap_tokens": 60}},
            r"key 'chunking': overlap_tokens \(60\) must be at most half of max_chunk_tokens \(100\)$",
        ),
        (
            {"schema": "tests.support.schemas:MisdeclaredMerge"},
            r"key 'schema': field 'years' \(number\) declares merge 'union', which does not fit it; use "
            r"one of first, most_common, min, max$",
        ),
    ],
)
def test_bad_spec_gives_one_line_naming_file_and_key(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    path = write_job(tmp_path, **overrides)
    with pytest.raises(ConfigError, match=message) as caught:
        load_job(path)
    text = str(caught.value)
    assert text.startswith(str(path))
    assert "\n" not in text


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("tests.support.nowhere:Item", r"key 'schema': cannot import module 'tests.support.nowhere'"),
        (
            "tests.support.schemas:Missing",
            r"key 'schema': module 'tests.support.schemas' has no class 'Missing'",
        ),
        ("tests.support.schemas:NotAModel", r"is not a Pydantic model class"),
    ],
)
def test_schema_that_cannot_be_resolved(tmp_path: Path, schema: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_job(write_job(tmp_path, schema=schema))


def test_a_schema_module_that_raises_in_a_module_it_imports_names_that_line(tmp_path: Path) -> None:
    # The deepest line of the project's own code is where to look, not the import machinery's or
    # pydantic's, nor the pipeline's own call.
    helper = tmp_path / "schema_helper_raising.py"
    helper.write_text("def make():\n    return {}['missing']\n")
    (tmp_path / "schema_using_helper.py").write_text("from schema_helper_raising import make\nmake()\n")
    with pytest.raises(ConfigError) as caught:
        load_job(write_job(tmp_path, schema="schema_using_helper:Thing"))
    assert str(caught.value).endswith(
        f"key 'schema': cannot import module 'schema_using_helper' (KeyError: 'missing', at {helper}:2)"
    )


def test_unreadable_or_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read job file"):
        load_job(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: not valid YAML"):
        load_job(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="mapping of keys"):
        load_job(scalar)


def test_api_key_comes_from_the_named_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_job(write_job(tmp_path, endpoint={"api_key_env": "TEST_KEY_VAR"}))
    monkeypatch.delenv("TEST_KEY_VAR", raising=False)
    assert spec.api_key() is None
    monkeypatch.setenv("TEST_KEY_VAR", "sk-secret")
    assert spec.api_key() == "sk-secret"
    assert "sk-secret" not in spec.model_dump_json()


def test_overrides_keep_unset_values(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path))
    changed = spec.with_overrides(concurrency=32, base_url="http://other:9/v1", model=None)
    assert (changed.concurrency, changed.endpoint.base_url, changed.model) == (
        32,
        "http://other:9/v1",
        "test-model",
    )


def test_a_value_is_said_of_where_it_was_given(tmp_path: Path) -> None:
    job = write_job(tmp_path, variants={"big": {"model": "large-model"}, "terse": {"max_tokens": 64}})
    spec = load_job(job)
    assert spec.said_of("model") == f"{job}: key 'model'"
    assert spec.with_overrides(model="typed").said_of("model") == "--model typed"
    assert spec.with_overrides(model="typed").for_variant("terse").said_of("model") == "--model typed"
    assert spec.for_variant("big").said_of("model") == f"{job}: key 'variants.big.model'"
    assert spec.for_variant("big~rerun").said_of("model") == f"{job}: key 'variants.big.model'"
    assert spec.for_variant("terse").said_of("model") == f"{job}: key 'model'"
    assert (
        spec.with_overrides(concurrency=4).said_of("concurrency") == f"{job}: key 'concurrency'"
    )  # no option
    assert spec.as_run(local=True).said_of("model") == f"{job}: key 'model'"  # --local's, not typed


def test_a_local_run_is_the_bundled_server_with_its_model(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path, model="openai/gpt-oss-120b"))
    assert spec.as_run() is spec
    local = spec.as_run(local=True)
    assert (local.endpoint.base_url, local.model) == (LOCAL_ENDPOINT, LOCAL_MODEL)
    (tmp_path / "local").mkdir()
    named = load_job(write_job(tmp_path / "local", endpoint={"base_url": "local"}, model="any"))
    assert (named.as_run().endpoint.base_url, named.as_run().model) == (LOCAL_ENDPOINT, LOCAL_MODEL)


@pytest.mark.parametrize(
    ("host", "kept"),
    [
        ("0.0.0.0", "0.0.0.0"),
        ("::", "::"),
        ("[::1]", "::1"),
        ("localhost", "localhost"),
        ("box-1.lan", "box-1.lan"),
    ],
)
def test_metrics_host_takes_addresses_and_names(tmp_path: Path, host: str, kept: str) -> None:
    assert load_job(write_job(tmp_path)).operations.metrics_host == "127.0.0.1"
    assert load_job(write_job(tmp_path, operations={"metrics_host": host})).operations.metrics_host == kept


def test_chunking_keys_and_their_defaults(tmp_path: Path) -> None:
    spec = load_job(write_job(tmp_path, chunking={"field": "description", "max_chunk_tokens": "2000"}))
    assert spec.chunking is not None
    assert (spec.chunking.field, spec.chunking.max_chunk_tokens) == ("description", 2000)
    assert (spec.chunking.overlap_tokens, spec.chunking.passes, spec.chunking.auto) == (100, 1, False)
    auto = load_job(write_job(tmp_path, chunking={"field": "title", "max_chunk_tokens": "AUTO"}))
    assert auto.chunking is not None and auto.chunking.auto
    assert load_job(write_job(tmp_path)).chunking is None


def test_template_fields() -> None:
    assert template_fields("A {title} and {{literal}} {description}") == ["title", "description"]
