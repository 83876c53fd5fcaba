from __future__ import annotations

import errno
import socket

import httpx2
import pytest
import typer.main
from typer.core import TyperCommand, TyperGroup, TyperOption

import pipeline.cli as cli
from pipeline.cli.sim import cannot_listen, sim_config
from pipeline.sim import Faults, SimConfig
from pipeline.sim.profiles import PROFILES
from tests.support.cli import cli_run, error_line
from tests.support.processes import run_pipeline, sim_server


def sim_command() -> TyperCommand:
    group = typer.main.get_command(cli.app)
    assert isinstance(group, TyperGroup)  # the app has many commands
    command = group.commands["sim"]
    assert isinstance(command, TyperCommand)
    return command


def sim_defaults() -> dict[str, object]:
    return {param.name: param.default for param in sim_command().params if param.name is not None}


def test_every_sim_option_is_a_setting_of_the_simulator() -> None:
    assert sim_config(sim_defaults()) == SimConfig()


def test_options_map_by_name_to_the_settings_and_the_faults() -> None:
    options = {**sim_defaults(), "latency": 2.5, "fault_hang": 0.25, "fault_context_length": 0.5, "seed": 7}
    config = sim_config(options)
    assert (config.latency_s, config.seed) == (2.5, 7)
    assert config.faults == Faults(hang=0.25, context_length=0.5)


def test_the_context_options_reach_the_simulator() -> None:
    options = {**sim_defaults(), "max_model_len": 4096, "list_context": False, "tokenize": False}
    config = sim_config(options)
    assert (config.max_model_len, config.list_context, config.tokenize) == (4096, False, False)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_profile_serves_the_model_it_imitates_unless_model_says_otherwise(profile: str) -> None:
    served = sim_config({**sim_defaults(), "profile": profile}).model
    assert served == PROFILES[profile].served_model and "/" in served  # a hub name, as vLLM serves it
    assert sim_config({**sim_defaults(), "profile": profile, "model": "mine"}).model == "mine"


@pytest.mark.process
def test_pipeline_sim_with_the_gpt_oss_profile_serves_what_the_jobs_ask_for() -> None:
    """The docs' `pipeline sim --profile gpt-oss-120b` beside `pipeline run jobs/linkedin.yaml`,
    whose model is openai/gpt-oss-120b: the run's preflight finds that name in /v1/models."""
    with sim_server("--profile", "gpt-oss-120b", "--speed", "50") as url:
        models = httpx2.get(f"{url}/models", timeout=10).json()["data"]
    assert [model["id"] for model in models] == ["openai/gpt-oss-120b"]


def test_every_option_of_sim_says_what_it_does_in_help() -> None:
    options = [param for param in sim_command().params if isinstance(param, TyperOption)]
    assert {option.name for option in options} >= {f"fault_{name}" for name in Faults.__slots__}
    undocumented = [option.opts[0] for option in options if not option.help]
    assert undocumented == []


def test_the_cache_and_reasoning_options_reach_the_simulator() -> None:
    options = {
        **sim_defaults(),
        "kv_cache_tokens": 64_000,
        "prefix_caching": False,
        "answer_in_reasoning": True,
    }
    config = sim_config(options)
    assert (config.kv_cache_tokens, config.prefix_caching, config.answer_in_reasoning) == (
        64_000,
        False,
        True,
    )
    assert (SimConfig().prefix_caching, SimConfig().answer_in_reasoning) == (True, False)


def test_kv_tokens_is_the_option_kv_cache_tokens_still_works() -> None:
    names = {opt for param in sim_command().params if param.name == "kv_cache_tokens" for opt in param.opts}
    assert names == {"--kv-tokens", "--kv-cache-tokens"}


@pytest.mark.process
def test_a_second_sim_on_the_same_port_is_one_line_and_exit_2() -> None:
    """The README's simulator, started twice: the second says the port is taken, no traceback."""
    with sim_server() as url:
        port = int(url.removesuffix("/v1").rsplit(":", 1)[1])
        second = run_pipeline("sim", "--port", str(port), timeout=60)
        assert httpx2.get(f"{url}/models", timeout=10).status_code == 200  # the first serves on
    assert second.returncode == 2, second.stderr
    assert second.stdout == ""
    assert second.stderr.splitlines() == [
        f"error: --port {port}: 127.0.0.1:{port} is already in use (a `pipeline sim` started before?); "
        "stop what listens there, or pick another port (--port 0: any free one)"
    ]


def test_a_port_in_use_is_refused_before_anything_is_served() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli_run("sim", "--port", str(port))
    assert result.exit_code == 2
    assert error_line(result).startswith(f"error: --port {port}: 127.0.0.1:{port} is already in use")
    assert "serving" not in result.stdout


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("192.0.2.1", "Cannot assign requested address"),  # TEST-NET-1: never this machine's
        ("no-such-host.invalid", "not known"),  # .invalid never resolves
    ],
)
def test_a_host_that_is_not_this_machine_names_the_option_and_the_reason(host: str, reason: str) -> None:
    result = cli_run("sim", "--host", host, "--port", "0")
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: --host {host}: cannot listen on {host}:0 ("), line
    assert reason in line


def test_an_address_python_3_13_skipped_is_named_as_not_this_machines() -> None:
    """3.13's asyncio drops each address that raised EADDRNOTAVAIL and raises without an errno."""
    skipped = OSError("could not bind on any address out of [('192.0.2.1', 0)]")
    assert str(cannot_listen("192.0.2.1", 0, skipped)) == (
        "--host 192.0.2.1: cannot listen on 192.0.2.1:0 (Cannot assign requested address)"
    )


def test_a_port_only_root_may_take_names_the_port() -> None:
    refused = cannot_listen("127.0.0.1", 80, OSError(errno.EACCES, "error while attempting to bind"))
    assert str(refused) == (
        "--port 80: cannot listen on 127.0.0.1:80 (Permission denied); a port below 1024 needs root"
    )
