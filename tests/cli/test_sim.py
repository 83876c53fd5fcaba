from __future__ import annotations

import typer.main

import pipeline.cli as cli
from pipeline.cli.sim import sim_config
from pipeline.sim import Faults, SimConfig


def sim_defaults() -> dict[str, object]:
    command = typer.main.get_command(cli.app).commands["sim"]  # type: ignore[attr-defined]
    return {param.name: param.default for param in command.params}


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
