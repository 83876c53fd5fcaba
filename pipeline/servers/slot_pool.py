"""One limit per server on a machine: the jobs on one machine that send to one server take their requests
from one pool of slots (:class:`SlotPool`), so that together they are one client to the server, as one
job alone is.

The pool owns the one `concurrency: auto` search (:class:`~pipeline.servers.limits.AdaptiveLimit`, the
same as one job's): every job's replies and timeouts feed it, and so do the server's ``/metrics``
scrapes (one per scrape interval, whichever job read it); its limit is what the jobs hold together,
judged by the server's throughput at that level, exactly as one job alone. The pool splits the limit
into each job's part: equal parts among the jobs with requests waiting for a slot (max-min fair: a job
that needs fewer keeps what it needs and leaves the rest to the others; the odd slot goes round in
turn). A job whose part grew gets only the slots the others have released (:meth:`SlotPool.report`), so
together they never hold more than the limit; a job whose part shrank sends nothing until its requests
in flight are under it. A job that starts or stops changes who holds the slots, not the level.

Pure logic: each job reports at every tick of its router (:class:`Report`: its requests in flight and
waiting, the replies since its last report, a scrape) and gets its allowance back (:class:`Grant`).
:class:`Member` is a job's place in a pool, seen by its endpoint as a controller is; how jobs in
separate processes reach one pool is :mod:`~pipeline.servers.lease`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline.servers.client_load import ClientLoad
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.limits import AdaptiveLimit, LimitChange
from pipeline.servers.window import ServerLoad

#: A reply as a job reports it: its latency, output and prompt tokens, and whether it delivered (an
#: error status delivers nothing); a latency of None is a timeout.
Replied = tuple[float | None, int, int, bool]
#: The pool's changes each job keeps to read; older ones are gone (a job reports four times a second).
CHANGES_KEPT = 64
#: A job's room grows at most this many times its requests in flight at once, and from nothing to this.
GROWTH = 2
FIRST_ROOM = 8
#: The odd slots of a limit the jobs do not divide evenly go round in turn, moving every this many scrape
#: intervals: each move makes one job drain a request and another take it.
TURN_SCRAPES = 10


@dataclass(slots=True)
class Report:
    """What a job tells the pool at a tick."""

    in_flight: int
    waiting: int  # its requests waiting for a slot: what it would send beyond its allowance
    replies: list[Replied] = field(default_factory=list)  # since its last report
    load: ServerLoad | None = None  # its latest scrape of the server, if new
    client: ClientLoad | None = None  # its own load over the last interval, if read


@dataclass(frozen=True, slots=True)
class Grant:
    """What the pool answers: the job's allowance (its requests in flight may reach it), the pool's limit
    and jobs, the limit's changes since the job's last report, and what the search learned."""

    allowance: int
    limit: int
    jobs: int
    changes: tuple[LimitChange, ...] = ()
    learned: KneeMemory | None = None
    client_bound: ClientLoad | None = None
    at_knee: bool = False


def fair_parts(total: int, demands: Sequence[int], first: int = 0) -> list[int]:
    """``total`` split max-min fair among ``demands``: none gets more than it asks, the rest in equal
    parts, the odd ones in turn from ``first``."""
    parts = [0] * len(demands)
    left, open_ = total, [i for i, demand in enumerate(demands) if demand > 0]
    while left > 0 and open_:
        each = left // len(open_)
        if each == 0:
            for i in sorted(open_, key=lambda i: (i - first) % len(demands))[:left]:
                parts[i] += 1
            break
        for i in open_:
            take = min(each, demands[i] - parts[i])
            parts[i], left = parts[i] + take, left - take
        open_ = [i for i in open_ if parts[i] < demands[i]]
    return parts


@dataclass(slots=True)
class _Seat:
    in_flight: int = 0
    waiting: int = 0
    allowance: int = 0
    told: int = 0  # the allowance it heard at its last report: it may hold that many until the next
    seen: int = 0  # the pool's changes this job has read


class SlotPool:
    """The jobs of one machine on one server and their one limit; the module docstring says how."""

    def __init__(self, controller: AdaptiveLimit, clock: Callable[[], float], scrape_every_s: float) -> None:
        self.controller = controller
        self._clock = clock
        self._scrape_every_s = scrape_every_s
        self._scraped_at = -float("inf")
        self._seats: dict[str, _Seat] = {}
        self._changes: list[LimitChange] = []
        self._changed = 0  # every change so far, the kept ones the last
        self._turn, self._turned_at = 0, clock()  # whose the odd slots are, since when

    @property
    def jobs(self) -> int:
        return len(self._seats)

    def join(self, job: str) -> None:
        """A job comes to the server: it holds nothing yet; its part comes from what the others release."""
        self._seats.setdefault(job, _Seat(seen=self._changed))

    def leave(self, job: str) -> None:
        """A job is done with the server (or gone): its slots go to the others."""
        self._seats.pop(job, None)
        self._share_out()

    def report(self, job: str, report: Report) -> Grant:
        """A job's tick: what it reports feeds the search, the search decides, and the limit is shared out
        again; the job's allowance and what it has not read of the pool's changes."""
        self.join(job)
        controller, now = self.controller, self._clock()
        for latency_s, output_tokens, prompt_tokens, ok in report.replies:
            if latency_s is None:
                controller.on_timeout()
            else:
                controller.on_finished(
                    latency_s=latency_s, output_tokens=output_tokens, prompt_tokens=prompt_tokens, ok=ok
                )
        if report.load is not None and now - self._scraped_at >= 0.75 * self._scrape_every_s:
            self._scraped_at = now  # each job scrapes the same server: one reading an interval
            controller.on_server_load(report.load)
        if report.client is not None:
            controller.on_client_load(report.client)
        seat = self._seats[job]
        seat.in_flight, seat.waiting = report.in_flight, report.waiting
        total = sum(other.in_flight for other in self._seats.values())
        change = controller.update(in_flight=total)
        if change is not None:
            self._changes = [*self._changes[1 - CHANGES_KEPT :], change]
            self._changed += 1
        self._share_out()
        unread = self._changes[len(self._changes) - min(len(self._changes), self._changed - seat.seen) :]
        seat.seen, seat.told = self._changed, seat.allowance
        return Grant(
            seat.allowance,
            controller.limit,
            len(self._seats),
            tuple(unread),
            controller.learned,
            controller.client_bound,
            controller.at_knee,
        )

    def _share_out(self) -> None:
        """Each job's allowance: its fair part of the limit, reached only through slots nobody holds."""
        seats = list(self._seats.values())
        if not seats:
            return
        limit, now = self.controller.limit, self._clock()
        demands = [seat.in_flight + seat.waiting for seat in seats]
        if now - self._turned_at >= TURN_SCRAPES * self._scrape_every_s:  # the odd slots move on, now
            self._turn, self._turned_at = self._turn + 1, now  # and then: each move drains one
        self._turn %= len(seats)
        parts = fair_parts(limit, demands, self._turn)
        # What each holds, or was told it may hold (it may have sent that many since it said): room told
        # is room taken until the job says otherwise
        held = [
            max(s.in_flight, min(max(s.allowance, s.told), d)) for s, d in zip(seats, demands, strict=True)
        ]
        free = max(0, limit - sum(held))
        for seat, part in zip(seats, parts, strict=True):
            seat.allowance = (
                part if part <= seat.in_flight else max(seat.in_flight, min(seat.allowance, part))
            )
        # A job's room grows at most twice over a tick (from FIRST_ROOM): jobs that come together take
        # the limit together, not the first one all of it (a server queues its burst first to last)
        short = [
            max(0, min(part, GROWTH * seat.in_flight + FIRST_ROOM) - seat.allowance)
            for seat, part in zip(seats, parts, strict=True)
        ]
        for seat, more in zip(seats, fair_parts(free, short, self._turn), strict=True):
            seat.allowance += more


class Member:
    """A job's place in a pool as its endpoint sees a controller: it takes the replies, timeouts and
    scrapes, and its limit is its allowance. ``pool`` in this process reports at once at each
    :meth:`update`; without it, :meth:`take_report` and :meth:`granted` carry them (a pool elsewhere,
    :mod:`~pipeline.servers.lease`)."""

    def __init__(self, job: str, pool: SlotPool | None = None, allowance: int = 0) -> None:
        self.job, self.pool = job, pool
        self._grant = Grant(allowance, allowance, 1)
        self._replies: list[Replied] = []
        self._load: ServerLoad | None = None
        self._client: ClientLoad | None = None
        self._state = (0, 0)  # in flight, waiting: at the last update
        self._changes: list[LimitChange] = []
        if pool is not None:
            pool.join(job)

    @property
    def limit(self) -> int:
        return self._grant.allowance

    @property
    def pool_limit(self) -> int:
        return self._grant.limit

    @property
    def jobs(self) -> int:
        return self._grant.jobs

    @property
    def learned(self) -> KneeMemory | None:
        return self._grant.learned

    @property
    def client_bound(self) -> ClientLoad | None:
        return self._grant.client_bound

    @property
    def at_knee(self) -> bool:
        return self._grant.at_knee

    @property
    def last_grant(self) -> Grant:
        return self._grant

    @property
    def reported(self) -> tuple[int, int]:
        """This job's requests in flight and waiting at its last tick."""
        return self._state

    def on_finished(self, *, latency_s: float, output_tokens: int, prompt_tokens: int, ok: bool) -> None:
        self._replies.append((latency_s, output_tokens, prompt_tokens, ok))

    def on_timeout(self) -> None:
        self._replies.append((None, 0, 0, False))

    def on_server_load(self, load: ServerLoad) -> None:
        self._load = load

    def on_client_load(self, load: ClientLoad) -> None:
        self._client = load

    def update(self, *, in_flight: int | None = None, waiting: int = 0) -> LimitChange | None:
        """This job's tick: its allowance moves (:attr:`limit`); the pool's limit's last change since the
        job's last tick, if any (the others' reasons are logged by each job alike)."""
        self._state = (self.limit if in_flight is None else in_flight, waiting)
        if self.pool is not None:
            self.granted(self.pool.report(self.job, self.take_report()))
        changes, self._changes = self._changes, []
        if not changes:
            return None
        return LimitChange(changes[0].old, changes[-1].new, "; ".join(change.reason for change in changes))

    def take_report(self) -> Report:
        """What the job has to tell the pool since its last report."""
        report = Report(*self._state, self._replies, self._load, self._client)
        self._replies, self._load, self._client = [], None, None
        return report

    def granted(self, grant: Grant) -> None:
        self._grant = grant
        self._changes.extend(grant.changes)

    def leave(self) -> None:
        if self.pool is not None:
            self.pool.leave(self.job)
