"""What a caller asks of a run (:class:`RunOptions`) and what it gets back (:class:`RunSummary`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from pipeline.errors import EXIT_FAILURES, EXIT_INTERRUPTED, PERMANENT_FAILURE_CLASSES, FailureClass
from pipeline.quality.drift import Drift
from pipeline.run.progress import ProgressReporter
from pipeline.source.pending import Selection
from pipeline.source.versions import StaleCause

if TYPE_CHECKING:
    from pipeline.local import LocalServerOptions


class RunStatus(StrEnum):
    NOTHING_TO_DO = "nothing_to_do"
    COMPLETED = "completed"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    INTERRUPTED = "interrupted"
    STALLED = "stalled"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class RunOptions:
    limit: int | None = None
    retry_failed: bool = False
    # With retry_failed or only_failed: only these classes (transient ones are retried anyway, except
    # by only_failed with classes that leave it out); empty: every class.
    retry_classes: frozenset[FailureClass] = frozenset()
    only_failed: bool = False  # retry failures and take nothing else
    redo_stale: frozenset[StaleCause] = frozenset()  # also redo results stale for these job causes
    sample: int | None = None  # only records of a fixed, seeded sample of the source
    seed: int = 0
    handle_signals: bool = False
    progress: ProgressReporter | None = None
    metrics_port: int | None = None
    metrics_textfile: Path | None = None
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    # With endpoint.base_url: local, how to start the bundled vLLM server (pipeline.local).
    local_server: LocalServerOptions | None = None
    # The command-line options that changed the job (--model M, --prompt-file F...), kept with the run
    # so that a hint can repeat them: a re-run of a variant made with them needs them again.
    variant_options: tuple[str, ...] = ()

    @property
    def retry(self) -> frozenset[FailureClass]:
        """The failure classes this run extracts again."""
        transient = frozenset({FailureClass.TRANSIENT})
        if self.only_failed:
            return self.retry_classes or frozenset(FailureClass)
        if self.retry_failed:
            return transient | (self.retry_classes or PERMANENT_FAILURE_CLASSES)
        return transient

    def capped(self, count: int) -> int:
        """``count`` records, at most ``limit`` of them."""
        return count if self.limit is None else min(count, self.limit)

    @property
    def selection(self) -> Selection:
        return Selection(
            retry=self.retry,
            only_failed=self.only_failed,
            redo=self.redo_stale,
            sample=self.sample,
            seed=self.seed,
            limit=self.limit,
        )


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: int | None
    status: RunStatus
    database: Path
    results_table: str
    failures_table: str
    pending_at_start: int
    done: int = 0
    failed: int = 0
    requests: int = 0
    output_tokens: int = 0
    timeouts: int = 0
    elapsed_s: float = 0.0
    # Results left stale because the job changed since they were made: "total" and per cause (only
    # --redo-stale redoes them).
    stale_kept: Mapping[str, int] = field(default_factory=dict)
    variant: str = "main"
    # What moved in this run beyond its usual run-to-run variation (pipeline.quality.drift).
    drift: tuple[Drift, ...] = ()
    # The source's records, counted when nothing was pending (0: the source is empty, not all done).
    source_records: int | None = None

    @property
    def exit_code(self) -> int:
        return {
            RunStatus.INTERRUPTED: EXIT_INTERRUPTED,
            RunStatus.COMPLETED_WITH_FAILURES: EXIT_FAILURES,
        }.get(self.status, 0)

    @property
    def records_per_s(self) -> float:
        return (self.done + self.failed) / self.elapsed_s if self.elapsed_s > 0 else 0.0
