"""Progress of a run: a live bar on a terminal, periodic structured log lines otherwise (the JSON
snapshot beside the database that ``pipeline status`` reads is :mod:`pipeline.store.snapshot`).

Both say one line (:func:`progress_text`): first what a person looks for (done, failed, in flight,
records/min, ETA), then the rest, short. A log line carries it as ``said``, which a terminal's log shows
alone (:mod:`pipeline.cli.logs`); the JSON log keeps every field of the record instead, those same
numbers first."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import anyio
import structlog
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from pipeline.run.stats import RunStats
from pipeline.wording import number

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


#: What a person looks for first in a progress line, in this order: the log record's fields start with them.
FIRST = ("done", "failed", "in_flight", "records_per_min", "eta_s")


def progress_text(stats: RunStats) -> str:
    """``done 290 · failed 10 · in flight 256 · 300.0 rec/min · ETA 2:20``, then the rest, each only
    when it says something: the output rate, timeouts, the prefix cache, servers out of the rotation,
    a server failing records."""
    n = stats.now()
    return (
        f"done {number(n.done)} · failed {number(n.failed)} · in flight {number(stats.in_flight)} · "
        f"{n.records_per_min:,.1f} rec/min · ETA {format_duration(n.eta_s)} · "
        f"{n.output_tokens_per_s:,.0f} tok/s"
        + (f" · timeouts {number(n.timeouts)}" if n.timeouts else "")
        + stats.cache_words(n)
        + _servers_words(stats.endpoint_numbers())
        + (f" · {failing}" if (failing := stats.server_failing()) else "")
    )


def _servers_words(endpoints: Mapping[str, Mapping[str, Any]]) -> str:
    """`` · servers up 2 of 3`` with several; with one, only when it is out (gone or stalled)."""
    up = sum(1 for numbers in endpoints.values() if numbers.get("up"))
    if len(endpoints) > 1:
        return f" · servers up {up} of {len(endpoints)}"
    return " · server held (gone or stalled)" if endpoints and not up else ""


class _StatsColumn(ProgressColumn):
    def __init__(self, stats: RunStats) -> None:
        super().__init__()
        self._stats = stats

    def render(self, task: Task) -> Text:
        return Text(progress_text(self._stats))


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
    """One ``progress`` log line every ``interval_s`` (cron, systemd, CI: no terminal): the record of
    :meth:`RunStats.snapshot`, :data:`FIRST` first, and the line a person reads as ``said``."""

    def __init__(
        self, interval_s: float = 30.0, sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    ) -> None:
        self._interval_s = interval_s
        self._sleep = sleep

    async def run(self, stats: RunStats) -> None:
        while True:
            await self._sleep(self._interval_s)
            _log_progress(stats)

    def close(self, stats: RunStats) -> None:
        _log_progress(stats)


def _log_progress(stats: RunStats) -> None:
    snapshot = stats.snapshot()
    first = {name: snapshot[name] for name in FIRST}
    log.info("progress", said=progress_text(stats), **(first | snapshot))
