"""Where `concurrency: auto` starts on a server that shows its KV cache, and how jobs share a server:
the arithmetic, then the controller on a fake clock with made-up /metrics."""

from __future__ import annotations

import math

import pytest

from pipeline.servers.capacity import RequestFit
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.limits import AdaptiveLimit
from pipeline.servers.sharing import (
    FIT_SCRAPES,
    BatchCap,
    Others,
    ServerShare,
    followed_up,
    joining_share,
    others_in_flight,
    server_share,
)
from pipeline.servers.window import ServerLoad
from tests.support.clock import FakeClock

FIT_64 = RequestFit(64 * 2000, prompt_tokens=1600, answer_tokens=400)


def load(running: float, waiting: float = 0.0, kv: float | None = 0.5) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=kv, preemptions_total=0.0)


def share_and_others(counted: tuple[int, Others] | None) -> tuple[int, float] | None:
    return None if counted is None else (counted[0], counted[1].requests)


def settled(limiter: AdaptiveLimit) -> AdaptiveLimit:
    """A job a few scrapes into its run, alone so far: past the scrapes it waits for its first replies'
    fit (:data:`~pipeline.servers.sharing.FIT_SCRAPES`) before it takes a share of the fit it began with."""
    for _ in range(FIT_SCRAPES):
        limiter.on_server_load(load(limiter.limit))
        limiter.update(in_flight=limiter.limit)
    return limiter


def test_the_first_windows_replies_count_the_fit_again_at_their_mean_prompt_and_answer() -> None:
    share = ServerShare(fit=RequestFit(128_000, prompt_tokens=1000, answer_tokens=2048))  # max_tokens
    assert share.refine() is None  # no reply yet
    for prompt, answer in ((1300, 300), (1500, 500), (1400, 0)):  # an empty reply holds no answer
        share.replied(prompt, answer)
    after = share.refine()
    assert after is not None and (after.prompt_tokens, after.answer_tokens) == (1400, 400)
    assert after.requests == 8000 // 113  # 1,800 tokens: 113 blocks of 16
    share.replied(9000, 9000)
    assert share.refine() is None and share.fit == after  # once


def test_the_share_beside_other_jobs_is_taken_from_the_one_count_of_the_fit() -> None:
    """129 of these fit with the prefix's 62 full blocks held once (63 blocks each of their own): not the
    65 of a count without prefix caching, nor the 130 of one in tokens rather than blocks."""
    fit = RequestFit(131_072, 1500, 500, shared_prefix_tokens=1000, prefix_caching=True)
    limiter = settled(AdaptiveLimit(maximum=512, timeout_s=900, clock=FakeClock(), fit=fit))
    assert limiter.limit == fit.requests == 129
    limiter.update(in_flight=129)
    for _ in range(2):
        limiter.on_server_load(load(229))  # another job's 100 beside this one's 129
    change = limiter.update(in_flight=129)
    assert change is not None and change.new == limiter.share == math.ceil(129 * 129 / 229) == 73


def test_others_are_what_the_server_runs_and_queues_beyond_this_jobs_own() -> None:
    assert others_in_flight(load(50, 10), own_in_flight=40) == 20
    assert others_in_flight(load(30), own_in_flight=40) == 0  # replies between the scrape and the count
    assert others_in_flight(ServerLoad(None, None, None, None), own_in_flight=4) is None


@pytest.mark.parametrize(
    ("own", "server", "share"),
    [
        pytest.param(60, load(62), None, id="alone: a scrape's noise is no other job"),
        pytest.param(64, load(65, 0), None, id="one stray request is noise too"),
        pytest.param(64, load(64, 10), 12, id="first job holds all: held to a little more than the other"),
        pytest.param(1, load(64, 1), 4, id="second job: kept visible to the first until it gives way"),
        pytest.param(10, load(42), 32, id="second job: climbs into what the first left"),
        pytest.param(32, load(64), 32, id="met at half each: both stay"),
        pytest.param(21, load(63), 22, id="three at a third each: the fit less the others"),
        pytest.param(40, load(64), 29, id="a job holding more than the others together gives way"),
    ],
)
def test_the_share_of_a_server_other_jobs_use(own: int, server: ServerLoad, share: int | None) -> None:
    assert share_of(64, own, server) == share


def share_of(fit: int, own: int, server: ServerLoad) -> int | None:
    found = server_share(fit, own, server)
    return None if found is None else found[0]


def test_two_jobs_following_the_rule_meet_at_the_level_of_the_one_holding_fewer() -> None:
    """The one holding more is cut to a little more than the other; the other follows up no further than
    the first holds: they meet, and only their searches (of the server's throughput) move them on."""
    first, second = 64, 20
    for _ in range(20):
        first = min(first, share_of(64, first, load(first + second)) or first)
        found = server_share(64, second, load(first + second))
        second = second if found is None else followed_up(*found)
    assert first == second == 24


def test_a_first_run_starts_where_the_requests_fit_and_counts_it_again_at_the_first_window() -> None:
    clock = FakeClock()
    limiter = settled(AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64))
    assert limiter.limit == 64
    # Replies shorter than counted at first (1,400 + 400 tokens): 70 fit. A window of them, then the move
    # (a descent at most).
    lower = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=RequestFit(128_000, 1000, 2048))
    assert lower.limit == 41
    change = None
    for _ in range(200):
        clock.now += 1.0
        lower.on_finished(latency_s=41 * 400 / 300, output_tokens=400, prompt_tokens=1400, ok=True)
        lower.on_server_load(load(41))
        change = lower.update() or change
        if change is not None:
            break
    assert change is not None and change.new == 58 and "requests of this job fit" in change.reason


def test_the_fit_does_not_move_an_earlier_runs_knee_nor_a_fit_above_the_maximum() -> None:
    clock = FakeClock()
    known = AdaptiveLimit(
        maximum=512, timeout_s=900, clock=clock, known_knee=KneeMemory(80, True), fit=FIT_64
    )
    assert known.limit == 80
    roomy = AdaptiveLimit(maximum=32, timeout_s=900, clock=clock, fit=FIT_64)
    assert roomy.limit == 8  # the KV cache does not bound the job: the ramp as before


def test_another_jobs_requests_drop_the_limit_to_this_jobs_share_within_two_scrapes() -> None:
    clock = FakeClock()
    limiter = settled(AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64))
    assert limiter.update(in_flight=64) is None
    limiter.on_server_load(load(94))  # 30 of another job's beside this one's 64
    assert limiter.update(in_flight=64) is None  # one scrape may be a blip
    limiter.on_server_load(load(95))
    change = limiter.update(in_flight=64)
    assert change is not None and change.new == 38 and limiter.share == 38  # 31 and a fifth
    assert "31 other requests" in change.reason and "share is 38" in change.reason


def test_a_limit_draining_after_a_cut_is_no_other_job() -> None:
    """The scrapes lag the client's count: 64 still on the server while this job's in flight fell to 40
    after its limit dropped is this job's own tail."""
    clock = FakeClock()
    limiter = settled(AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64))
    limiter.update(in_flight=64)
    for counted, in_flight in ((64, 56), (64, 48), (56, 40), (48, 32)):
        limiter.on_server_load(load(counted))  # what the server ran when asked, a moment ago
        assert limiter.update(in_flight=in_flight) is None
        assert limiter.share is None


def test_a_queue_beside_another_jobs_requests_sends_this_job_to_its_half_not_to_nothing() -> None:
    """Both jobs started at the fit: the server runs 60 of their 128 and queues the rest. Each takes half
    the fit (the others' 64 are there), not the whole queue as its own (which would send both to the
    minimum); the queue's part is this job's in proportion (tests/servers/test_signals.py)."""
    clock = FakeClock()
    limiter = settled(AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64))
    limiter.update(in_flight=64)
    for _ in range(2):  # two scrapes, the server no longer taking any in
        limiter.on_server_load(load(60, waiting=68))
    change = limiter.update(in_flight=64)
    # It ran this job's 64 alone a moment ago: 60 running now is no cap on what it holds.
    assert change is not None and change.new == 32 and "this job's share is 32" in change.reason


def test_beside_others_the_fit_is_counted_again_after_a_few_replies_not_at_the_first_window() -> None:
    """Two jobs whose shares move keep resetting their windows: one that counted its fit at max_tokens
    (41 of these) beside one that measured its replies (70) would take a share of the wrong fit."""
    share = ServerShare(fit=RequestFit(128_000, prompt_tokens=1000, answer_tokens=2048))
    for _ in range(8):
        share.replied(1400, 400)
    for _ in range(2):
        share.scraped(load(70))  # another job's 40 beside this one's 30
    settled = share.counted(30)
    assert share.refined and share.fit is not None and share.fit.requests == 70
    assert settled is not None and settled[0] == 30  # what the others leave of 70 (of 41 it would be 18)
    assert settled[1] == Others(40.0)
    # Counted once; the limit may still move to it at its first window (a start at a part of the fit)
    assert share.refine() == share.fit and share.refine() is None


def test_a_queue_at_a_steady_running_count_is_the_servers_batch_and_a_burst_being_admitted_is_not() -> None:
    cap = BatchCap()
    for running, waiting in ((40, 200), (100, 140), (160, 80)):  # taking a burst in, a few a step
        cap.seen(load(running, waiting))
    assert cap.capacity(500) == 500
    cap.seen(load(160, 80))  # no longer rising, still queueing: it runs 160 at once
    assert cap.capacity(500) == 160 and cap.capacity(100) == 100
    cap.seen(load(158, 0))  # a cap stays while the server runs no more
    assert cap.capacity(500) == 160
    cap.seen(load(240, 0))  # it ran more after all: no cap
    assert cap.capacity(500) == 500


@pytest.mark.parametrize(
    ("others", "start"),
    [
        pytest.param(64, 32, id="half of what the others run: their level is the server's best they found"),
        pytest.param(200, 100, id="the others hold the server: half, so that they give way"),
        pytest.param(300, 150, id="the server runs more than this job's fit: half of that"),
        pytest.param(10, 5, id="the others hold few: half of it still"),
        pytest.param(5, None, id="fewer than a job's: nobody there"),
    ],
)
def test_a_job_joining_a_busy_server_starts_where_the_others_see_it(others: int, start: int | None) -> None:
    assert joining_share(200, load(others)) == start


def test_a_server_that_runs_fewer_than_fit_is_what_the_jobs_share() -> None:
    """A 9B at --max-num-seqs 8 where 130 of the job's requests fit: two jobs share the 8 it runs."""
    share = ServerShare(fit=RequestFit(130 * 2000, prompt_tokens=1600, answer_tokens=400))
    share.scrape_count = FIT_SCRAPES  # past its first scrapes
    for _ in range(3):
        share.scraped(load(8, 250))  # both jobs' 130 at first, the server running 8
    share.own_peak = 130
    assert share.capacity == 8 and share.holds_words == "that runs 8 at once (130 fit)"
    counted = share.counted(130)  # its part of the 8, in proportion to what it holds
    assert counted is not None and counted[0] == 5 and counted[1].requests == 128.0
    assert share.least == 3  # the fewest the other still sees as a job


def shared_limiter(clock: FakeClock, own: int, others: int) -> AdaptiveLimit:
    """A job at the fit cut to its share beside another job's ``others``."""
    limiter = settled(AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64))
    limiter.update(in_flight=64)
    for _ in range(2):
        limiter.on_server_load(load(own + others))
    limiter.on_server_load(load(own + others))
    return limiter


def test_a_job_its_share_held_follows_the_other_up_no_further_than_it_holds() -> None:
    clock = FakeClock()
    limiter = shared_limiter(clock, 64, 20)
    cut = limiter.update(in_flight=64)
    assert cut is not None and cut.new == 24  # a fifth more than the other's 20
    limiter.update(in_flight=24)
    for _ in range(3):  # the first still counts this job's 64 draining
        limiter.on_server_load(load(24 + 30))  # the other's search took it to 30, leaving 34
    up = limiter.update(in_flight=24)
    assert up is not None and up.new == 30
    assert up.reason.endswith("share is 34: up to what the others hold, 30")


def test_a_job_whose_search_went_below_its_share_stays_there_when_the_other_gives_way() -> None:
    """Its search found the server did better with fewer there: the others' room is no reason to fill it."""
    clock = FakeClock()
    limiter = shared_limiter(clock, 64, 20)
    limiter.update(in_flight=64)
    limiter._knee.best = 20  # what its search settled on, below the share of 24
    limiter.update(in_flight=20)
    for _ in range(3):
        limiter.on_server_load(load(20 + 40))
    assert limiter.update(in_flight=20) is None and limiter.limit == 24


def test_a_server_signal_beside_others_backs_a_job_off_no_further_than_they_still_see_it() -> None:
    """A server that runs 8 at once, another job's 30 queued: this job's part of what runs is 1, but at 1
    the other would take it for noise and never give way; it holds 3."""
    clock = FakeClock()
    limiter = settled(
        AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=RequestFit(8 * 2000, 1600, 400))
    )
    limiter.update(in_flight=8)
    for _ in range(3):
        limiter.on_server_load(load(8, 30))
    change = limiter.update(in_flight=8)
    assert change is not None and change.new == 3 and "share is 3" in change.reason
    for _ in range(12):
        clock.now += 5.0
        limiter.on_finished(latency_s=1.0, output_tokens=100, prompt_tokens=1600, ok=True)
        limiter.on_server_load(load(8, 30))
        limiter.update(in_flight=3)
    assert limiter.limit == 3


def test_a_run_beside_others_leaves_the_servers_level_not_its_share_for_the_next_night() -> None:
    """Cut to 34 beside another job's 60, it measured its level there: the server did best at 94 in flight,
    from which a night alone searches on (its 34 would start that night at a third of the server)."""
    clock = FakeClock()
    limiter = shared_limiter(clock, 64, 60)
    cut = limiter.update(in_flight=64)
    assert cut is not None and cut.new == 34
    for _ in range(120):
        clock.now += 1.0
        limiter.on_finished(latency_s=10.0, output_tokens=400, prompt_tokens=1600, ok=True)
        limiter.on_server_load(load(34 + 60))
        limiter.update(in_flight=34)
    assert limiter.learned == KneeMemory(94, bracketed=False)
    # Its steps are of the server's level (4% of it), not of its own (whose gain the windows' noise hides).
    assert limiter._knee.smallest > 2 * math.log1p(0.04)


def test_a_job_waits_for_its_first_replies_fit_a_few_scrapes_before_it_takes_a_share() -> None:
    """Counted at max_tokens, 41 of its requests fit where the others' replies say 70: a share of 41 beside
    their 35 would be 6. A few scrapes for its first replies (or, without any, the fit it has)."""
    share = ServerShare(fit=RequestFit(128_000, prompt_tokens=1000, answer_tokens=2048))
    share.own_peak = 30
    for _ in range(3):
        share.scraped(load(65))
        assert share.counted(30) is None
    for _ in range(8):
        share.replied(1400, 400)
    share.scraped(load(65))
    assert share_and_others(share.counted(30)) == (35, 35.0) and share.refined  # of the 70 its replies fit
    late = ServerShare(fit=RequestFit(128_000, prompt_tokens=1000, answer_tokens=2048))
    for _ in range(FIT_SCRAPES):
        late.own_peak = 30
        late.scraped(load(65))
    assert share_and_others(late.counted(30)) == (19, 35.0)  # no reply with tokens: its part of the 41


def test_a_limit_that_just_rose_does_not_hide_the_other_jobs_from_the_release() -> None:
    """The last four scrapes showed the other job's 30 beside this one's 30; this one's count is 60 now
    (its limit just rose): the others are still there."""
    share = ServerShare(fit=FIT_64)
    share.share = 30
    for _ in range(4):
        share.own_peak = 30
        share.scraped(load(60))
    share.counted(60)
    assert share.share is not None and not share.released


def test_a_job_joining_takes_the_server_as_at_least_what_it_runs_now() -> None:
    """Its fit counted at max_tokens says 70; the other job runs 231 there (its replies' fit, 206 and
    more): half of 70 would cut that job to a fraction of the server, half of 231 lets both see the other."""
    assert joining_share(70, load(231)) == 116
    assert joining_share(70, load(60, waiting=171)) == 30  # it queues past 60: half of what it runs
