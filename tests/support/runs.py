"""Run options for in-process runs in tests: no progress output, no real sleeping."""

from __future__ import annotations

from typing import Any

import anyio
import httpx2

from pipeline.run.options import RunOptions
from pipeline.run.stats import RunStats


class QuietProgress:
    """Reports nothing; keeps the final numbers the run closed with."""

    def __init__(self) -> None:
        self.closed_with: dict[str, Any] | None = None

    async def run(self, stats: RunStats) -> None:
        await anyio.sleep_forever()

    def close(self, stats: RunStats) -> None:
        self.closed_with = stats.snapshot()


async def no_sleep(_: float) -> None:
    return None


def options(transport: httpx2.AsyncBaseTransport, **kwargs: Any) -> RunOptions:
    return RunOptions(transport=transport, progress=QuietProgress(), sleep=no_sleep, **kwargs)
