"""What a run tells whoever started it, besides its progress: a request timeout too short for its
concurrency (before it starts), the records it sets aside unsent because they have nothing to extract
from (as each phase finds them), and the results it keeps stale because the job changed (at its end)."""

from __future__ import annotations

import structlog

from pipeline.extraction.context import RunContext
from pipeline.source.blank import BlankRecords
from pipeline.source.reader import SourceReader

log = structlog.get_logger("pipeline.run.runner")

# Below this a request at high concurrency is killed while the server is still working on it.
SHORT_TIMEOUT_S = 300.0


async def stale_kept(reader: SourceReader, redo: str) -> dict[str, int]:
    """Results left stale because the job changed, by cause: said once, with how to redo them (``redo``:
    the run's own command with ``--redo-stale``). The full count reads every result's version, so it
    runs only when a first stale result exists."""
    counts = await reader.count_stale() if await reader.any_stale() else {}
    if counts:
        log.warning(
            f"results are stale because the job changed: a plain run keeps them, `{redo}` redoes them",
            **counts,
        )
    return counts


def say_blank(blank: BlankRecords) -> None:
    """The records set aside so far, being blank (every prompt field empty): once as the run begins,
    and again if its content phase finds more."""
    if blank:
        log.warning(blank.not_sent(now=True), blank=blank.count)


def warn_if_timeout_is_short(context: RunContext) -> None:
    spec = context.spec
    if spec.request_timeout_s < SHORT_TIMEOUT_S and context.most_in_flight >= 32:
        log.warning(
            "request timeout is short for this concurrency: a busy server finishes requests after minutes",
            request_timeout_s=spec.request_timeout_s,
            concurrency=spec.concurrency,
        )
