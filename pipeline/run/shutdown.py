"""How a run stops early: on SIGINT/SIGTERM, or when something else (the stall watchdog) ends it.

First signal: take no new records, give the requests in flight ``grace_s`` to finish, then cancel
the rest. Second signal: cancel at once. Either way the store writer, which runs outside these
scopes, commits every outcome that finished, so an interrupted run is resumed exactly where it
stopped.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import anyio
import structlog

log = structlog.get_logger("pipeline.run.shutdown")


class Shutdown:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.intake = anyio.CancelScope()  # the producer: cancelled first
        self.work = anyio.CancelScope()  # the producer and the workers
        self.interrupted = False

    @property
    def stopping(self) -> bool:
        """Workers take no new record once this is true."""
        return self.interrupted or self.work.cancel_called

    def stop_now(self) -> None:
        self.intake.cancel()
        self.work.cancel()

    def begin_graceful_stop(self, reason: str, in_flight: int) -> None:
        self.interrupted = True
        self.intake.cancel()
        log.warning(
            "stopping: no new records; requests in flight may finish, then finished records are saved",
            reason=reason,
            in_flight=in_flight,
            grace_s=self.grace_s,
        )

    async def watch_signals(self, in_flight: Callable[[], int]) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                self.begin_graceful_stop(signal.Signals(signum).name, in_flight())
                break
            with anyio.move_on_after(self.grace_s) as grace:
                async for signum in signals:
                    log.warning(
                        "second signal: cancelling requests in flight now; finished records are saved",
                        signal=signal.Signals(signum).name,
                    )
                    break
            if grace.cancelled_caught:
                log.warning("grace period over: cancelling requests still in flight", grace_s=self.grace_s)
        self.work.cancel()
