"""What `concurrency: auto`'s limit (:class:`~pipeline.servers.limits.AdaptiveLimit`) does when other jobs'
requests run on its server (jobs of other machines: :mod:`~pipeline.servers.sharing` says the rules): its
share is a ceiling the limit drops to, a limit its share held follows the others up, and once they are
gone the limit goes back to the level for this job alone. A part of the controller, kept apart: it reads
and moves the controller's own state (:class:`Limit` names what it touches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipeline.servers.knee_search import KneeSearch
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
        action = action if level == share else "up to what the others hold,"
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
