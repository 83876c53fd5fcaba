"""Jobs on one machine that use one server (:mod:`pipeline.servers.beside_others`): the one that came
first searches for them all, the others hold what it holds, and when jobs come or go what they hold
together stays."""

from __future__ import annotations

from pipeline.servers.capacity import RequestFit
from pipeline.servers.limits import AdaptiveLimit
from pipeline.servers.peers import Peer
from pipeline.servers.sharing import other_jobs, server_share
from pipeline.servers.window import ServerLoad
from tests.support.clock import FakeClock

FIT_64 = RequestFit(64 * 2000, prompt_tokens=1600, answer_tokens=400)


def load(running: float) -> ServerLoad:
    return ServerLoad(running=running, waiting=0.0, kv_usage=0.5, preemptions_total=0.0)


def first(level: int) -> Peer:
    """The job that came to the server before this one, holding ``level``."""
    return Peer(level, level, earlier=True)


def later(level: int) -> Peer:
    return Peer(level, level, earlier=False)


def test_a_job_that_came_second_holds_what_the_first_holds_up_and_down() -> None:
    clock = FakeClock()
    job = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock)
    assert job.start_at_fit(FIT_64, load(0), (first(32),)) == 32  # its part of the fit
    for level in (40, 24, 600):
        job.on_peers((first(level),))
        clock.now += 1
        change = job.update(in_flight=job.limit)
        assert change is not None and job.limit == min(level, 512)
        assert "came to the server first holds" in change.reason
    job.on_peers((Peer(0, 0, earlier=True),))  # it said nothing yet: it is about to start
    assert job.update(in_flight=job.limit) is None and job.limit == 512


def test_a_level_set_before_this_job_came_was_for_fewer_jobs_it_is_not_followed_up_until_it_moves() -> None:
    """The first job held 64 alone; this one joined at its part (32): it waits for the first to make
    room (it halves when it sees two), not doubling what the server runs meanwhile."""
    clock = FakeClock()
    job = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock)
    job.start_at_fit(FIT_64, load(64), (first(64),))
    assert job.limit == 32
    assert job.update(in_flight=32) is None and job.limit == 32
    job.on_peers((first(34),))
    assert job.update(in_flight=32) is not None and job.limit == 34


def test_the_first_job_gives_a_newcomer_its_part_of_what_they_held_and_takes_it_back_when_it_goes() -> None:
    clock = FakeClock()
    job = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, initial=60)
    job.on_server_load(load(60))
    job.on_peers((later(0),))
    change = job.update(in_flight=60)
    assert change is not None and job.limit == 30
    assert change.reason == "2 jobs on this machine where 1 were: each holds its part, 30"
    job.on_peers((later(30), later(0)))
    assert job.update(in_flight=30) is not None and job.limit == 20
    job.on_peers(())
    change = job.update(in_flight=20)
    assert change is not None and job.limit == 60
    assert change.reason == "this job alone on this machine where 3 were: each holds its part, 60"
    assert job.update(in_flight=60) is None  # as many as before: nothing moves


def test_a_job_whose_first_is_gone_searches_from_what_they_held_together() -> None:
    clock = FakeClock()
    job = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock)
    job.start_at_fit(FIT_64, load(0), (first(32),))
    job.on_peers((first(40), later(40)))
    job.update(in_flight=32)
    assert job.limit == 40
    job.on_peers((later(40),))  # the first is done: this one and the third
    change = job.update(in_flight=40)
    assert change is not None and job.limit == 60  # the three held 120: now two of them
    assert job.best_level == 60 and not job.at_knee  # its own search, from there


def test_the_first_jobs_share_counts_the_jobs_that_follow_it_at_its_level() -> None:
    """Two follow it: each holds its third of the fit, whatever they hold this instant (they lag a
    scrape behind it). Counted as others, their lag moved its share, and theirs with it, both ways."""
    for lag in (21, 40, 10):
        found = server_share(64, 21, load(21 + 2 * lag), (later(lag), later(lag)))
        assert found is not None and found[0] == 21
    beside = server_share(64, 16, load(16 + 16 + 32), (later(16),))  # and a job elsewhere holding 32
    assert beside is not None and beside[0] == 16


def test_jobs_that_follow_this_one_set_no_pace_for_it_the_job_it_follows_does() -> None:
    assert other_jobs(64, 40, (later(20), later(20))).each is None
    assert other_jobs(64, 40, (first(20), later(20))).each == 20.0
    assert other_jobs(64, 40, (Peer(20, 20), Peer(20, 20))).each == 20.0  # order not known: as before


def test_a_night_after_holding_a_part_stores_what_the_jobs_held_together_not_the_part() -> None:
    """Stored as its knee, a part (a half) would start the next night alone at half the server."""
    clock = FakeClock()
    follower = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock)
    follower.start_at_fit(FIT_64, load(0), (first(32),))
    assert follower.learned is None  # nothing measured, nothing followed yet
    follower.on_peers((first(40),))
    follower.update(in_flight=32)
    learned = follower.learned
    assert learned is not None and learned.level == 80 and not learned.bracketed

    lead = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, initial=60)
    lead.on_peers((later(0),))
    lead.update(in_flight=60)
    assert lead.limit == 30 and lead.learned is None  # nothing measured yet
    lead._measured = True  # a window judged at 30 (the search's own tests drive windows)
    learned = lead.learned
    assert learned is not None and learned.level == 60 and not learned.bracketed
