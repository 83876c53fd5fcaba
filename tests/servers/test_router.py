"""The router: least loaded relative to its limit, endpoints held while they are gone and probed back,
a stalled endpoint evacuated when another is up, the run ended only when every endpoint is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
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
from pipeline.servers.limits import AdaptiveLimit, LimitChange
from pipeline.servers.router import Router
from tests.support.fakes import LoopbackServer, good_completion, respond, serving
from tests.support.jobs import write_job
from tests.support.waiting import until

pytestmark = pytest.mark.anyio


@dataclass
class FakeServer:
    """Answers /models and chat completions on 127.0.0.1. Down (stopped: connections are refused)
    until the router has waited ``down_for_sleeps`` times between its probes."""

    down_for_sleeps: int = 0
    models: tuple[str, ...] = ("test-model",)
    probes: int = 0  # answered ones: a refused probe never reaches the server
    chats: int = 0
    loopback: LoopbackServer | None = None

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            self.probes += 1
            return respond({"data": [{"id": name} for name in self.models]})
        self.chats += 1
        return respond(good_completion())

    async def go_down(self, for_sleeps: int = 10**6) -> None:
        assert self.loopback is not None
        await self.loopback.stop()
        self.down_for_sleeps = for_sleeps

    async def waited(self) -> None:
        """The router waited once between probes: a server due back comes back."""
        if self.down_for_sleeps:
            self.down_for_sleeps -= 1
            if not self.down_for_sleeps and self.loopback is not None:
                await self.loopback.start()


@dataclass
class Clock:
    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    servers: list[FakeServer] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        for server in self.servers:
            await server.waited()
        await anyio.lowlevel.checkpoint()


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return load_job(write_job(tmp_path))


MakeEndpoint = Callable[[FakeServer, int | None, Clock], Awaitable[Endpoint]]


@pytest.fixture
async def make_endpoint(spec: JobSpec) -> AsyncIterator[MakeEndpoint]:
    """Endpoints over fake servers served on 127.0.0.1, all stopped at the test's end."""
    async with AsyncExitStack() as stack:

        async def make(server: FakeServer, limit: int | None, clock: Clock) -> Endpoint:
            server.loopback = await stack.enter_async_context(serving(server))
            clock.servers.append(server)
            if server.down_for_sleeps:
                await server.loopback.stop()
            config = EndpointConfig(server.loopback.url, "test-model", limit, 64, None, True)
            client = await stack.enter_async_context(LLMClient(client_settings(spec, config)))
            return Endpoint(config, client, abort_after_failures=3, timeout_s=30.0, clock=clock)

        yield make


def make_router(endpoints: list[Endpoint], clock: Clock, *, give_up_after_s: float = 1800.0) -> Router:
    return Router(
        endpoints, give_up_after_s=give_up_after_s, stall_after_s=600.0, probe_sleep=clock.sleep, clock=clock
    )


async def test_each_request_goes_to_the_least_loaded_endpoint_relative_to_its_limit(
    make_endpoint: MakeEndpoint,
) -> None:
    clock = Clock()
    big = await make_endpoint(FakeServer(), 4, clock)
    small = await make_endpoint(FakeServer(), 2, clock)
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
        assert picks == [big.name, small.name, big.name, big.name, small.name, big.name]
        done.set()
    assert (big.in_use, small.in_use) == (0, 0)


async def test_a_full_router_waits_for_a_free_slot(make_endpoint: MakeEndpoint) -> None:
    clock = Clock()
    only = await make_endpoint(FakeServer(), 1, clock)
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
        await until(lambda: len(order) == 2)
        assert order == ["first", "second"]
        second.set()


async def test_a_down_endpoint_is_skipped_probed_with_backoff_and_rejoins(
    make_endpoint: MakeEndpoint,
) -> None:
    clock = Clock()
    server = FakeServer(down_for_sleeps=6)  # five probes refused, the sixth answered
    gone = await make_endpoint(server, 2, clock)
    other = await make_endpoint(FakeServer(), 2, clock)
    router = make_router([gone, other], clock)
    async with anyio.create_task_group() as background:
        await background.start(router.run)
        router.report_down(gone, "refused")
        async with router.slot() as endpoint, router.slot() as second:
            assert (endpoint.name, second.name) == (other.name, other.name)
        while not gone.health.up:
            await anyio.lowlevel.checkpoint()
        assert clock.sleeps[:6] == [1, 2, 4, 5, 5, 5]  # doubling, capped at PROBE_MAX_S
        assert server.probes == 1 and gone.stats.outages == 1  # a refused probe never reaches it
        async with router.slot() as endpoint:
            assert endpoint.name == gone.name  # back in the rotation, and least loaded
        background.cancel_scope.cancel()


async def test_every_endpoint_gone_too_long_ends_the_run_for_every_waiter(
    make_endpoint: MakeEndpoint,
) -> None:
    clock = Clock()
    endpoints = [await make_endpoint(FakeServer(down_for_sleeps=10**6), 1, clock) for _ in range(2)]
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
    assert "every endpoint stayed unreachable" in str(failures[0]) and f"{endpoints[0].name}: refused" in str(
        failures[0]
    )
    with pytest.raises(ServerDownError):
        async with router.slot():
            pass


async def test_one_endpoint_gone_is_not_the_end_while_another_answers(make_endpoint: MakeEndpoint) -> None:
    clock = Clock()
    gone = await make_endpoint(FakeServer(down_for_sleeps=10**6), 1, clock)
    alive = await make_endpoint(FakeServer(), 1, clock)
    router = make_router([gone, alive], clock, give_up_after_s=10)
    async with anyio.create_task_group() as background:
        await background.start(router.run)
        router.report_down(gone, "refused")
        while clock.now < 50:
            async with router.slot() as endpoint:
                assert endpoint is alive
            await anyio.lowlevel.checkpoint()
        background.cancel_scope.cancel()


async def test_a_stalled_endpoint_is_evacuated_when_another_is_up(make_endpoint: MakeEndpoint) -> None:
    clock = Clock()
    server = FakeServer()
    stalled = await make_endpoint(server, 2, clock)
    alive = await make_endpoint(FakeServer(), 2, clock)
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
        with anyio.fail_after(5):  # the evacuation and the completion probe run in the group: wait for them
            while not (evacuated and server.chats and stalled.health.up):
                await anyio.lowlevel.checkpoint()
        assert evacuated == [f"{stalled.name} stalled; the request goes to another endpoint"]
        assert stalled.stats.outages == 1
        # a server that lists its models may still have a hung engine: only a completion brings it back
        assert (server.chats, server.probes) == (1, 0) and stalled.health.up
        group.cancel_scope.cancel()


async def test_a_lone_stalled_endpoint_is_left_to_the_run_watchdog(make_endpoint: MakeEndpoint) -> None:
    clock = Clock()
    only = await make_endpoint(FakeServer(), 2, clock)
    router = make_router([only], clock)
    only.in_use = 1
    clock.now = 10_000.0
    router._watch_stalls()
    assert only.health.up


async def test_a_lost_connection_is_confirmed_by_one_probe(make_endpoint: MakeEndpoint) -> None:
    clock = Clock()
    server = FakeServer()
    endpoint = await make_endpoint(server, 4, clock)
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
        await server.go_down()
        clock.now += 5
        assert await router.confirm_lost(endpoint, "reset") is True
        assert not endpoint.health.up and endpoint.health.reason == "reset"
        background.cancel_scope.cancel()


async def test_server_side_failures_in_a_row_take_an_endpoint_out_or_end_the_run(
    make_endpoint: MakeEndpoint,
) -> None:
    clock = Clock()
    broken = await make_endpoint(FakeServer(), 1, clock)
    fine = await make_endpoint(FakeServer(), 1, clock)
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
            FatalRunError, match=f"3 records in a row failed on the server side at {fine.config.base_url}"
        ):
            router.record_finished(fine, server_side_failure=True, error="HTTP 500")
        background.cancel_scope.cancel()


async def test_preflight_starts_without_a_silent_endpoint_and_not_without_all(
    make_endpoint: MakeEndpoint,
) -> None:
    clock = Clock()
    down = await make_endpoint(FakeServer(down_for_sleeps=1), 1, clock)
    up = await make_endpoint(FakeServer(), 1, clock)
    await make_router([down, up], clock).check_servers()
    assert not down.health.up and up.health.up
    lonely = await make_endpoint(FakeServer(down_for_sleeps=1), 1, clock)
    with pytest.raises(EndpointUnreachableError, match=f"cannot connect to {lonely.config.base_url}"):
        await make_router([lonely], clock).check_servers()
    wrong = await make_endpoint(FakeServer(models=("other",)), 1, clock)
    fine = await make_endpoint(FakeServer(), 1, clock)
    with pytest.raises(ModelNotServedError, match="does not serve model 'test-model'; it serves: other"):
        await make_router([wrong, fine], clock).check_servers()


async def test_a_limit_change_applies_at_once_and_wakes_waiters(
    make_endpoint: MakeEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    auto = await make_endpoint(FakeServer(), None, clock)
    controller = auto.controller
    assert isinstance(controller, AdaptiveLimit) and auto.limit == 8

    def moved(**_: object) -> LimitChange:
        controller._limit = 16
        return LimitChange(8, 16, "throughput rose")

    monkeypatch.setattr(controller, "update", moved)
    router = make_router([auto], clock)
    router._adapt()
    assert auto.limit == 16
