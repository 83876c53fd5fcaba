"""`pipeline bench`: metrics parsing, the knee, the plain-word diagnostics, the outputs, and sweeps
against the calibrated simulator over real HTTP."""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from pipeline.bench import (
    BenchOptions,
    format_table,
    parse_metrics,
    run_sweep,
    sweep_lines,
    table_columns,
    table_rows,
    write_outputs,
)
from pipeline.bench.observer import ServerObservation
from pipeline.bench.report import LevelSummary, diagnose, find_knee, summarize, with_scaling
from pipeline.cli import app
from pipeline.errors import FatalRunError
from pipeline.sim import SimConfig, SimServer
from pipeline.sim.http import serve
from pipeline.sim.profiles import PROFILES
from tests.support.processes import sim_server

pytestmark = pytest.mark.anyio

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 12.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 750.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 9.0
"""


def level(concurrency: int, aggregate: float, **overrides: Any) -> LevelSummary:
    values: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": 3 * concurrency,
        "errors": 0,
        "model_s": 60.0,
        "aggregate_tok_s": aggregate,
        "per_seq_tok_s": aggregate / concurrency,
        "ttft_p50_s": 0.5,
        "ttft_p99_s": 1.0,
        "latency_max_s": 30.0,
        "starved_by_reasoning": 0,
        "max_running": float(concurrency),
        "max_waiting": 0.0,
        "kv_usage_max": 0.05,
        "prefix_hit_rate": 0.9,
        "wall_s": 60.0,
    }
    return LevelSummary(**{**values, **overrides})


CLEAN = [level(1, 33.5), level(2, 59.5), level(4, 87.6), level(8, 123), level(256, 863), level(384, 771)]


def test_parse_metrics_sums_labels_and_drops_the_total_suffix() -> None:
    values = parse_metrics(METRICS)
    assert values["vllm:num_requests_running"] == 16.0
    assert values["vllm:num_requests_waiting"] == 3.0
    assert values["vllm:prefix_cache_hits"] == 750.0
    assert "vllm:request_success" not in values  # only what the table uses


def test_observation_peaks_deltas_and_the_simulators_time_scale() -> None:
    observation = ServerObservation(
        available=True,
        peaks={"vllm:num_requests_running": 16.0},
        first={"vllm:prefix_cache_queries": 100.0, "vllm:prefix_cache_hits": 0.0},
        last={
            "vllm:prefix_cache_queries": 1100.0,
            "vllm:prefix_cache_hits": 900.0,
            "pipeline_sim:speed": 10.0,
        },
    )
    assert observation.peak("vllm:num_requests_running") == 16.0
    assert observation.prefix_hit_rate == pytest.approx(0.9)
    assert observation.time_scale == 10.0
    assert ServerObservation().peak("vllm:num_requests_running") is None  # no /metrics: "-" in the table
    assert ServerObservation().time_scale == 1.0


def test_knee_is_the_best_aggregate_and_the_first_regression_after_it() -> None:
    knee = find_knee(CLEAN)
    assert knee is not None and (knee.best, knee.regresses_at) == (256, 384)
    flat = find_knee([level(1, 26), level(8, 153), level(64, 155), level(384, 150)])
    assert flat is not None and (flat.best, flat.regresses_at) == (64, None)  # within 5%: not a regression
    assert find_knee([]) is None


def test_a_clean_curve_has_nothing_to_diagnose() -> None:
    assert diagnose(CLEAN, timeout_s=900, max_tokens=400) == []


def test_queueing_below_the_requested_concurrency_names_max_num_seqs() -> None:
    notes = diagnose([level(64, 150, max_running=8.0, max_waiting=56.0)], timeout_s=900, max_tokens=400)
    assert len(notes) == 1 and "--max-num-seqs is below your concurrency" in notes[0]
    assert "ran at most 8" in notes[0]


def test_reasoning_that_eats_the_budget_is_named() -> None:
    notes = diagnose([level(8, 100, starved_by_reasoning=5)], timeout_s=900, max_tokens=64)
    assert len(notes) == 1 and "reasoning is eating the token budget (max_tokens=64)" in notes[0]


def test_requests_near_the_timeout_ask_for_a_longer_one() -> None:
    notes = diagnose([level(256, 860, latency_max_s=170.0)], timeout_s=180, max_tokens=400)
    assert len(notes) == 1 and "raise the timeout to >= 340 s" in notes[0]


def test_a_dip_at_a_non_power_of_two_points_at_cuda_graph_sizes() -> None:
    levels = [level(4, 87.6), level(5, 60.0), level(8, 123), level(10, 138), level(16, 173)]
    notes = diagnose(levels, timeout_s=900, max_tokens=400)
    assert len(notes) == 1 and notes[0].startswith("c=5:") and "CUDA-graph" in notes[0]
    dip_at_power_of_two = [level(4, 87.6), level(8, 60.0), level(16, 173)]
    # Not a CUDA-graph size's: a fall and a rise the curve is flagged for (below).
    [note] = diagnose(dip_at_power_of_two, timeout_s=900, max_tokens=400)
    assert "CUDA-graph" not in note and note.startswith("the curve is not monotonic: c=8 below c=4")


def test_a_busy_client_is_reported_instead_of_blamed_on_the_server() -> None:
    levels = [level(1, 33.5), level(256, 500, client_cpu_share=0.97)]
    notes = diagnose(levels, timeout_s=900, max_tokens=400)
    assert len(notes) == 1 and notes[0].startswith("c=256:") and "measure the client" in notes[0]


def test_scaling_is_relative_to_the_first_level() -> None:
    scaled = with_scaling([level(1, 33.5), level(256, 863)])
    assert scaled[1].scaling == pytest.approx(863 / 33.5)


def test_table_and_files(tmp_path: Path) -> None:
    rows = table_rows(with_scaling(CLEAN), find_knee(CLEAN))
    text = format_table(rows, table_columns(CLEAN))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["c", "agg", "tok/s"]
    assert lines[5].split()[0] == "256" and lines[5].endswith("<- best")
    assert lines[6].endswith("<- regresses")
    csv_path, json_path, png_path = write_outputs(CLEAN, find_knee(CLEAN), ["a note"], tmp_path / "out")
    with csv_path.open() as handle:
        assert [row["concurrency"] for row in csv.DictReader(handle)] == ["1", "2", "4", "8", "256", "384"]
    payload = orjson.loads(json_path.read_bytes())
    assert payload["knee"] == {"best": 256, "regresses_at": 384} and payload["diagnostics"] == ["a note"]
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def simulated(concurrency: int, aggregate: float, **overrides: Any) -> LevelSummary:
    """A level against a simulator at --speed 50 on this machine: 10 s of wall time, 500 of the model's."""
    values = {"model_s": 500.0, "wall_s": 10.0, "speed": 50.0, "server_cpu_share": 0.3}
    return level(concurrency, aggregate, **{**values, "machine_cpu_share": 0.4, **overrides})


def test_against_a_simulator_the_table_names_model_time_and_wall_time() -> None:
    """At --speed 50 a sweep's seconds are the model's: the table says so, beside this machine's."""
    levels = [simulated(1, 33.5), simulated(16, 300.0)]
    columns = table_columns(levels)
    assert columns[3:5] == ["model s", "wall s"] and columns[-2:] == ["sim CPU %", "host CPU %"]
    header, first, _ = format_table(table_rows(levels, find_knee(levels)), columns).splitlines()
    assert header.split()[:8] == ["c", "agg", "tok/s", "per-seq", "model", "s", "wall", "s"]
    assert first.split()[3:5] == ["500.0", "10.0"] and first.split()[-2:] == ["30.0", "40.0"]
    assert sweep_lines(levels, 4242) == [
        "swept 2 levels in 20 s wall time (16.7 min of model time at --speed 50)",
        "the server is a simulator at --speed 50: times and rates are the model's (model s), wall s is "
        "this machine's clock",
        "the simulator runs on this machine (pid 4242): its CPU and the machine's were checked at each "
        "level, as this client's (sim CPU: % of one core; host CPU: % of all)",
    ]
    assert (
        sweep_lines(levels, None)[-1]
        == "the simulator was not found listening on this machine (/proc): its CPU is not checked"
    )


def test_against_a_real_server_wall_time_is_the_one_time() -> None:
    assert "model s" not in table_columns(CLEAN) and "sim CPU %" not in table_columns(CLEAN)
    assert sweep_lines(CLEAN, None) == ["swept 6 levels in 6.0 min wall time"]
    assert sweep_lines([CLEAN[0]], None) == ["swept 1 level in 60 s wall time"]


def test_a_busy_simulator_or_a_busy_machine_is_said_instead_of_blamed_on_the_model() -> None:
    levels = [simulated(1, 33.5), simulated(16, 300.0, server_cpu_share=0.95), simulated(32, 310.0)]
    levels[2] = dataclasses.replace(levels[2], machine_cpu_share=0.97)
    notes = diagnose(levels, timeout_s=900, max_tokens=400)
    assert notes[0].startswith("c=16: the simulator kept a CPU core of this machine busy")
    assert notes[1].startswith("c=32: this machine's CPUs were up to 97% busy with the simulator on them")
    assert diagnose([simulated(1, 33.5), simulated(16, 300.0)], timeout_s=900, max_tokens=400) == []


def test_a_curve_that_falls_and_rises_again_before_its_best_is_flagged() -> None:
    """The sweep on a loaded machine: c=32 below c=16, then a best at c=320."""
    levels = [level(8, 200), level(16, 455), level(32, 410), level(64, 450), level(320, 700), level(512, 690)]
    notes = diagnose(levels, timeout_s=900, max_tokens=400)
    assert notes == [
        "the curve is not monotonic: c=32 below c=16 (410 vs 455 tok/s), then its best at c=320: the knee "
        "is uncertain; sweep again (more --rounds, a quiet machine, a server no one else uses)"
    ]
    two = [level(8, 300), level(16, 250), level(32, 240), level(64, 700)]
    assert (
        "c=16 below c=8 (250 vs 300 tok/s); c=32 below c=8 (240 vs 300 tok/s), then"
        in diagnose(two, 900, 400)[0]
    )
    # Within 5% of a lower level is noise, not a fall; past the best, a fall is the knee's regression.
    assert diagnose([level(8, 200), level(16, 455), level(32, 440), level(64, 700)], 900, 400) == []
    assert diagnose(CLEAN, timeout_s=900, max_tokens=400) == []


def test_summarize_reads_times_in_the_servers_seconds() -> None:
    from pipeline.bench.load import RequestResult

    results = [RequestResult(0.0, 0.1, 1.1, 40, "stop", True, True) for _ in range(4)]
    results.append(RequestResult(0.0, None, 2.0, 0, None, False, False, error="HTTP 500"))
    results.append(RequestResult(0.0, 0.1, 0.2, 32, "length", True, False))
    server = ServerObservation(available=True, last={"pipeline_sim:speed": 10.0})
    summary = summarize(2, results, wall_s=3.0, server=server, client_cpu_s=0.3, server_cpu=(0.5, 0.25))
    assert summary.model_s == pytest.approx(30.0) and (summary.wall_s, summary.speed) == (3.0, 10.0)
    assert (summary.server_cpu_share, summary.machine_cpu_share) == (0.5, 0.25)
    assert summary.aggregate_tok_s == pytest.approx((4 * 40 + 32) / 30.0)
    assert summary.per_seq_tok_s == pytest.approx(4.0)  # 40 tokens over 1 s, at 10x: 4 tok/s
    assert summary.ttft_p50_s == pytest.approx(1.0)
    assert (summary.errors, summary.starved_by_reasoning) == (1, 1)
    assert summary.client_cpu_share == pytest.approx(0.1)


@pytest.fixture
async def gpt_oss_sim() -> AsyncIterator[tuple[str, SimServer]]:
    async with _sim(SimConfig(model="gpt-oss-120b", profile="gpt-oss-120b", speed=10.0, seed=1)) as running:
        yield running


@dataclasses.dataclass
class _sim:
    config: SimConfig

    async def __aenter__(self) -> tuple[str, SimServer]:
        self.sim = SimServer(self.config)
        self.server = await serve(self.sim.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1", self.sim

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        await self.server.wait_closed()


def options(url: str, *levels: int, **overrides: Any) -> BenchOptions:
    values: dict[str, Any] = {"prompt_tokens": 300, "output_tokens": 160, "rounds": 2, "timeout_s": 60.0}
    return BenchOptions(base_url=url, model="gpt-oss-120b", concurrency=levels, **{**values, **overrides})


async def test_sweep_against_the_calibrated_simulator(gpt_oss_sim: tuple[str, SimServer]) -> None:
    url, sim = gpt_oss_sim
    seen: list[int] = []
    result = await run_sweep(options(url, 1, 8), on_level=lambda done: seen.append(done.concurrency))
    one, eight = result.levels
    assert seen == [1, 8] and one.errors == eight.errors == 0
    profile = PROFILES["gpt-oss-120b"]
    # Read in the model's time (the speed is undone): per-sequence speed at c=1 is the profile's.
    assert one.per_seq_tok_s == pytest.approx(profile.decode_tokens_per_s(1), rel=0.2)
    assert eight.aggregate_tok_s > 2.5 * one.aggregate_tok_s
    assert eight.max_running == 8 and eight.max_waiting == 0
    assert eight.prefix_hit_rate is not None and eight.prefix_hit_rate > 0.5  # shared system prompt
    assert result.knee is not None and result.knee.best == 8
    assert result.diagnostics == []
    assert sim.metrics.requests == 1 + 2 * 1 + 2 * 8  # one unmeasured warm-up request first


async def test_no_prefix_means_no_prefix_hits(gpt_oss_sim: tuple[str, SimServer]) -> None:
    url, sim = gpt_oss_sim
    no_prefix = options(url, 4, shared_prefix=False, output_tokens=16, reasoning_effort=None, warmup=False)
    result = await run_sweep(no_prefix)
    assert result.levels[0].prefix_hit_rate == 0.0
    assert sim.metrics.requests == 8


async def test_a_server_queueing_below_the_concurrency_is_diagnosed() -> None:
    config = SimConfig(model="gpt-oss-120b", profile="gpt-oss-120b", speed=20.0, max_num_seqs=2)
    async with _sim(config) as (url, _):
        result = await run_sweep(options(url, 8, output_tokens=64))
    assert result.levels[0].max_running == 2 and (result.levels[0].max_waiting or 0) >= 4
    assert any("--max-num-seqs is below your concurrency" in note for note in result.diagnostics)


async def test_reasoning_starving_the_answer_is_diagnosed(gpt_oss_sim: tuple[str, SimServer]) -> None:
    url, _ = gpt_oss_sim  # low effort reasons for 96 tokens: a 48-token budget never reaches the answer
    result = await run_sweep(options(url, 2, output_tokens=48, structured=True))
    assert result.levels[0].starved_by_reasoning == result.levels[0].requests == 4
    assert any("reasoning is eating the token budget" in note for note in result.diagnostics)


async def test_structured_requests_get_answers(gpt_oss_sim: tuple[str, SimServer]) -> None:
    url, sim = gpt_oss_sim
    result = await run_sweep(options(url, 2, output_tokens=2000, structured=True, rounds=1))
    assert result.levels[0].errors == 0 and result.levels[0].starved_by_reasoning == 0
    assert sim.metrics.successes == 3  # the warm-up and two measured


async def test_an_unreachable_server_or_a_missing_model_fails_at_once() -> None:
    with pytest.raises(FatalRunError, match="127.0.0.1:9"):
        await run_sweep(options("http://127.0.0.1:9/v1", 1))
    async with _sim(SimConfig(model="other")) as (url, _):
        with pytest.raises(FatalRunError, match="does not serve model 'gpt-oss-120b'; it serves: other"):
            await run_sweep(options(url, 1))


@pytest.mark.process
def test_cli_prints_the_table_the_knee_and_writes_files(tmp_path: Path) -> None:
    with sim_server("--profile", "gpt-oss-120b", "--speed", "20", "--model", "gpt-oss-120b") as url:
        args = ["bench", "--endpoint", url, "--model", "gpt-oss-120b", "--concurrency", "1,4"]
        args += ["--prompt-tokens", "200", "--output-tokens", "64", "--rounds", "1", "--out", str(tmp_path)]
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("c "))
    assert lines[header + 1].split()[0] == "1" and lines[header + 2].split()[0] == "4"
    assert "model s  wall s" in lines[header] and lines[header].endswith("sim CPU %  host CPU %")
    assert "of model time at --speed 20)" in lines[header + 3]
    assert "the server is a simulator at --speed 20: times and rates are the model's" in result.stdout
    assert re.search(
        r"the simulator runs on this machine \(pid \d+\): its CPU and the machine's", result.stdout
    )
    assert "knee: best aggregate at c=4" in result.stdout
    assert {path.name for path in tmp_path.iterdir()} == {"bench.csv", "bench.json", "bench.png"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "1,x"], "--concurrency '1,x': expected numbers like 1,2,4"),
        (["--concurrency", "0"], "expected numbers >= 1"),
        ([], "bench needs --endpoint and --model, --job, or --local"),
    ],
)
def test_cli_configuration_errors(args: list[str], message: str) -> None:
    extra = ["--model", "m"] if args else []
    endpoint = ["--endpoint", "http://127.0.0.1:9/v1"] if args else []
    result = CliRunner().invoke(app, ["bench", *endpoint, *extra, *args])
    assert result.exit_code == 2
    assert message in result.output


def test_cli_local_starts_the_local_server_and_sweeps_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`bench --local` sweeps whatever the local server serves (stood in for by the simulator here;
    tests/integration/test_local_vllm.py sweeps the real one)."""
    import pipeline.local as local

    launched: list[object] = []

    async def fake_launch(options: object) -> object:
        launched.append(options)
        return "launch"

    class FakeLocalServer:
        def __init__(self, launch: object) -> None:
            assert launch == "launch"
            self.model = "smollm2-135m"

        async def __aenter__(self) -> FakeLocalServer:
            self.running = _sim(SimConfig(model=self.model, profile="nemotron-nano-9b", speed=50.0))
            self.base_url, _ = await self.running.__aenter__()
            return self

        async def __aexit__(self, *exc_info: object) -> None:
            await self.running.__aexit__(*exc_info)

    # `bench --local` imports these from pipeline.local when it runs (not when the CLI loads).
    monkeypatch.setattr(local, "vllm_launch", fake_launch)
    monkeypatch.setattr(local, "LocalServer", FakeLocalServer)
    args = ["bench", "--local", "--concurrency", "1,2", "--output-tokens", "32", "--rounds", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(launched) == 1
    levels = orjson.loads((tmp_path / "bench.json").read_bytes())["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    assert all(level["errors"] == 0 and level["aggregate_tok_s"] > 0 for level in levels)


def test_without_matplotlib_the_chart_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.bench import report

    monkeypatch.setattr(report, "plotting_available", lambda: False)
    written = write_outputs(CLEAN, find_knee(CLEAN), [], tmp_path / "out")
    assert [path.name for path in written] == ["bench.csv", "bench.json"]
    assert not (tmp_path / "out" / "bench.png").exists()


def test_a_job_bench_sends_the_jobs_own_requests(tmp_path: Path) -> None:
    from pipeline.bench.job import with_job
    from pipeline.bench.load import next_body
    from pipeline.store.opening import prepare_database
    from tests.support.jobs import make_job

    spec = make_job(tmp_path, records=30, extra_body={"top_k": 5}, max_tokens=321)
    prepare_database(spec).close()
    options = with_job(BenchOptions(base_url="", model="", concurrency=(1, 2), rounds=2), spec, 5)
    assert (options.base_url, options.model, options.output_tokens) == (
        "http://testserver/v1",
        "test-model",
        321,
    )
    assert len(options.job_bodies) == 5
    body = next_body(options, worker=1, index=1)
    system, user = body["messages"]
    assert system["content"].startswith("Extract the posting.") and '"skills"' in system["content"]
    assert user["content"].startswith("Title: Title ")
    assert body["response_format"]["type"] == "json_schema" and body["max_tokens"] == 321
    assert body["extra_body"] == {"top_k": 5} and body["stream"] is True  # what the SDK does not name
    assert next_body(options, worker=0, index=0) != body  # the workers go through different records
