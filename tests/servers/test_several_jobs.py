"""Three or more jobs on one server (:mod:`pipeline.servers.sharing` with :mod:`pipeline.servers.peers`):
the server's counts say how many requests are others', the jobs on this machine say whose."""

from __future__ import annotations

import pytest

from pipeline.servers.capacity import RequestFit
from pipeline.servers.limits import AdaptiveLimit
from pipeline.servers.peers import Peer
from pipeline.servers.sharing import (
    Others,
    followed_up,
    joining_share,
    other_jobs,
    server_share,
    start_share,
    starting_share,
)
from pipeline.servers.window import ServerLoad

FIT_96 = RequestFit(96 * 2000, prompt_tokens=1600, answer_tokens=400)


def load(running: float, waiting: float = 0.0) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=0.5, preemptions_total=0.0)


@pytest.mark.parametrize(
    ("peers", "others"),
    [
        pytest.param((), Others(96, 1, 96.0), id="no job says: the others are one job"),
        pytest.param((Peer(48), Peer(48)), Others(96, 2, 48.0), id="two jobs here hold them all"),
        pytest.param((Peer(48),), Others(96, 2, 48.0), id="what no job here claims: one job elsewhere"),
        pytest.param((Peer(94),), Others(96, 1, 94.0), id="a scrape's noise unclaimed: no job"),
        pytest.param((Peer(48, 64), Peer(48)), Others(96, 2, 48.0), id="one drains: the other sets it"),
        pytest.param((Peer(90, 128),), Others(96, 1, None), id="all drain: no one sets a pace"),
        pytest.param((Peer(46, 50), Peer(50)), Others(96, 2, 50.0), id="one just rose: what it will hold"),
        pytest.param((Peer(1), Peer(95)), Others(96, 1, 95.0), id="a job's first request is not yet one"),
    ],
)
def test_who_the_other_requests_are(peers: tuple[Peer, ...], others: Others) -> None:
    assert other_jobs(192, 96, peers) == others


def test_of_three_jobs_the_one_holding_twice_the_others_gives_way_which_their_sum_never_told() -> None:
    """64 fit; it holds 32 beside two of 16: as much as the others together (by their sum a fair
    pair), a fifth more than their mean job by their own word."""
    by_sum = server_share(64, 32, load(64))
    assert by_sum is not None and by_sum[0] == 32
    found = server_share(64, 32, load(64), (Peer(16), Peer(16)))
    assert found is not None and found == (20, Others(32, 2, 16.0))
    small = server_share(64, 16, load(64), (Peer(32), Peer(16)))
    assert small is not None and small[0] == 16 and followed_up(*small) == 16


def test_three_jobs_following_the_rule_meet_within_a_fifth_of_each_other() -> None:
    """Each takes what the others leave or its part of what it holds, the one above the others' mean is
    held to a fifth more, and one its share held follows them up no further than each holds."""
    held = [64, 20, 8]
    for _ in range(40):
        for job in range(3):
            others = tuple(Peer(n) for other, n in enumerate(held) if other != job)
            found = server_share(64, held[job], load(sum(held)), others)
            if found is not None:
                share, seen = found
                held[job] = min(held[job], share) if held[job] > share else followed_up(share, seen)
    assert max(held) <= 1.25 * min(held) and sum(held) <= 64


def test_jobs_starting_together_on_this_machine_each_start_at_their_part_of_the_fit() -> None:
    assert starting_share(96, ()) is None
    assert starting_share(96, (Peer(0), Peer(0))) == 32
    assert start_share(96, load(0), (Peer(0), Peer(0)), start=96) == 32
    assert start_share(96, load(0), (Peer(0),), start=8) is None  # a ramp from 8: no cut, it goes on
    assert start_share(96, None, (Peer(0),), start=96) is None  # no /metrics: no share at all
    limit = AdaptiveLimit(maximum=512, timeout_s=900)
    assert limit.start_at_fit(FIT_96, load(0), (Peer(0), Peer(0))) == 32 and limit.limit == 32


def test_a_job_joining_two_counts_itself_a_third_of_what_the_server_runs() -> None:
    assert joining_share(96, load(96)) == 48  # nothing says whose: one other job
    assert joining_share(96, load(96), (Peer(48), Peer(48))) == 32
    assert joining_share(96, load(64), (Peer(64), Peer(0))) == 22  # one runs, one starts with it


def test_a_job_done_sending_holds_no_one_back_and_leaves_its_room_to_the_others() -> None:
    """Beside a job whose last 10 requests drain, this one is not held to a fifth more than those 10:
    it takes what they leave."""
    draining = server_share(64, 40, load(50), (Peer(10, 40),))
    assert draining is not None and draining[0] == 54
    sending = server_share(64, 40, load(50), (Peer(10),))
    assert sending is not None and sending[0] == 12
