"""The extractor a run hands its records to, built once from the job: the one retry policy (its waits
and the run's retry counters), the budget growth, grounding, and for a job with ``chunking:`` the
chunk planner over the run's endpoints and the chunks earlier runs kept."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from pipeline.errors import RecordError
from pipeline.extraction.chunk_plan import ChunkPlanner
from pipeline.extraction.context import RunContext
from pipeline.extraction.documents import DocumentExtractor, KeptChunks
from pipeline.extraction.extractor import BudgetGrowth, Extractor
from pipeline.extraction.retry import RetryKind, RetryPolicy
from pipeline.quality.grounding import Grounder
from pipeline.run.options import RunOptions
from pipeline.run.stats import RunStats
from pipeline.servers.router import Router

log = structlog.get_logger("pipeline.run.extractors")


def record_extractor(
    context: RunContext,
    options: RunOptions,
    router: Router,
    stats: RunStats,
    kept: KeptChunks | None,
    answered_before: Sequence[int] = (),
) -> DocumentExtractor:
    """The run's extractor, starting from what earlier runs' answers took (``answered_before``: their
    completion tokens, oldest first). With ``chunking:`` it checks first, against the servers' context,
    that a chunk can fit at all: a :class:`ConfigError` naming the key before any request."""

    def observe(kind: RetryKind, error: RecordError, attempt: int, wait_s: float) -> None:
        stats.retried(str(kind))
        log.debug("retrying", kind=str(kind), attempt=attempt, wait_s=round(wait_s, 2), error=str(error))

    spec, prompts = context.spec, context.prompts
    policy = RetryPolicy(spec.retry, sleep=options.sleep, observer=observe)
    growth = BudgetGrowth(spec.retry.truncation_growth, spec.max_tokens_ceiling)
    grounder = Grounder.for_schema(spec.schema_class)
    schema = spec.schema_class
    extractor = Extractor(router, prompts, schema, policy, growth, stats, grounder, answered_before)
    planner = None
    if spec.chunking is not None:
        where = str(spec.source_file)
        planner = ChunkPlanner(spec.chunking, prompts, spec.max_tokens, router.endpoints, where)
        planner.check()
    return DocumentExtractor(extractor, prompts, spec.schema_class, planner, kept)
