"""In-process runs in tests: against a fake served on 127.0.0.1, no progress output, no real sleeping."""

from __future__ import annotations

from typing import Any

import anyio

from pipeline.job.spec import JobSpec
from pipeline.run.options import RunOptions, RunSummary
from pipeline.run.runner import run_job
from pipeline.run.stats import RunStats
from tests.support.fakes import Handler, LoopbackServer, serving


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


def options(**kwargs: Any) -> RunOptions:
    """Quiet, and no real sleeping between retries, unless ``kwargs`` say otherwise."""
    return RunOptions(**{"progress": QuietProgress(), "sleep": no_sleep, **kwargs})


def served(spec: JobSpec, server: LoopbackServer) -> JobSpec:
    """``spec`` sending to ``server`` (its one endpoint)."""
    return spec.with_overrides(base_url=server.url)


async def run_served(spec: JobSpec, handler: Handler, **kwargs: Any) -> RunSummary:
    """Run ``spec`` against ``handler`` served on 127.0.0.1, with :func:`options` (``kwargs`` added)."""
    async with serving(handler) as server:
        return await run_job(served(spec, server), options(**kwargs))
