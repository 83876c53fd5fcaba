"""In-process runs in tests: against a fake served on 127.0.0.1, no progress output, no real sleeping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from pipeline.extraction.outcomes import Stored
from pipeline.job.spec import JobSpec
from pipeline.run.options import RunOptions, RunSummary
from pipeline.run.runner import run_job
from pipeline.run.stats import RunStats
from pipeline.store.numbers import RunNumbers
from pipeline.store.writer import RunStart, StoreWriter
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


class WriterRun:
    """A store writer's run with no run around it (no request sent): it begins, commits batches of
    outcomes with its numbers counting them (:meth:`RunNumbers.plus`, as the committer does) and
    finishes, as a run does."""

    def __init__(self, writer: StoreWriter, pending: int = 10) -> None:
        self.writer = writer
        self.numbers = RunNumbers(pending_at_start=pending, backlog_at_start=pending)

    async def begin(self, base_url: str = "http://testserver/v1", concurrency: int = 8) -> int:
        start = RunStart("hash", self.writer.spec.model, base_url, concurrency, self.numbers)
        return await self.writer.begin_run(start)

    async def write(self, outcomes: Sequence[Stored]) -> None:
        numbers = self.numbers.plus(outcomes)
        await self.writer.write(outcomes, numbers)
        self.numbers = numbers  # only once committed, as the run counts them

    async def finish(self, status: str, **kwargs: Any) -> None:
        await self.writer.finish_run(status, self.numbers, **kwargs)
