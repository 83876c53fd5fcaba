"""Progress of a run: a live bar on a terminal, periodic structured log lines otherwise (the JSON
snapshot beside the database that ``pipeline status`` reads is :mod:`pipeline.store.snapshot`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import structlog
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from pipeline.run.stats import RunStats

log = structlog.get_logger("pipeline.run.progress")


class ProgressReporter(Protocol):
    async def run(self, stats: RunStats) -> None:
        """Report until cancelled."""

    def close(self, stats: RunStats) -> None:
        """Report the final state once."""


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class _StatsColumn(ProgressColumn):
    def __init__(self, stats: RunStats) -> None:
        super().__init__()
        self._stats = stats

    def render(self, task: Task) -> Text:
        s = self._stats
        n = s.now()
        return Text(
            f"done {n.done:,} · failed {n.failed:,} · in flight {s.in_flight} · "
            f"{n.records_per_min:,.1f} rec/min · {n.output_tokens_per_s:,.0f} tok/s · "
            f"ETA {format_duration(n.eta_s)}"
            + (f" · timeouts {n.timeouts}" if n.timeouts else "")
            + s.cache_words(n)
            + (f" · {failing}" if (failing := s.server_failing()) else "")
        )


class LiveProgress:
    """A rich progress bar, redrawn a few times a second."""

    def __init__(self, console: Console | None = None, refresh_s: float = 0.5) -> None:
        self._console = console or Console(stderr=True)
        self._refresh_s = refresh_s
        self._progress: Progress | None = None

    def _bar(self, stats: RunStats) -> Progress:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]extracting"),
                BarColumn(bar_width=24),
                _StatsColumn(stats),
                console=self._console,
                auto_refresh=False,
                transient=False,
            )
            self._task = self._progress.add_task("extract", total=max(1, stats.numbers.pending_at_start))
            self._progress.start()
        return self._progress

    async def run(self, stats: RunStats) -> None:
        while True:
            self._draw(stats)
            await anyio.sleep(self._refresh_s)

    def _draw(self, stats: RunStats) -> None:
        bar = self._bar(stats)
        bar.update(self._task, completed=stats.numbers.finished)
        bar.refresh()

    def close(self, stats: RunStats) -> None:
        self._draw(stats)
        if self._progress is not None:
            self._progress.stop()


class LogProgress:
    """One ``progress`` log line every ``interval_s`` (cron, systemd, CI: no terminal)."""

    def __init__(
        self, interval_s: float = 30.0, sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    ) -> None:
        self._interval_s = interval_s
        self._sleep = sleep

    async def run(self, stats: RunStats) -> None:
        while True:
            await self._sleep(self._interval_s)
            log.info("progress", **stats.snapshot())

    def close(self, stats: RunStats) -> None:
        log.info("progress", **stats.snapshot())
