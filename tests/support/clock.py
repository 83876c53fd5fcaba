"""A clock the test moves by hand (``clock.now += 5``): pure logic takes its clock as a callable; and a
sleep that keeps the waits it was asked for and returns at once (what takes a ``sleep`` is given it)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeSleep:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
