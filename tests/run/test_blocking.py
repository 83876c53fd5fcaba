"""A run from a notebook: awaited in the kernel's running event loop, or through ``run_job_sync``
there and in a plain script; against the simulator on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.run.blocking import run_job_sync
from pipeline.run.options import RunOptions, RunStatus
from pipeline.run.runner import run_job
from tests.support.jobs import make_job, table_rows
from tests.support.logged_run import some_done, wait_for_snapshot
from tests.support.process_guard import starts_a_process
from tests.support.processes import sim_server
from tests.support.runs import options


@pytest.fixture(scope="module")
@starts_a_process
def sim_url() -> Iterator[str]:
    with sim_server("--model", "test-model") as url:
        yield url


def sim_job(folder: Path, url: str, records: int = 30, **overrides: object) -> JobSpec:
    return make_job(folder, records=records, endpoint={"base_url": url}, **overrides)


@pytest.mark.anyio
async def test_run_job_is_awaited_in_a_running_loop_where_anyio_run_fails(
    tmp_path: Path, sim_url: str
) -> None:
    spec = sim_job(tmp_path, sim_url)
    with pytest.raises(RuntimeError, match="Already running asyncio in this thread"):
        anyio.run(run_job, spec)  # the old README example, in a notebook cell
    summary = await run_job(spec, options())
    assert (summary.status, summary.done) == (RunStatus.COMPLETED, 30)


@pytest.mark.anyio
async def test_run_job_sync_inside_a_running_loop(tmp_path: Path, sim_url: str) -> None:
    asyncio.get_running_loop()  # as in a notebook cell: this thread's loop is running
    spec = sim_job(tmp_path, sim_url)
    summary = run_job_sync(spec, options(limit=10))
    assert (summary.status, summary.done) == (RunStatus.COMPLETED, 10)
    assert run_job_sync(spec, options()).done == 20
    with pytest.raises(ConfigError, match=r"^RunOptions\(handle_signals=True\) needs an event loop"):
        run_job_sync(spec, RunOptions(handle_signals=True))


def test_run_job_sync_in_a_plain_script(tmp_path: Path, sim_url: str) -> None:
    spec = sim_job(tmp_path, sim_url)
    summary = run_job_sync(spec, options())
    assert (summary.status, summary.done) == (RunStatus.COMPLETED, 30)
    assert run_job_sync(spec, options()).status is RunStatus.NOTHING_TO_DO
    assert table_rows(spec.database, "SELECT count(*) FROM results") == [(30,)]


@pytest.mark.process
@pytest.mark.anyio
async def test_interrupting_run_job_sync_in_a_notebook_stops_the_run_and_keeps_what_it_did(
    tmp_path: Path,
) -> None:
    with sim_server("--model", "test-model", "--latency", "0.2") as url:
        spec = sim_job(tmp_path, url, records=200, concurrency=8)
        # What the kernel does while a cell runs: SIGINT (its stop button) raises KeyboardInterrupt,
        # here once the run's snapshot says some records are done.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        ended = threading.Event()

        def interrupt_once_some_are_done() -> None:
            wait_for_snapshot(spec.database, None, lambda now: ended.is_set() or some_done(now))
            if not ended.is_set():
                os.kill(os.getpid(), signal.SIGINT)

        interrupt = threading.Thread(target=interrupt_once_some_are_done, daemon=True)
        interrupt.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                run_job_sync(spec, options())
        finally:
            ended.set()
            signal.signal(signal.SIGINT, previous)
        done = table_rows(spec.database, "SELECT count(*) FROM results")[0][0]
        assert 0 < done < 200
        resumed = run_job_sync(spec, options())  # the run let go of the job: the next one resumes
    assert resumed.done == 200 - done
