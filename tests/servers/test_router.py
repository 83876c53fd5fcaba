"""The router: least loaded relative to its limit, endpoints held while they are gone and probed back,
a stalled endpoint evacuated when another is up, the run ended only when every endpoint is gone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.lowlevel
import httpx2
import pytest

from pipeline.errors import EndpointUnreachableError, FatalRunError, ModelNotServedError, ServerDownError
from pipeline.extraction.prompt import client_settings
from pipeline.job.spec import JobSpec, load_job
from pipeline.servers.client import LLMClient
from pipeline.servers.config import EndpointConfig
from pipeline.servers.endpoint import Endpoint, EndpointEvacuatedError
from pipeline.servers.limits import LimitChange
from pipeline.servers.router import Router
from tests.support.fakes import good_completion, respond
from tests.support.jobs import write_job

pytestmark = pytest.mark.anyio


@dataclass
class FakeServer:
    """Answers /models (down for the first ``down_for_probes`` calls) and chat completions."""

    down_for_probes: int = 0
    models: tuple[str, ...] = ("test-model",)
    probes: int = 0
    chats: int = 0

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            self.probes += 1
            if self.probes <= self.down_for_probes:
                raise httpx2.ConnectError("Connection refused")
            return respond({"data": [{"id": name} for name in self.models]})
        self.chats += 1
        return respond(good_completion())


@dataclass
class Clock:
    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await anyio.lowlevel.checkpoint()


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return load_job(write_job(tmp_path))


def make_endpoint(
    spec: JobSpec, server: FakeServer, url: str, limit: int | None, clock: Callable[[], float]
) -> Endpoint:
    config = EndpointConfig(url, "test-model", limit, 64, None, True)
    client = LLMClient(client_settings(spec, config), transport=httpx2.MockTransport(server))
    return Endpoint(config, client, abort_after_failures=3, timeout_s=30.0, clock=clock)


def make_router(endpoints: list[Endpoint], clock: Clock, *, give_up_after_s: float = 1800.0) -> Router:
    return Router(
        endpoints, give_up_after_s=give_up_after_s, stall_after_s=600.0, probe_sleep=clock.sleep, clock=clock
    )


async def test_each_request_goes_to_the_least_loaded_endpoint_relative_to_its_limit(spec: JobSpec) -> None:
    clock = Clock()
    big = make_endpoint(spec, FakeServer(), "http://big:1/v1", 4, clock)
    small = make_endpoint(spec, FakeServer(), "http://small:1/v1", 2, clock)
    router = make_router([big, small], clock)
    picks = []
    async with anyio.create_task_group() as group:
        done = anyio.Event()

        async def hold() -> None:
            async with router.slot() as endpoint:
                picks.append(endpoint.name)
                await done.wait()

        for _ in range(6):
            group.start_soon(hold)
            await anyio.lowlevel.checkpoint()
        assert (big.in_use, small.in_use) == (4, 2)
        assert picks == ["big:1", "small:1", "big:1", "big:1", "small:1", "big:1"]
        done.set()
    assert (big.in_use, small.in_use) == (0, 0)


async def test_a_full_router_waits_for_a_free_slot(spec: JobSpec) -> None:
    clock = Clock()
    only = make_endpoint(spec, FakeServer(), "http://one:1/v1", 1, clock)
    router = make_router([only], clock)
    order = []

    async def use(name: str, release: anyio.Event) -> None:
        async with router.slot():
            order.append(name)
            await release.wait()

    first, second = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(use, "first", first)
        await anyio.lowlevel.checkpoint()
        group.start_soon(use, "second", second)
        await anyio.lowlevel.checkpoint()
        assert order == ["first"]
        first.set()
        await anyio.sleep(0.01)
        assert order == ["first", "second"]
        second.set()


async def test_a_down_endpoint_is_skipped_probed_with_backoff_and_rejoins(spec: JobSpec) -> None:
    clock = Clock()
    server = FakeServer(down_for_probes=5)
    gone = make_endpoint(spec, server, "http://gone:1/v1", 2, clock)
    other = make_endpoint(spec, FakeServer(), "http://other:1/v1", 2, clock)
    router = make_router([gone, other], clock)
    async with anyio.create_task_group() as background:
        await background.start(router.run)
        router.report_down(gone, "refused")
        async with router.slot() as endpoint, router.slot() as second:
            assert (endpoint.name, second.name) == ("other:1", "other:1")
        while not gone.health.up:
            await anyio.lowlevel.checkpoint()
        assert clock.sleeps[:6] == [1, 2, 4, 5, 5, 5]  # doubling, capped at PROBE_MAX_S
        assert server.probes == 6 and gone.stats.outages == 1
        async with router.slot() as endpoint:
            assert endpoint.name == "gone:1"  # back in the rotation, and least loaded
        background.cancel_scope.cancel()


async def test_every_endpoint_gone_too_long_ends_the_run_for_every_waiter(spec: JobSpec) -> None:
    clock = Clock()
    endpoints = [
        make_endpoint(spec, FakeServer(down_for_probes=10**6), f"http://e{i}:1/v1", 1, clock)
        for i in range(2)
    ]
    router = make_router(endpoints, clock, give_up_after_s=100)
    failures: list[ServerDownError] = []

    async def waiter() -> None:
        try:
            async with router.slot():
                pass
        except ServerDownError as error:
            failures.append(error)

    async with anyio.create_task_group() as background:
        await background.start(router.run)
        for endpoint in endpoints:
            router.report_down(endpoint, "refused")
        async with anyio.create_task_group() as waiters:
            for _ in range(3):
                waiters.start_soon(waiter)
        background.cancel_scope.cancel()
    assert len(failures) == 3 and clock.now >= 100
    assert "every endpoint stayed unreachable" in str(failures[0]) and "e0:1: refused" in str(failures[0])
    with pytest.raises(ServerDownError):
        async with router.slot():
            pass


async def test_one_endpoint_gone_is_not_the_end_while_another_answers(spec: JobSpec) -> None:
    clock = Clock()
    gone = make_endpoint(spec, FakeServer(down_for_probes=10**6), "http://gone:1/v1", 1, clock)
    alive = make_endpoint(spec, FakeServer(), "http://alive:1/v1", 1, clock)
    router = make_router([gone, alive], clock, give_up_after_s=10)
    async with anyio.create_task_group() as background:
        await background.start(router.run)
        router.report_down(gone, "refused")
        while clock.now < 50:
            async with router.slot() as endpoint:
                assert endpoint is alive
            await anyio.lowlevel.checkpoint()
        background.cancel_scope.cancel()


async def test_a_stalled_endpoint_is_evacuated_when_another_is_up(spec: JobSpec) -> None:
    clock = Clock()
    server = FakeServer()
    stalled = make_endpoint(spec, server, "http://stalled:1/v1", 2, clock)
    alive = make_endpoint(spec, FakeServer(), "http://alive:1/v1", 2, clock)
    router = make_router([stalled, alive], clock)
    evacuated: list[str] = []
    never = anyio.Event()

    async def request() -> None:
        async with router.slot() as endpoint:
            try:
                with endpoint.request():
                    await never.wait()  # a request the server never answers
            except EndpointEvacuatedError as error:
                evacuated.append(str(error))

    async with anyio.create_task_group() as group:
        group.start_soon(request)
        await anyio.lowlevel.checkpoint()
        assert stalled.in_use == 1
        router._tasks = group
        clock.now = 601.0
        router._watch_stalls()
        await anyio.sleep(0.01)
        assert evacuated == ["stalled:1 stalled; the request goes to another endpoint"]
        assert stalled.stats.outages == 1
        # a server that lists its models may still have a hung engine: only a completion brings it back
        assert (server.chats, server.probes) == (1, 0) and stalled.health.up
        group.cancel_scope.cancel()


async def test_a_lone_stalled_endpoint_is_left_to_the_run_watchdog(spec: JobSpec) -> None:
    clock = Clock()
    only = make_endpoint(spec, FakeServer(), "http://one:1/v1", 2, clock)
    router = make_router([only], clock)
    only.in_use = 1
    clock.now = 10_000.0
    router._watch_stalls()
    assert only.health.up


async def test_a_lost_connection_is_confirmed_by_one_probe(spec: JobSpec) -> None:
    clock = Clock()
    server = FakeServer()
    endpoint = make_endpoint(spec, server, "http://one:1/v1", 4, clock)
    router = make_router([endpoint], clock)
    async with anyio.create_task_group() as background:
        await background.start(router.run)
        results = []

        async def confirm() -> None:
            results.append(await router.confirm_lost(endpoint, "reset"))

        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(confirm)
        assert results == [False] * 5 and server.probes == 1  # the server is up: one request's bad luck
        server.down_for_probes = 10**6
        clock.now += 5
        assert await router.confirm_lost(endpoint, "reset") is True
        assert not endpoint.health.up and endpoint.health.reason == "reset"
        background.cancel_scope.cancel()


async def test_server_side_failures_in_a_row_take_an_endpoint_out_or_end_the_run(spec: JobSpec) -> None:
    clock = Clock()
    broken = make_endpoint(spec, FakeServer(), "http://broken:1/v1", 1, clock)
    fine = make_endpoint(spec, FakeServer(), "http://fine:1/v1", 1, clock)
    router = make_router([broken, fine], clock)
    async with anyio.create_task_group() as background:
        await background.start(router.run)
        for _ in range(3):
            router.record_finished(broken, server_side_failure=True, error="HTTP 500")
        assert not broken.health.up and broken.health.probe_completion
        for _ in range(2):
            router.record_finished(fine, server_side_failure=True, error="HTTP 500")
        router.record_finished(fine, server_side_failure=False, error="")  # a success resets the count
        router.record_finished(fine, server_side_failure=True, error="HTTP 500")
        assert fine.health.up
        router.record_finished(fine, server_side_failure=True, error="HTTP 500")
        with pytest.raises(
            FatalRunError, match="3 records in a row failed on the server side at http://fine"
        ):
            router.record_finished(fine, server_side_failure=True, error="HTTP 500")
        background.cancel_scope.cancel()


async def test_preflight_starts_without_a_silent_endpoint_and_not_without_all(spec: JobSpec) -> None:
    clock = Clock()
    down = make_endpoint(spec, FakeServer(down_for_probes=1), "http://down:1/v1", 1, clock)
    up = make_endpoint(spec, FakeServer(), "http://up:1/v1", 1, clock)
    await make_router([down, up], clock).check_servers()
    assert not down.health.up and up.health.up
    lonely = make_endpoint(spec, FakeServer(down_for_probes=1), "http://lonely:1/v1", 1, clock)
    with pytest.raises(EndpointUnreachableError, match="cannot connect to http://lonely:1/v1"):
        await make_router([lonely], clock).check_servers()
    wrong = make_endpoint(spec, FakeServer(models=("other",)), "http://wrong:1/v1", 1, clock)
    fine = make_endpoint(spec, FakeServer(), "http://fine:1/v1", 1, clock)
    with pytest.raises(ModelNotServedError, match="does not serve model 'test-model'; it serves: other"):
        await make_router([wrong, fine], clock).check_servers()


async def test_a_limit_change_applies_at_once_and_wakes_waiters(spec: JobSpec) -> None:
    clock = Clock()
    auto = make_endpoint(spec, FakeServer(), "http://auto:1/v1", None, clock)
    assert auto.controller is not None and auto.limit == 8
    auto.controller.update = lambda **_: LimitChange(8, 16, "throughput rose")  # type: ignore[method-assign]
    router = make_router([auto], clock)
    router._adapt()
    assert auto.limit == 16
