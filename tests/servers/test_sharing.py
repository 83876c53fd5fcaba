"""Where `concurrency: auto` starts on a server that shows its KV cache, and how jobs share a server:
the arithmetic, then the controller on a fake clock with made-up /metrics."""

from __future__ import annotations

import math

import pytest

from pipeline.servers.capacity import RequestFit
from pipeline.servers.knee_search import KneeMemory, ServerLoad
from pipeline.servers.limits import AdaptiveLimit
from pipeline.servers.sharing import ServerShare, others_in_flight, server_share

FIT_64 = RequestFit(64 * 2000, prompt_tokens=1600, answer_tokens=400)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def load(running: float, waiting: float = 0.0, kv: float | None = 0.5) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=kv, preemptions_total=0.0)


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
    limiter = AdaptiveLimit(maximum=512, timeout_s=900, clock=FakeClock(), fit=fit)
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
        pytest.param(64, load(64, 10), 32, id="first job holds all: gives way to half"),
        pytest.param(1, load(64, 1), 4, id="second job: kept visible to the first until it gives way"),
        pytest.param(10, load(42), 32, id="second job: climbs into what the first left"),
        pytest.param(32, load(64), 32, id="met at half each: both stay"),
        pytest.param(21, load(63), 22, id="three at a third each: the fit less the others"),
        pytest.param(40, load(64), 32, id="a job holding more than the others together gives way"),
    ],
)
def test_the_share_of_a_server_other_jobs_use(own: int, server: ServerLoad, share: int | None) -> None:
    assert server_share(64, own, server) == share


def test_two_jobs_following_the_rule_meet_at_half_the_fit() -> None:
    first, second = 64, 4
    for _ in range(20):  # each takes its share (the first cuts at once; the second climbs to it)
        first = min(first, server_share(64, first, load(first + second)) or first)
        second = server_share(64, second, load(first + second)) or second
    assert first == second == 32


def test_a_first_run_starts_where_the_requests_fit_and_counts_it_again_at_the_first_window() -> None:
    clock = FakeClock()
    limiter = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64)
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
    limiter = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64)
    assert limiter.update(in_flight=64) is None
    limiter.on_server_load(load(94))  # 30 of another job's beside this one's 64
    assert limiter.update(in_flight=64) is None  # one scrape may be a blip
    limiter.on_server_load(load(95))
    change = limiter.update(in_flight=64)
    assert change is not None and change.new == 32 and limiter.share == 32
    assert "31 other requests" in change.reason and "share is 32" in change.reason


def test_a_limit_draining_after_a_cut_is_no_other_job() -> None:
    """The scrapes lag the client's count: 64 still on the server while this job's in flight fell to 40
    after its limit dropped is this job's own tail."""
    clock = FakeClock()
    limiter = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64)
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
    limiter = AdaptiveLimit(maximum=512, timeout_s=900, clock=clock, fit=FIT_64)
    limiter.update(in_flight=64)
    for _ in range(2):  # two scrapes, the server no longer taking any in
        limiter.on_server_load(load(60, waiting=68))
    change = limiter.update(in_flight=64)
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
    assert settled == (30, 40.0)  # what the others leave of 70 (of 41 it would be 18)
    assert share.refine() is None  # counted once
