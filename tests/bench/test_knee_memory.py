"""What `concurrency: auto` starts from, kept in the job's database (``runs.knees``): what a run too short
to bracket its knee learned, and a `pipeline bench --job JOB --seed-knee` sweep's best level; each is
where the next run starts. Against the simulator on 127.0.0.1, through the real client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import structlog
from structlog.testing import capture_logs
from typer.testing import CliRunner

from pipeline.bench.report import LevelSummary, queued
from pipeline.bench.seed import SEED_TOLERANCE, sweep_knee
from pipeline.cli import app
from pipeline.job.spec import JobSpec, load_job
from pipeline.run.runner import run_job
from pipeline.servers.knee_search import KneeMemory
from pipeline.source.db import open_database
from pipeline.store.opening import known_knees
from tests.support.jobs import make_source, table_rows, write_job
from tests.support.processes import sim_server
from tests.support.runs import options

pytestmark = pytest.mark.anyio

MODEL = "test-model"


def auto_job(folder: Path, url: str, records: int) -> tuple[Path, JobSpec]:
    path = write_job(folder, endpoint={"base_url": url}, concurrency="auto", max_concurrency=512)
    spec = load_job(path)
    make_source(spec.database, records)
    return path, spec


def stored_knees(spec: JobSpec) -> dict[str, KneeMemory]:
    connection = open_database(spec.database, read_only=True)
    try:
        return known_knees(connection, spec)
    finally:
        connection.close()


async def starting_levels(spec: JobSpec) -> list[Any]:
    """Run the job and say where `concurrency: auto` started, as its log says."""
    structlog.reset_defaults()  # a command run in this process set up its own logging, without info
    with capture_logs() as logs:
        summary = await run_job(spec, options())
    assert summary.failed == 0 and summary.done > 0
    return [entry["level"] for entry in logs if entry["event"].startswith("concurrency auto starts at")]


@pytest.mark.process
async def test_a_run_too_short_to_bracket_its_knee_leaves_what_it_learned_and_the_next_starts_there(
    tmp_path: Path,
) -> None:
    """A few seconds of gpt-oss-120b at 100x: windows at 8, then the ramp's first step; no knee."""
    with sim_server("--profile", "gpt-oss-120b", "--speed", "100", "--model", MODEL) as url:
        _, spec = auto_job(tmp_path, url, records=300)
        assert await starting_levels(spec) == []  # nothing known: the ramp from 8
        learned = stored_knees(spec)
        key = spec.endpoint_configs()[0].knee_key
        assert list(learned) == [key] and not learned[key].bracketed
        make_source(spec.database, 100, start=300)  # the next night's records
        assert await starting_levels(spec) == [learned[key].level]
    stored = table_rows(spec.database, "SELECT knees FROM runs ORDER BY run_id")
    first = orjson.loads(stored[0][0])[key]
    assert first["bracketed"] is False and first["level"] == learned[key].level


@pytest.mark.process
def test_a_bench_sweep_seeds_the_knee_the_next_auto_run_starts_from(tmp_path: Path) -> None:
    """nemotron-nano-9b runs 8 sequences and queues the rest: c=16 and c=32 deliver what c=8 does,
    give or take the noise, with requests waiting. The knee kept is c=8, whichever of them measured
    highest (before: the highest, c=16 at +1.4%)."""
    # Slow enough that each level's queue shows in the server's /metrics.
    with sim_server("--profile", "nemotron-nano-9b", "--speed", "20", "--model", MODEL) as url:
        path, spec = auto_job(tmp_path, url, records=60)
        swept = "2,8,16,32"
        args = ["bench", "--job", str(path), "--concurrency", swept, "--rounds", "2", "--records", "20"]
        result = CliRunner().invoke(app, [*args, "--seed-knee", "--out", str(tmp_path / "bench")])
        assert result.exit_code == 0, result.output
        levels = orjson.loads((tmp_path / "bench" / "bench.json").read_bytes())["levels"]
        assert [queued(LevelSummary(**level)) for level in levels] == [False, False, True, True]
        key = spec.endpoint_configs()[0].knee_key
        assert f"kept c=8 as the knee of {url} ({MODEL}) in {spec.database}" in result.output
        assert "the lowest level within 5% of the best that did not queue" in result.output
        assert stored_knees(spec) == {key: KneeMemory(8, False, worse_below=2, worse_above=16)}
        assert table_rows(spec.database, "SELECT status, done, concurrency FROM runs") == [("bench", 0, 8)]
        assert anyio.run(starting_levels, spec) == [8]
    assert table_rows(spec.database, "SELECT status FROM runs ORDER BY run_id")[1][0] == "completed"


def test_seeding_a_knee_needs_a_job() -> None:
    args = ["bench", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--seed-knee"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--seed-knee needs --job: the knee is kept in the job's database" in result.output


def summary(
    concurrency: int, aggregate: float, running: float | None = None, waiting: float | None = None
) -> LevelSummary:
    return LevelSummary(
        concurrency,
        10,
        0,
        1.0,
        aggregate,
        aggregate / concurrency,
        None,
        None,
        1.0,
        0,
        running,
        waiting,
        None,
        None,
    )


def test_a_sweeps_knee_is_its_best_level_between_the_nearest_swept_ones() -> None:
    levels = [
        summary(1, 30.0),
        summary(64, 370.0),
        summary(128, 560.0),
        summary(256, 860.0),
        summary(384, 770.0),
    ]
    assert sweep_knee(levels) == KneeMemory(256, bracketed=False, worse_below=128, worse_above=384)
    assert sweep_knee(levels[:4]) == KneeMemory(256, bracketed=False, worse_below=128)  # the top swept
    assert sweep_knee([summary(8, 0.0)]) is None  # nothing delivered: nothing to keep


def test_the_knee_kept_is_the_lowest_level_near_the_best_that_did_not_queue() -> None:
    """A server that runs 8 at most: c=16 did 1.4% more than c=8 with 8 requests waiting, which is
    c=8's throughput with a queue in front; before, c=16 was kept."""
    flat = [
        summary(2, 300.0, 2, 0),
        summary(8, 1000.0, 8, 0),
        summary(16, 1014.0, 8, 8),
        summary(32, 1010.0, 8, 24),
    ]
    assert sweep_knee(flat) == KneeMemory(8, bracketed=False, worse_below=2, worse_above=16)
    # Within the tolerance of the best, the lowest level; above it, the first that did worse than it.
    near = [summary(64, 700.0), summary(128, 836.0), summary(256, 860.0), summary(384, 770.0)]
    assert SEED_TOLERANCE == 0.05 and 860.0 * (1 - SEED_TOLERANCE) <= 836.0
    assert sweep_knee(near) == KneeMemory(128, bracketed=False, worse_below=64, worse_above=384)
    # Every level queued (a server smaller than the sweep's first level): the same rule over them all.
    assert sweep_knee([summary(16, 500.0, 4, 12), summary(32, 520.0, 4, 28)]) == KneeMemory(
        16, bracketed=False, worse_above=32
    )
