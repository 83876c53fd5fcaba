"""`concurrency: auto`: the controller on a fake clock against made-up servers, then in closed loop
against the simulator's engine for each calibrated profile (virtual time: no real waiting)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from pipeline.bench.closed_loop import Scenario, run_load
from pipeline.servers.knee_search import KneeMemory, ServerLoad
from pipeline.servers.limits import AdaptiveLimit, LimitChange

TOKENS = 400


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    """A made-up server: ``curve(c)`` output tok/s at concurrency c, replies evenly spaced, each one
    having taken c x tokens / curve(c) seconds (Little's law); ``load(c)`` is its /metrics, if any."""

    curve: Callable[[int], float]
    load: Callable[[int], ServerLoad] | None = None

    def drive(self, limiter: AdaptiveLimit, clock: FakeClock, seconds: float) -> list[LimitChange]:
        """Closed loop for ``seconds``: a reply, a scrape every 5 s, ``update`` after every reply."""
        changes: list[LimitChange] = []
        end, next_scrape = clock.now + seconds, clock.now + 5.0
        while clock.now < end:
            concurrency = limiter.limit
            throughput = self.curve(concurrency)
            clock.now += TOKENS / throughput
            limiter.on_finished(latency_s=concurrency * TOKENS / throughput, output_tokens=TOKENS, ok=True)
            while self.load is not None and clock.now >= next_scrape:
                limiter.on_server_load(self.load(concurrency))
                next_scrape += 5.0
            change = limiter.update()
            if change is not None:
                assert change.old == concurrency and change.new == limiter.limit and change.reason
                changes.append(change)
        return changes


def limiter(
    clock: FakeClock,
    *,
    maximum: int = 512,
    minimum: int = 1,
    initial: int | None = None,
    timeout_s: float = 900.0,
) -> AdaptiveLimit:
    return AdaptiveLimit(maximum=maximum, minimum=minimum, initial=initial, timeout_s=timeout_s, clock=clock)


def steps(changes: list[LimitChange]) -> list[tuple[int, int]]:
    return [(change.old, change.new) for change in changes]


def no_queue(concurrency: int) -> ServerLoad:
    return ServerLoad(running=concurrency, waiting=0, kv_usage=0.3, preemptions_total=0)


def test_grows_multiplicatively_while_throughput_rises_and_never_passes_the_maximum() -> None:
    clock = FakeClock()
    controller = limiter(clock, maximum=64)
    changes = Server(lambda c: 30.0 * c).drive(controller, clock, 3600)
    assert steps(changes)[:3] == [(8, 16), (16, 32), (32, 64)]
    assert [change.reason for change in changes[:2]] == [
        "8 gives 240 tok/s: trying 16",
        "throughput rose 100% (240 -> 480 tok/s) from 8 to 16: trying 32",
    ]
    assert max(change.new for change in changes) == 64 and controller.limit == 64
    # At the maximum it looked one step below, saw throughput fall, and stayed.
    assert steps(changes)[3:5] == [(64, 61), (61, 64)]
    assert (
        changes[4].reason
        == "throughput fell 5% (1920 -> 1830 tok/s) from 64 to 61: back to 64, the best level"
    )
    assert controller.at_knee


def test_stops_at_a_plateau_and_comes_back_to_its_edge_without_metrics() -> None:
    clock = FakeClock()
    controller = limiter(clock)  # 20 tok/s per stream up to 12 streams, then flat: a server that queues
    changes = Server(lambda c: 20.0 * min(c, 12)).drive(controller, clock, 3 * 3600)
    assert steps(changes)[:3] == [(8, 16), (16, 32), (32, 15)]
    assert changes[2].reason == (
        "throughput unchanged (240 -> 240 tok/s) from 16 to 32 (2.00x the concurrency): trying 15"
    )
    assert "(a plateau: as much for less)" in changes[3].reason
    assert controller.best_level == 12 and controller.at_knee
    assert {change.new for change in changes[-6:]} == {11, 12, 13}  # at the edge, a step around it at most


def test_backs_off_to_what_the_server_runs_when_its_queue_stays_non_empty() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=16)

    def queue(concurrency: int) -> ServerLoad:  # --max-num-seqs 8
        return ServerLoad(min(concurrency, 8), max(concurrency - 8, 0), 0.05, 0)

    changes = Server(lambda c: 19.0 * min(c, 8), queue).drive(controller, clock, 20)
    assert steps(changes) == [(16, 8)]
    assert changes[0].reason == "the server queues at 16: 8 waiting, 8 running (mean of 3 scrapes): down to 8"
    assert controller.ceiling == 8


def test_kv_cache_near_full_allows_only_small_steps_up() -> None:
    def kv(usage: float) -> Callable[[int], ServerLoad]:
        return lambda concurrency: ServerLoad(concurrency, 0, usage, 0)

    roomy, full = FakeClock(), FakeClock()
    grows, creeps = limiter(roomy, initial=64), limiter(full, initial=64)
    assert steps(Server(lambda c: 30.0 * c, kv(0.5)).drive(grows, roomy, 100))[0] == (64, 128)
    changes = Server(lambda c: 30.0 * c, kv(0.95)).drive(creeps, full, 100)
    assert steps(changes)[0] == (64, 67)
    assert changes[0].reason == "64 gives 1920 tok/s (KV cache 95% used: small steps up): trying 67"


def test_backs_off_one_step_when_preemptions_rise() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=64)
    scrapes = iter(range(0, 1000, 2))  # two more preemptions every 5 s

    def preempting(concurrency: int) -> ServerLoad:
        return ServerLoad(concurrency, 0, 0.99, next(scrapes))

    changes = Server(lambda c: 30.0 * c, preempting).drive(controller, clock, 30)
    assert steps(changes) == [(64, 61)]  # once the transient (the first 13 s) is over: 4 in 3 scrapes
    assert changes[0].reason.startswith("the server preempted 4 requests in ")
    assert changes[0].reason.endswith(" replies at 64, KV cache 99% used: down to 61")
    assert controller.ceiling == 61


def test_a_few_preemptions_are_tolerated() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=64)
    counts = iter([0, 0, 1, 1, 1, 2] + [2] * 1000)  # 2 preemptions over hundreds of replies

    def rare(concurrency: int) -> ServerLoad:
        return ServerLoad(concurrency, 0, 0.97, next(counts))

    assert steps(Server(lambda c: 30.0 * c, rare).drive(controller, clock, 100))[0] == (64, 67)


def test_backs_off_when_latency_nears_the_timeout() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=64, timeout_s=100.0)
    changes = Server(lambda c: 320.0).drive(controller, clock, 400)  # each reply takes 64 x 400 / 320 = 80 s
    assert steps(changes)[0] == (64, 32)
    assert changes[0].reason == "p90 latency 80 s at 64 is above 50% of the 100 s timeout: down to 32"
    assert controller.ceiling == 32


def test_timeouts_count_as_replies_that_took_the_whole_timeout() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=10, timeout_s=60.0)
    clock.now += 60.0
    for _ in range(21):  # a hung server: nothing but timeouts (the first starts the window)
        clock.now += 6.0
        controller.on_timeout()
    change = controller.update()
    assert change is not None and (change.old, change.new) == (10, 4)  # p90 to 0.8 of half the timeout
    assert change.reason == (
        "p90 latency 60 s at 10 is above 50% of the 60 s timeout, 20 of 20 replies timed out: down to 4"
    )


def test_never_goes_below_the_minimum() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=8, minimum=6)

    def queue(concurrency: int) -> ServerLoad:  # the server runs 2: it wants 2, it gets 6
        return ServerLoad(2, concurrency - 2, 0.1, 0)

    changes = Server(lambda c: 40.0, queue).drive(controller, clock, 600)
    assert steps(changes)[0] == (8, 6)
    assert min(change.new for change in changes) == 6 and controller.limit >= 6


def test_goes_back_to_the_best_level_when_throughput_collapses_after_growth() -> None:
    clock = FakeClock()
    controller = limiter(clock)  # past 32 streams the server thrashes: 100 tok/s whatever the load
    changes = Server(lambda c: 30.0 * c if c <= 32 else 100.0).drive(controller, clock, 3 * 3600)
    assert steps(changes)[:4] == [(8, 16), (16, 32), (32, 64), (64, 30)]
    assert changes[3].reason == "throughput fell 90% (960 -> 100 tok/s) from 32 to 64: trying 30"
    assert controller.limit == 32
    # Later re-probes above the cliff last one window each and always come back.
    assert all(change.new == 32 for change in changes[4:] if change.old > 32)


def test_replies_to_requests_sent_before_a_change_do_not_count() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=8)
    for _ in range(100):  # requests sent before the limiter existed: the transient
        clock.now += 1.0
        controller.on_finished(latency_s=200.0, output_tokens=TOKENS, ok=True)
        assert controller.update() is None
    for _ in range(17):  # the first reply to a new request starts the window, 16 more fill it
        clock.now += 1.0
        controller.on_finished(latency_s=10.0, output_tokens=TOKENS, ok=True)
    change = controller.update()
    assert change is not None and change.reason == "8 gives 320 tok/s: trying 16"


def test_a_window_lasts_twice_the_limit_in_replies_however_long_they_take() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=256)
    clock.now += 120.0
    controller.on_finished(latency_s=120.0, output_tokens=TOKENS, ok=True)  # starts the window
    for _ in range(511):
        clock.now += 0.5
        controller.on_finished(latency_s=120.0, output_tokens=TOKENS, ok=True)
        assert controller.update() is None
    clock.now += 0.5
    controller.on_finished(latency_s=120.0, output_tokens=TOKENS, ok=True)
    change = controller.update()
    assert change is not None and (change.old, change.new) == (256, 512)


def test_failed_replies_deliver_nothing() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=8)
    clock.now += 10.0
    for number in range(201):  # after the first, which starts the window: one in four fails
        clock.now += 1.0
        controller.on_finished(latency_s=10.0, output_tokens=TOKENS, ok=number % 4 != 0)
    change = controller.update()
    assert change is not None and change.reason == "8 gives 240 tok/s: trying 16"  # 320 with no failures


def test_follows_a_server_that_gets_faster() -> None:
    clock = FakeClock()
    controller = limiter(clock)
    capacity = {"streams": 16}
    server = Server(lambda c: 25.0 * min(c, capacity["streams"]))
    server.drive(controller, clock, 3 * 3600)
    assert controller.limit == 16 and controller.at_knee
    capacity["streams"] = 64  # a neighbour left, or the server was upgraded
    changes = server.drive(controller, clock, 6 * 3600)
    assert changes[0].reason == "16 gives 400 tok/s: re-probing 17, a step from the knee at 16"
    assert steps(changes)[:6] == [(16, 17), (17, 19), (19, 23), (23, 32), (32, 60), (60, 120)]
    assert controller.best_level == 66  # the new edge, 64, to within a step


def test_starts_at_a_known_knee_and_searches_it_in_small_steps() -> None:
    """The next run of a job starts where the last one found the knee: no ramp through 8, 16, 32..."""
    clock = FakeClock()
    controller = AdaptiveLimit(
        maximum=512, timeout_s=900.0, known_knee=KneeMemory(64, bracketed=True), clock=clock
    )
    assert controller.limit == 64
    # 30 tok/s per stream up to 64, then each stream more slows every other one: a peak at 64.
    changes = Server(lambda c: 30.0 * c if c <= 64 else 1920.0 * (64 / c) ** 0.5).drive(
        controller, clock, 3600
    )
    assert steps(changes)[0] == (64, 67)  # a 4% step, where a ramp from 8 would double
    assert max(change.new for change in changes) < 80 and min(change.new for change in changes) > 55
    assert controller.at_knee and controller.best_level == 64
    assert (
        AdaptiveLimit(maximum=32, timeout_s=900.0, known_knee=KneeMemory(64, bracketed=True)).limit == 32
    )  # still within bounds


def test_invalid_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="need 1 <= minimum <= maximum, not 9 and 8"):
        AdaptiveLimit(maximum=8, minimum=9, timeout_s=900.0)
    with pytest.raises(ValueError, match="timeout_s must be positive, not 0"):
        AdaptiveLimit(maximum=8, timeout_s=0)
    assert AdaptiveLimit(maximum=4, timeout_s=900.0).limit == 4  # the default start (8), capped


# Closed loop against the engine. The best fixed levels are those of benchmarks/adaptive_concurrency.py's
# sweep; the scenarios are as long as auto needs to bracket its knee (35-50 model minutes), plus a margin.
HARNESS = [
    pytest.param(Scenario("gpt-oss-120b", 3600), 256, id="gpt-oss-120b"),
    pytest.param(Scenario("nemotron-super-49b", 3600), 256, id="nemotron-super-49b"),
    pytest.param(Scenario("nemotron-nano-9b", 1800), 8, id="nemotron-nano-9b"),
    pytest.param(Scenario("nemotron-nano-9b", 3600, metrics=False), 8, id="nano-without-metrics"),
    pytest.param(Scenario("nemotron-super-49b", 3600, kv_cache_tokens=150_000), 88, id="49b-kv-starved"),
]


def test_the_next_run_from_a_known_knee_is_at_its_best_from_the_start() -> None:
    """gpt-oss-120b's ramp from 8 takes ~45 model minutes; from the last run's knee there is none."""
    scenario = Scenario("gpt-oss-120b", 1800, known_knee=KneeMemory(246, bracketed=True))
    auto = run_load(scenario)
    best = run_load(dataclasses.replace(scenario, known_knee=None), 256).throughput(450.0)
    assert auto.throughput() >= 0.95 * best, (auto.throughput(), best)
    assert min(limit for _, limit in auto.trace) >= 200


@pytest.mark.parametrize(("scenario", "best_level"), HARNESS)
def test_auto_reaches_the_best_fixed_level_and_never_sits_collapsed(
    scenario: Scenario, best_level: int
) -> None:
    auto = run_load(scenario)
    assert auto.knee_at is not None  # found within the scenario
    last_quarter = scenario.duration_s * 0.75
    reference = dataclasses.replace(scenario, duration_s=1200.0)  # fixed levels settle within minutes
    best = run_load(reference, best_level).throughput(600.0)
    assert auto.throughput(last_quarter) >= 0.9 * best, (auto.throughput(last_quarter), best)
    at_final = run_load(reference, auto.final_limit).throughput(600.0)
    assert at_final >= 0.8 * best, (auto.final_limit, at_final, best)
    assert auto.timeouts == 0 and auto.changes and all(change.reason for _, change in auto.changes)
