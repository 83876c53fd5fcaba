"""The run: the composition root that puts the stages together.

Owns ``run_job`` (producer → bounded stream → workers → one writer) and ``run_job_sync`` (the same
from code that is not async, a notebook's included), what a run is asked and returns,
opening the run's servers (the fleet, with the local server as one endpoint factory), committing
outcomes, and operating an unattended run: signals and shutdown, the stall watchdog, the answer
breaker (a server whose answers stopped validating stops the run), live counters, progress and
Prometheus metrics.

May import every stage below it: :mod:`pipeline.store`, :mod:`pipeline.extraction`,
:mod:`pipeline.source`, :mod:`pipeline.job`, :mod:`pipeline.servers`, :mod:`pipeline.quality`,
:mod:`pipeline.local` (started only when a job asks for it), :mod:`pipeline.errors`.
"""

from pipeline.run.blocking import run_job_sync
from pipeline.run.options import RunOptions, RunStatus, RunSummary
from pipeline.run.runner import count_pending, run_job, run_job_locally

__all__ = [
    "RunOptions",
    "RunStatus",
    "RunSummary",
    "count_pending",
    "run_job",
    "run_job_locally",
    "run_job_sync",
]
