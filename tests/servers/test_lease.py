"""Jobs on one machine reach one pool over a Unix socket: the first hosts it, the next reports to it, and
when the host is gone another takes it over at the same level."""

from __future__ import annotations

import secrets

import anyio
import pytest

from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.lease import SHARED, Lease, pool_address, server_key
from pipeline.servers.limits import AdaptiveLimit
from tests.support.waiting import until

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not SHARED, reason="Linux's abstract sockets")]


def controller(known: KneeMemory | None = None, level: int = 64) -> AdaptiveLimit:
    return AdaptiveLimit(
        maximum=512, timeout_s=900, initial=level, known_knee=known, clock=anyio.current_time
    )


def lease(address: str) -> Lease:
    return Lease(address, controller, clock=anyio.current_time, scrape_every_s=1.0)


def test_one_server_one_pool_however_its_url_is_written() -> None:
    assert server_key("http://localhost:8000/v1") == server_key("http://127.0.0.1:8000/")
    assert pool_address("http://a:8000/v1") != pool_address("http://b:8000/v1")


async def test_the_second_job_takes_its_part_from_the_first_jobs_pool_and_takes_it_over() -> None:
    address = f"\0pipeline-test-{secrets.token_hex(6)}"
    first, second = lease(address), lease(address)
    host = await first.open(controller())
    assert first.hosting and host.update(in_flight=0, waiting=500) is None
    assert host.pool_limit == 64 and host.limit == 8  # its room doubles a tick from 8
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first.run, 0.05)
        member = await second.open(controller(level=8))  # its own start counts for nothing
        assert not second.hosting and member.pool_limit == 64 and member.jobs == 2
        tasks.start_soon(second.run, 0.05)
        for _ in range(10):
            host.update(in_flight=min(host.limit, 32), waiting=500)
            member.update(in_flight=member.limit, waiting=500)
            await anyio.sleep(0.06)
        assert (host.limit, member.limit) == (32, 32)
        first.close()  # the host's job ends: the other hosts the pool now, at the same level
        await until(lambda: second.hosting, every_s=0.05)
        member.update(in_flight=32, waiting=500)
        assert member.pool_limit == 64 and member.limit == 64 and member.jobs == 1
        tasks.cancel_scope.cancel()


async def test_a_job_that_reaches_no_pool_keeps_its_own_limit() -> None:
    taken = lease("\0" + "x" * 200)  # longer than a socket's address may be
    with pytest.raises(OSError, match="no pool of this machine"):
        await taken.open(controller())
