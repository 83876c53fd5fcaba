"""``pipeline check`` as a person or a script runs it: a real process against the simulator, its lines,
its JSON and its exit codes (0 all ok, 1 a warning, 2 a bad job or option, 3 the server cannot serve)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.support.fakes import dead_url
from tests.support.jobs import make_source, write_job
from tests.support.processes import run_pipeline, sim_server

pytestmark = pytest.mark.process  # each test runs `pipeline check` against a simulator process

KEYS = {
    "context",
    "kv_tokens",
    "requests_that_fit",
    "prefix_caching",
    "answer_in_reasoning",
    "reasoning_effort_honored",
    "eta_s",
    "checks",
}


def job(tmp_path: Path, records: int = 10, **overrides: object) -> Path:
    path = write_job(tmp_path, **overrides)
    make_source(tmp_path / "test.duckdb", records)
    return path


def test_a_good_server_is_all_ok_and_exit_0_and_json_has_every_key(tmp_path: Path) -> None:
    path = job(tmp_path)
    with sim_server("--profile", "gpt-oss-120b", "--speed", "1000", "--model", "test-model") as url:
        text = run_pipeline("check", str(path), "--endpoint", url)
        data = run_pipeline("check", str(path), "--endpoint", url, "--json")
    assert text.returncode == 0, text.stdout + text.stderr
    names = [line.split(":")[0].split()[-1] for line in text.stdout.splitlines()]
    assert names == [
        "context",
        "kv_cache",
        "prefix_caching",
        "answer",
        "reasoning_effort",
        "response_format",
        "timeout",
        "backlog",
    ]
    assert all(line.startswith("ok ") for line in text.stdout.splitlines())
    report = orjson.loads(data.stdout)
    assert data.returncode == 0 and set(report) >= KEYS
    assert all(check["status"] in ("ok", "warn", "fail") for check in report["checks"])
    assert report["kv_tokens"] == 4_800_000 and report["prefix_caching"] is True
    assert report["requests_that_fit"] > 1000 and report["reasoning_effort_honored"] is True


def test_a_warning_is_exit_1_and_says_what_to_do(tmp_path: Path) -> None:
    path = job(tmp_path)
    with sim_server("--model", "test-model", "--no-prefix-caching") as url:
        text = run_pipeline("check", str(path), "--endpoint", url)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "warn  prefix_caching: off:" in text.stdout and "--enable-prefix-caching" in text.stdout


def test_a_server_that_is_down_is_exit_3_with_a_fail_line(tmp_path: Path) -> None:
    path = job(tmp_path)
    text = run_pipeline("check", str(path), "--endpoint", dead_url())
    assert text.returncode == 3
    assert text.stdout.startswith("fail  server: cannot connect to") and "Traceback" not in text.stderr


def test_a_bad_endpoint_or_an_empty_source_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = job(tmp_path, records=0)
    bad = run_pipeline("check", str(path), "--endpoint", "gpu-box:8000")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --endpoint") and not bad.stdout
    with sim_server("--model", "test-model") as url:
        empty = run_pipeline("check", str(path), "--endpoint", url)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1
    assert "the source has no records to probe the server with" in empty.stderr
    local = run_pipeline("check", str(write_job(tmp_path, endpoint={"base_url": "local"})))
    assert local.returncode == 2 and "pipeline serve-local" in local.stderr and not local.stdout


def test_several_endpoints_each_get_their_lines_and_their_json(tmp_path: Path) -> None:
    path = job(tmp_path)
    with sim_server("--model", "test-model") as first, sim_server("--model", "test-model") as second:
        text = run_pipeline("check", str(path), "--endpoint", first, "--endpoint", second)
        data = run_pipeline("check", str(path), "--endpoint", first, "--endpoint", second, "--json")
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"{first} (test-model)" in text.stdout and f"{second} (test-model)" in text.stdout
    report = orjson.loads(data.stdout)
    assert [endpoint["base_url"] for endpoint in report["endpoints"]] == [first, second]
    assert {check["endpoint"] for check in report["checks"]} == {first, second}
    assert "on two" not in text.stdout  # the ETA is over both already
