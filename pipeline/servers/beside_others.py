"""What `concurrency: auto`'s limit (:class:`~pipeline.servers.limits.AdaptiveLimit`) does when other jobs'
requests run on its server (:mod:`~pipeline.servers.sharing` says the rules): its share is a ceiling the
limit drops to, a limit its share held follows the others up, and once they are gone the limit goes back
to the level for this job alone. Of the jobs on one machine, those that came to the server after another
hold what it holds (:func:`follow`). A part of the controller, kept apart: it reads and moves the
controller's own state (:class:`Limit` names what it touches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipeline.servers.knee_search import KneeSearch
from pipeline.servers.peers import Peer
from pipeline.servers.sharing import SHARE_MOVES, ServerShare, followed_up


@dataclass(frozen=True, slots=True)
class LimitChange:
    old: int
    new: int
    reason: str  # plain words, for the log


class Limit(Protocol):
    """What of the controller the part beside others reads and moves."""

    minimum: int
    maximum: int
    _limit: int
    _knee: KneeSearch
    _following: bool  # another job on this machine searches, and this one holds what it holds
    _lead_seen: int | None  # what that job held when this one came (-1: it moved since; None: not seen)
    _jobs_here: int  # the jobs on this machine using the server, this one too, at the last count
    _server: ServerShare
    _shared: int | None  # the share the limit was last set to
    _alone: int | None  # the best level measured before a share cut it: to go back to
    _server_best: tuple[float, int] | None  # the server's best throughput beside others, and its level
    _measured: bool
    _at_knee: bool
    _opening: bool
    _ceiling: int | None

    def _set(self, now: float, new: int, reason: str) -> LimitChange | None: ...
    def _cap(self) -> int: ...


def share_cut(limit: Limit, now: float, in_flight: int) -> LimitChange | None:
    """Other jobs' requests on the server: this job's share (:func:`~pipeline.servers.sharing.
    server_share`) is a ceiling the limit drops to at once when it is well above (a scrape's counts
    move by a few); a limit its share held follows the others up as far as each holds; when they are
    gone, the limit goes back to the level this job measured alone, else to the server's capacity."""
    server = limit._server
    settled = server.counted(in_flight)
    if server.released:
        return alone_again(limit, now)
    if settled is None:
        return None
    share, others = settled
    slack = max(2, SHARE_MOVES * limit._limit)  # the others' count moves with every reply and scrape
    level, action = share, "down to"
    if limit._limit > share + slack:
        if limit._shared is None:  # the first cut: the level this job measured alone, if it did
            limit._alone = limit._knee.best if limit._measured else None
    elif (
        limit._shared is not None
        and limit._limit >= limit._knee.best >= limit._shared
        and share > limit._limit + slack
    ):
        # The others gave way or grew: a job its share held follows. One whose search went below
        # its share stays: the server did better with fewer there.
        level, action = followed_up(share, others), "up to"
        if level <= limit._limit + slack:
            return None
        action = action if level == share else "up to what each other job holds,"
    else:
        return None
    limit._shared = level
    limit._knee.restart_at(min(limit._knee.best, level) if action == "down to" else level)
    limit._knee.heading_up = action != "down to"  # followed the others up: more paid for them
    limit._at_knee = limit._opening = False
    reason = f"{others.words} on a server {server.holds_words}: this job's share is {share}"
    return limit._set(now, level, f"{reason}: {action} {level}")


def level_alone(limit: Limit) -> int | None:
    """Beside others, the level for this job alone: the one it measured before they came, else the
    server's best level found with them (theirs and this job's); None when neither was measured."""
    return limit._alone or (limit._server_best[1] if limit._server_best is not None else None)


def alone_again(limit: Limit, now: float) -> LimitChange | None:
    """The other jobs' requests are gone: back to the level for this job alone (:func:`level_alone`,
    else what the server holds), searched from there."""
    server = limit._server
    server.released = False
    limit._ceiling = None  # the others' requests were behind a server signal then
    level = min(level_alone(limit) or server.capacity or limit._limit, limit._cap())
    limit._alone = limit._shared = limit._server_best = None
    limit._knee.restart_at(level)
    limit._at_knee = False
    return limit._set(now, level, f"no other job's requests on the server any more: back to {level}")


def follow(limit: Limit, now: float, lead: Peer, in_flight: int) -> LimitChange | None:
    """Another job on this machine came to the server first: this one holds what it holds, and its
    search finds the level for all (one search, where each job's own would read the others' probes
    as the server's answer to its own, and their small steps would each move the server too little to
    measure). A level it set before this job came was for fewer jobs: this one rises to it only once
    it moved (:func:`regroup`). The share's counts stay current, for when that job is gone."""
    limit._server.counted(in_flight)
    limit._jobs_here = 1 + len(limit._server.peers)
    said = lead.limit if lead.limit is not None else lead.in_flight
    if said >= limit.minimum:  # what they hold together: the server's level this job knows, for a night
        limit._server_best = (0.0, said * limit._jobs_here)
    limit._following = True
    limit._lead_seen = said if limit._lead_seen is None else limit._lead_seen
    level = min(said, limit.maximum)
    if level < limit.minimum or level == limit._limit:  # nothing said yet: it is about to start
        return None
    if level > limit._limit and said == limit._lead_seen:
        return None
    limit._lead_seen = -1  # it moved: followed from now on, up and down
    reason = f"the job on this machine that came to the server first holds {level}: so does this one"
    return limit._set(now, level, reason)


def regroup(limit: Limit, now: float) -> LimitChange | None:
    """The jobs on this machine that hold what this one's search finds came or went (or the job this
    one followed is gone, and it searches now): what they hold together stays, each holding its part,
    and the search starts again there. None when they are as many as before."""
    jobs = 1 + len(limit._server.peers)
    before, limit._jobs_here = limit._jobs_here, jobs
    was_following, limit._following, limit._lead_seen = limit._following, False, None
    if jobs == before and not was_following:
        return None
    # From the best level measured (a probe unmeasured yet is no level for them all), else the limit
    measured = limit._knee.best_tp is not None and not was_following
    held = limit._knee.best if measured else limit._limit
    level = max(limit.minimum, min(limit.maximum, round(held * before / jobs)))
    limit._at_knee = limit._opening = False
    limit._knee.restart_at(level)
    if was_following:  # the level they found is past the fit it began with (not counted again now),
        limit._knee.at_fit_start = False  # and what this job knows of the server, for a night alone
        limit._alone, limit._server_best = None, (0.0, round(level * jobs))
    if level == limit._limit:
        limit._set(now, level, "")  # a fresh window: the ones before were of the others' levels
        return None
    words = f"{jobs} jobs on this machine" if jobs > 1 else "this job alone on this machine"
    return limit._set(now, level, f"{words} where {before} were: each holds its part, {level}")
