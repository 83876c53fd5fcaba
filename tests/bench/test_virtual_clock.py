"""The closed loop's event loop on virtual time."""

from __future__ import annotations

import asyncio

from pipeline.bench.virtual_clock import VirtualClockLoop


def test_a_long_sleep_returns_at_once_with_the_clock_moved_on() -> None:
    async def nap() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        before = loop.time()
        await asyncio.sleep(3600)
        return before, loop.time()

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        before, after = runner.run(nap())
    assert after - before == 3600


def test_timers_fire_in_order_of_their_virtual_times() -> None:
    async def race() -> list[str]:
        order: list[str] = []

        async def after(seconds: float, name: str) -> None:
            await asyncio.sleep(seconds)
            order.append(name)

        await asyncio.gather(after(300, "late"), after(5, "early"), after(60, "middle"))
        return order

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        assert runner.run(race()) == ["early", "middle", "late"]
