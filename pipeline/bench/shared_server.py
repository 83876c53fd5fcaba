"""Several jobs on one server in the closed loop (:mod:`pipeline.bench.closed_loop`), each with its own
client and scrapes, as separate `pipeline run` processes of separate databases would be. On one machine
they take their requests from one pool of slots (:mod:`pipeline.servers.slot_pool`: one limit, one
search, as `pipeline run` processes on one machine do through :mod:`pipeline.servers.lease`); on
several machines each has its own controller and they share nothing but the server. A job may start
later than the others (``Job.start_s``), to see one that joins a busy server get its part, and one left
alone take the server back."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.bench.closed_loop import LoadRun, Scenario, ServerModel, prepare, server_model, stop
from pipeline.bench.virtual_clock import VirtualClockLoop
from pipeline.servers.limits import LimitChange
from pipeline.servers.slot_pool import Member, SlotPool


@dataclass(frozen=True, slots=True)
class Job:
    """One job of several: its records, its fixed concurrency (None: ``auto``) and when it starts."""

    records: int
    fixed: int | None = None
    start_s: float = 0.0  # the profile's seconds after the first job's start


@dataclass(frozen=True, slots=True)
class JobResult:
    """One job of several on one server, in the profile's seconds from the first job's start."""

    concurrency: str  # "auto" or the fixed level
    records: int
    answered: int
    started_s: float
    ended_s: float  # its last reply, or the scenario's end
    sent_all_s: float  # when it sent its last record (its requests drain from then), or its end
    finished: bool  # False: still going at the scenario's duration
    timeouts: int
    replied: tuple[float, ...]  # when each reply came, in order
    trace: tuple[tuple[float, int], ...]  # (time, limit): its start and every change
    changes: tuple[tuple[float, LimitChange], ...]

    @property
    def duration_s(self) -> float:
        return self.ended_s - self.started_s

    @property
    def records_per_s(self) -> float:
        return self.answered / self.duration_s

    @property
    def peak_limit(self) -> int:
        return max(limit for _, limit in self.trace)

    def answered_between(self, start_s: float, end_s: float) -> int:
        return bisect.bisect_right(self.replied, end_s) - bisect.bisect_right(self.replied, start_s)

    def limit_at(self, moment_s: float) -> int:
        index = bisect.bisect_right([at for at, _ in self.trace], moment_s) - 1
        return self.trace[max(index, 0)][1]

    def reached(self, level: int, after_s: float) -> float | None:
        """The first moment from ``after_s`` on when its limit was at least ``level`` (None: never)."""
        if self.limit_at(after_s) >= level:
            return after_s
        return next((at for at, limit in self.trace if at > after_s and limit >= level), None)


def run_jobs(scenario: Scenario, jobs: list[Job], *, one_machine: bool = True) -> list[JobResult]:
    """The jobs on one server of ``scenario``, each until all its records are answered (a timed-out
    request is sent again) or the scenario's duration is up; on the virtual clock. ``one_machine``: the
    `auto` jobs take their requests from one pool, as `pipeline run` processes on one machine do
    (:mod:`~pipeline.servers.slot_pool`); else each has its own limit and sees the others only in the
    server's counts, as jobs on different machines."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        loop = runner.get_loop()
        return runner.run(_drive_jobs(scenario, jobs, loop.time, one_machine))


async def _drive_jobs(
    scenario: Scenario, jobs: list[Job], clock: Callable[[], float], one_machine: bool
) -> list[JobResult]:
    server = server_model(scenario, clock)
    started = server.now()
    end_s = started + scenario.duration_s
    pools: list[SlotPool] | None = [] if one_machine else None
    return list(
        await asyncio.gather(
            *(
                _job(scenario, job, (index, pools), server, clock, started, end_s)
                for index, job in enumerate(jobs)
            )
        )
    )


def _joined(run: LoadRun, index: int, pools: list[SlotPool], clock: Callable[[], float]) -> None:
    """The job takes its requests from the machine's pool: the first job's controller becomes the pool's
    (started as its run would start alone), and every job is a member of it."""
    if run.controller is None or isinstance(run.controller, Member):
        return
    if not pools:
        pools.append(SlotPool(run.controller, clock, run.scenario.scrape_every_s))
    run.controller = Member(str(index), pools[0])
    run.controller.update(in_flight=0, waiting=run.left or 0)


async def _job(
    scenario: Scenario,
    job: Job,
    place: tuple[int, list[SlotPool] | None],
    server: ServerModel,
    clock: Callable[[], float],
    origin: float,
    end_s: float,
) -> JobResult:
    """One job's client from its start: the limit's worth of its records in flight until all are answered."""
    index, pools = place
    await asyncio.sleep(job.start_s / server.speed)
    run = prepare(scenario, job.fixed, server, clock, seed=index)
    run.left = job.records
    if pools is not None:
        _joined(run, index, pools, clock)
    started = server.now()
    ended = await _send_all(run, end_s)
    if isinstance(run.controller, Member):
        run.controller.leave()
    return JobResult(
        "auto" if job.fixed is None else str(job.fixed),
        job.records,
        len(run.replies),
        started - origin,
        ended - origin,
        (run.sent_all_at or ended) - origin,
        run.left == 0 and run.in_flight == 0,
        run.timeouts,
        tuple(at - origin for at, _ in run.replies),
        tuple((at - origin, limit) for at, limit in run.trace),
        tuple((at - origin, change) for at, change in run.changes),
    )


async def _send_all(run: LoadRun, end_s: float) -> float:
    """Keep the limit's worth of the job's records in flight until all are answered; when it ended."""
    run.trace.append((run.engine.now(), run.limit))
    helpers = [asyncio.create_task(run.scrape())]
    if run.controller is not None:
        helpers.append(asyncio.create_task(run.adapt(run.controller)))
    requests: set[asyncio.Task[None]] = set()
    delay = (end_s - run.engine.now()) / run.engine.speed
    end = asyncio.get_running_loop().call_later(delay, run.wake.set)
    while (run.left or run.in_flight) and run.engine.now() < end_s - 1e-9:
        run.top_up(requests)
        run.wake.clear()
        await run.wake.wait()
    finished = run.engine.now()
    end.cancel()
    await stop([*helpers, *requests])
    return finished
