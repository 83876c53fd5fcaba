"""``run_job_sync``: a run from code that is not async, in a plain script or in a notebook.

``anyio.run`` starts an event loop, and a thread can run only one: inside Jupyter, whose kernel runs
cells in its own running loop, it raises ``RuntimeError``. There the caller can ``await run_job(...)``
directly; :func:`run_job_sync` works in both places, so one line of code does.
"""

from __future__ import annotations

import asyncio
import functools

import anyio
import anyio.from_thread

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.run.options import RunOptions, RunSummary
from pipeline.run.runner import runner_for


def run_job_sync(spec: JobSpec, options: RunOptions | None = None, *, local: bool = False) -> RunSummary:
    """Run ``spec`` to its end and return its summary, blocking; raises what :func:`run_job` raises.
    ``local`` (or ``endpoint.base_url: local`` in the job): on the bundled vLLM server, as
    :func:`run_job_locally` (and ``pipeline run --local``).

    Without an event loop running in this thread it is ``anyio.run``. Inside one (a notebook cell), the
    run gets an event loop of its own in a worker thread while this one waits; interrupting the wait
    (the notebook's stop button) cancels the run, which keeps everything it committed, as Ctrl-C
    does to ``pipeline run``."""
    call = functools.partial(runner_for(spec, local=local), spec, options)
    if not _loop_running():
        return anyio.run(call)
    if options is not None and options.handle_signals:
        # Signal handlers belong to the main thread's loop, which is the notebook's, not the run's.
        raise ConfigError(
            "RunOptions(handle_signals=True) needs an event loop of the run's own in the main thread; "
            "inside a running one (a notebook) leave it off: interrupting the call stops the run"
        )
    with anyio.from_thread.start_blocking_portal() as portal:
        return portal.call(call)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
