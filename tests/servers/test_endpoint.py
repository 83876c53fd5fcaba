"""An endpoint (one server as a run uses it; tests/servers/test_router.py tests it in use) with
`concurrency: auto` takes its requests from the pool of this machine's jobs on its server
(:mod:`pipeline.servers.lease`): the first hosts it, the next is a member of it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from pipeline.extraction.prompt import client_settings
from pipeline.job.spec import load_job
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.lease import SHARED
from pipeline.servers.limits import AdaptiveLimit
from pipeline.servers.slot_pool import Member
from tests.support.jobs import write_job


def endpoint(tmp_path: Path, url: str, concurrency: int | None = None) -> Endpoint:
    spec = load_job(write_job(tmp_path))
    config = EndpointConfig(url, "test-model", concurrency, 512, None, True)
    client = LLMClient(client_settings(spec, config))
    return Endpoint(config, client, abort_after_failures=3, timeout_s=900.0, pooled=True)


@pytest.mark.anyio
@pytest.mark.skipif(not SHARED, reason="Linux's abstract sockets")
async def test_auto_endpoints_of_one_server_take_their_requests_from_one_pool(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{1024 + hash(tmp_path) % 60000}/v1"  # no server there: only the pool's
    first, second = endpoint(tmp_path, url), endpoint(tmp_path, url.replace("127.0.0.1", "localhost"))
    await first.join_pool(1.0)
    assert first.lease is not None and first.lease.hosting
    assert isinstance(first.deciding, AdaptiveLimit)  # the pool's search runs in the first job
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first.lease.run, 0.05)  # as its router does
        await second.join_pool(1.0)
        assert second.lease is not None and not second.lease.hosting and second.deciding is None
        assert isinstance(second.controller, Member) and second.controller.jobs == 2
        second.leave_pool()
        first.leave_pool()


@pytest.mark.anyio
async def test_a_fixed_concurrency_takes_no_part_in_a_pool(tmp_path: Path) -> None:
    fixed = endpoint(tmp_path, "http://127.0.0.1:8000/v1", concurrency=16)
    await fixed.join_pool(1.0)
    assert fixed.lease is None and fixed.controller is None and fixed.limit == 16
