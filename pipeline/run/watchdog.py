"""The stall watchdog: requests are in flight, yet the server has finished none of them for a while.

Our user's old runner sat like that for days and nobody noticed. At high concurrency a healthy
server finishes a request every second or so, so minutes without an answer mean a hung server, a
dead network path or a wedged client. The watchdog warns (and keeps warning) with the in-flight
count and the oldest request's age; with ``stall_abort_s`` it ends the run with
:class:`StalledRunError` (its own exit code), so cron sees it and the next run resumes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import structlog

from pipeline.errors import StalledRunError
from pipeline.run.stats import RunStats
from pipeline.wording import counted

log = structlog.get_logger("pipeline.run.watchdog")

MAX_CHECK_INTERVAL_S = 30.0


class StallWatchdog:
    def __init__(
        self,
        stats: RunStats,
        *,
        warn_after_s: float,
        abort_after_s: float | None,
        on_abort: Callable[[StalledRunError], None],
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self._stats = stats
        self._warn_after_s = warn_after_s
        self._abort_after_s = abort_after_s
        self._on_abort = on_abort
        self._sleep = sleep
        self._last_warning_at: float | None = None
        self.warnings = 0

    @property
    def interval_s(self) -> float:
        return min(MAX_CHECK_INTERVAL_S, self._warn_after_s / 4)

    async def run(self) -> None:
        while True:
            await self._sleep(self.interval_s)
            if self.check():
                return

    def check(self) -> bool:
        """Warn or abort if the run is stalled now; true once it has aborted."""
        stats = self._stats
        now = stats.clock()
        quiet_s = stats.since_last_answer_s(now)
        if stats.in_flight == 0 or quiet_s < self._warn_after_s:
            self._last_warning_at = None  # a new stall warns again at once
            return False
        oldest = stats.oldest_in_flight_s(now)
        details = {
            "in_flight": stats.in_flight,
            "no_answer_for_s": round(quiet_s),
            "oldest_request_age_s": round(oldest) if oldest is not None else None,
        }
        if self._abort_after_s is not None and quiet_s >= self._abort_after_s:
            log.error("stalled: aborting the run, finished records are saved", **details)
            self._on_abort(
                StalledRunError(
                    f"stalled: {counted(stats.in_flight, 'request')} in flight and no answer for "
                    f"{quiet_s:.0f} s (operations.stall_abort_s = {self._abort_after_s:g}); run again to "
                    "resume"
                )
            )
            return True
        if self._last_warning_at is None or now - self._last_warning_at >= self._warn_after_s:
            self._last_warning_at = now
            self.warnings += 1
            log.warning("stalled: requests in flight but none answered", **details)
        return False
