"""An endpoint (one server as a run uses it; tests/servers/test_router.py tests it in use) with
`concurrency: auto` tells the other jobs on this machine what it holds at each scrape and gives its
controller theirs (:mod:`pipeline.servers.peers`); a board it cannot write costs nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from pipeline.extraction.prompt import client_settings
from pipeline.job.spec import load_job
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.peers import FileBoard, Peer
from tests.support.jobs import write_job

URL = "http://127.0.0.1:8000/v1"


def endpoint(tmp_path: Path, board: FileBoard | None, concurrency: int | None = None) -> Endpoint:
    spec = load_job(write_job(tmp_path))
    config = EndpointConfig(URL, "test-model", concurrency, 512, None, True)
    client = LLMClient(client_settings(spec, config))
    return Endpoint(config, client, abort_after_failures=3, timeout_s=900.0, peers=board)


@pytest.mark.anyio
async def test_an_auto_endpoint_says_what_it_holds_and_its_controller_hears_the_others(
    tmp_path: Path,
) -> None:
    other = FileBoard(URL, tmp_path / "peers")
    other.exchange(40, 48)
    mine = endpoint(tmp_path, FileBoard("http://localhost:8000", tmp_path / "peers"))
    mine.in_use = mine.limit
    assert await mine.tell_peers() == (Peer(40, 48, earlier=True),)  # it came first
    assert mine.controller is not None and mine.controller._server.peers == (Peer(40, 48, earlier=True),)
    assert other.exchange(40, 48) == (Peer(mine.limit, mine.limit, earlier=False),)
    mine.leave_peers()
    assert other.exchange(40, 48) == ()


@pytest.mark.anyio
async def test_a_board_that_cannot_be_written_is_said_once_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "in-the-way").write_text("")
    mine = endpoint(tmp_path, FileBoard(URL, tmp_path / "in-the-way"))
    with capture_logs() as logs:
        assert await mine.tell_peers() == ()
        assert await mine.tell_peers() == ()
    (warning,) = [log for log in logs if log["log_level"] == "warning"]
    assert warning["event"].startswith("other jobs on this machine are seen only in the server's counts: ")
    assert mine.peers is None
    mine.leave_peers()  # nothing to remove, no error


def test_a_fixed_concurrency_says_nothing_to_other_jobs(tmp_path: Path) -> None:
    assert endpoint(tmp_path, FileBoard(URL, tmp_path / "peers"), concurrency=16).peers is None
