"""The job: what to extract and how, as one validated spec.

Owns the job file (``jobs/*.yaml``: loading, ``${VAR}`` interpolation, validation, the schema class),
its variants and few-shot examples, the wording of configuration errors about it, and the commands a
hint prints about it (:mod:`~pipeline.job.commands`). Everything here is pure: no database, no network.

May import: :mod:`pipeline.servers` (the endpoint settings a job declares), :mod:`pipeline.quality`
(the schema's field paths, which the merge rules of ``chunking:`` are checked against; pure),
:mod:`pipeline.errors`.
"""

from pipeline.job.spec import MAIN_VARIANT, JobSpec, load_job

__all__ = ["MAIN_VARIANT", "JobSpec", "load_job"]
