"""`concurrency: auto`: the controller on a fake clock against made-up servers, then in closed loop
against the simulator's engine for each calibrated profile (virtual time: no real waiting)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from pipeline.bench.closed_loop import SERVER_MODELS, Scenario, Workload, run_load
from pipeline.servers.client_load import ClientLoad
from pipeline.servers.knee_search import KneeMemory, KneeSearch
from pipeline.servers.limits import AdaptiveLimit, LimitChange
from pipeline.servers.window import DEFAULT_TUNING, ServerLoad
from tests.support.clock import FakeClock

TOKENS = 400
PROMPT = 1500  # a reply's prompt tokens: only a start at the fit counts them


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
            limiter.on_finished(
                latency_s=concurrency * TOKENS / throughput,
                output_tokens=TOKENS,
                prompt_tokens=PROMPT,
                ok=True,
            )
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


def test_ramps_to_128_then_by_four_while_throughput_rises_and_never_passes_the_maximum() -> None:
    """A real server's knee is at 64 to 512 in flight: the ramp does not crawl there from 8 by doublings."""
    clock = FakeClock()
    controller = limiter(clock, maximum=1024)
    changes = Server(lambda c: 30.0 * min(c, 600)).drive(controller, clock, 3 * 3600)
    assert steps(changes)[:3] == [(8, 128), (128, 512), (512, 1024)]
    assert [change.reason for change in changes[:2]] == [
        "8 gives 240 tok/s: trying 128",
        "throughput rose 1500% (240 -> 3840 tok/s) from 8 to 128: trying 512",
    ]
    assert max(change.new for change in changes) == 1024
    assert controller.at_knee and 570 <= controller.best_level <= 630  # the edge, 600, to within a step


def test_stops_at_a_plateau_and_comes_back_to_its_edge_without_metrics() -> None:
    clock = FakeClock()
    controller = limiter(clock)  # 20 tok/s per stream up to 12 streams, then flat: a server that queues
    changes = Server(lambda c: 20.0 * min(c, 12)).drive(controller, clock, 3 * 3600)
    assert steps(changes)[:3] == [(8, 128), (128, 32), (32, 16)]
    assert changes[1].reason == (
        "throughput rose only 50% (160 -> 240 tok/s) from 8 to 128 (16.00x the concurrency): trying 32"
    )  # gained, only not enough: the knee lies between, and the next probe halves the bracket
    assert controller.best_level == 12 and controller.at_knee
    assert {change.new for change in changes[-6:]} <= {11, 12, 13}  # at the edge, a step around it at most


def test_backs_off_to_what_the_server_runs_when_a_step_floods_its_queue() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=16)

    def queue(concurrency: int) -> ServerLoad:  # --max-num-seqs 8
        return ServerLoad(min(concurrency, 8), max(concurrency - 8, 0), 0.05, 0)

    changes = Server(lambda c: 19.0 * min(c, 8), queue).drive(controller, clock, 60)
    # Sent together from nothing: the first replies tell a queue from a server admitting them a few a
    # step (test_signals); then half of what was sent still waits: a queue, at once.
    assert steps(changes) == [(16, 8)]
    assert changes[0].reason == "the server queues at 16: 8 waiting, 8 running (mean of 8 scrapes): down to 8"
    assert controller.ceiling == 8


def test_a_short_queue_is_no_reason_to_back_off() -> None:
    """A server at its KV wall runs what fits and queues one or two: that keeps it busy, not overloaded."""
    clock = FakeClock()
    controller = limiter(clock, initial=64)

    def at_the_wall(concurrency: int) -> ServerLoad:
        return ServerLoad(min(concurrency, 62), max(concurrency - 62, 0), 0.99, 0)

    changes = Server(lambda c: 30.0 * min(c, 62), at_the_wall).drive(controller, clock, 30)
    assert steps(changes)[0] == (64, 67)  # 2 waiting beside 62 running: no back-off, a probe up
    assert changes[0].reason == "64 gives 1860 tok/s (KV cache 99% used: full at ~63): trying 67"
    assert changes[1].reason.startswith("the server queues at 67: 5 waiting, 62 running")


def test_queues_that_last_back_off_to_what_the_server_runs_and_try_it_against_the_best() -> None:
    clock = FakeClock()
    controller = AdaptiveLimit(
        maximum=512, timeout_s=900.0, known_knee=KneeMemory(40, bracketed=False), clock=clock
    )

    def queue(concurrency: int) -> ServerLoad:  # runs 70, queues the rest: a KV cache full at 74
        running = min(concurrency, 70)
        return ServerLoad(running, max(concurrency - 70, 0), running / 74, 0)

    changes = Server(lambda c: 6.0 * min(c, 70), queue).drive(controller, clock, 900)
    assert steps(changes)[:3] == [(40, 67), (67, 74), (74, 70)]  # to the KV wall, then to a full cache
    assert changes[2].reason == (
        "the server queues at 74: 4 waiting, 70 running (mean of 3 scrapes): trying 70, what it runs"
    )
    assert controller.best_level == 70 and controller.at_knee


def test_steps_up_aim_below_the_kv_wall_first_then_at_it() -> None:
    """With room in the KV cache a step up goes no further than the wall (90% of the cache at the KV each
    running request holds), and first to a descent below it: a peak of throughput may lie below."""
    clock = FakeClock()
    controller = limiter(clock, initial=48)

    def kv(concurrency: int) -> ServerLoad:  # each request holds 0.25% of the cache: full at 400
        return ServerLoad(concurrency, 0, concurrency / 400, 0)

    changes = Server(lambda c: 30.0 * min(c, 400), kv).drive(controller, clock, 600)
    assert steps(changes)[:4] == [(48, 192), (192, 271), (271, 360), (360, 400)]
    assert changes[0].reason == (
        "the server runs all 48 with nothing waiting, KV cache 12% used (room for ~360): jumping to 192"
    )
    assert changes[1].reason == "192 gives 5760 tok/s: trying 271"  # 360 / 1.41, where the opening aimed
    assert changes[2].reason.endswith("(KV cache 68% used by 271 requests: room for ~360): trying 360")
    assert changes[3].reason.endswith("(KV cache 90% used: full at ~400): trying 400")
    assert controller.best_level == 400


def test_the_opening_jumps_on_the_servers_word_without_waiting_for_a_window() -> None:
    """Each scrape that shows the server running all that was sent, nothing waiting and its KV cache far
    from full, jumps: 8 to 255 within 15 s, where windows of replies that take a minute would need
    several minutes."""
    clock = FakeClock()
    controller = limiter(clock)

    def kv(concurrency: int) -> ServerLoad:
        return ServerLoad(concurrency, 0, concurrency / 400, 0)

    slow = Server(lambda c: 6.0 * min(c, 300), kv)  # a reply at c=8 takes 67 s
    changes = slow.drive(controller, clock, 16)
    assert steps(changes) == [(8, 32), (32, 128), (128, 255)]
    assert [change.reason for change in changes] == [
        "the server runs all 8 with nothing waiting, KV cache 2% used (room for ~360): jumping to 32",
        "the server runs all 32 with nothing waiting, KV cache 8% used (room for ~360): jumping to 128",
        "the server runs all 128 with nothing waiting, KV cache 32% used (room for ~360): jumping to 255",
    ]
    assert controller.learned is None  # nothing measured yet


def test_kv_cache_near_full_steps_to_where_it_would_be_full() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=64)
    changes = Server(lambda c: 30.0 * c, lambda c: ServerLoad(c, 0, 0.95, 0)).drive(controller, clock, 100)
    assert steps(changes)[0] == (64, 68)
    assert changes[0].reason == "64 gives 1920 tok/s (KV cache 95% used: full at ~67): trying 68"


def test_backs_off_one_step_when_the_server_thrashes() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=64)
    scrapes = iter(range(0, 100_000, 20))  # 20 more preemptions every 5 s, 3 replies: a thrash

    def thrashing(concurrency: int) -> ServerLoad:
        return ServerLoad(concurrency, 0, 0.99, next(scrapes))

    changes = Server(lambda c: 240.0, thrashing).drive(controller, clock, 200)  # a reply takes 107 s
    assert steps(changes) == [(64, 61)]  # once the transient is over: 3 scrapes after the first reply
    assert changes[0].reason.startswith("the server preempted 80 requests in ")
    assert changes[0].reason.endswith(" replies at 64, KV cache 99% used: down to 61")
    assert controller.ceiling == 61


def test_preemptions_below_one_per_reply_are_the_price_of_a_full_cache() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=64)
    scrapes = iter(range(0, 100_000, 2))  # 2 more every 5 s, with 24 replies: a full cache, no thrash

    def full(concurrency: int) -> ServerLoad:
        return ServerLoad(concurrency, 0, 0.99, next(scrapes))

    changes = Server(lambda c: 30.0 * c, full).drive(controller, clock, 100)
    assert changes and all("preempted" not in change.reason for change in changes)


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
    for _ in range(20):  # a hung server: nothing but timeouts
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
    assert steps(changes)[:2] == [(8, 128), (128, 8)]
    assert changes[1].reason == (
        "p90 latency 512 s at 128 is above 50% of the 900 s timeout: back to 8, the best level"
    )
    assert steps(changes)[2:5] == [(8, 32), (32, 64), (64, 30)]  # halving the bracket: nothing known in it
    assert changes[4].reason == "throughput fell 90% (960 -> 100 tok/s) from 32 to 64: trying 30"
    assert controller.best_level == 32 and controller.at_knee
    # Later probes above the cliff last one window each and always come back.
    assert all(change.new == 32 for change in changes[5:] if change.old > 32)


def test_replies_to_requests_sent_before_a_change_do_not_count() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=8)
    for _ in range(100):  # requests sent before the limiter existed: the transient
        clock.now += 1.0
        controller.on_finished(latency_s=200.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=True)
        assert controller.update() is None
    for _ in range(8):  # the first replies to new requests: 8 and a quarter of their latency
        clock.now += 1.0
        controller.on_finished(latency_s=10.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=True)
    change = controller.update()
    assert change is not None and change.reason == "8 gives 320 tok/s: trying 128"


def test_after_a_large_step_only_requests_sent_after_its_first_reply_count() -> None:
    """The requests sent with a large step run in lockstep: they tell little of the level's steady state."""
    clock = FakeClock()
    controller = limiter(clock, initial=8)
    clock.now += 10.0
    for _ in range(8):
        clock.now += 1.0
        controller.on_finished(latency_s=10.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=True)
    assert controller.update() == LimitChange(8, 128, "8 gives 320 tok/s: trying 128")
    clock.now += 20.0
    for _ in range(300):  # sent with the step (or before its first reply): ten times the tokens, ignored
        clock.now += 0.01
        controller.on_finished(latency_s=20.0, output_tokens=TOKENS * 10, prompt_tokens=PROMPT, ok=True)
        assert controller.update() is None
    clock.now += 20.0
    for _ in range(128):  # sent after the first reply: these count, and a turnover of them decides
        clock.now += 0.16
        controller.on_finished(latency_s=20.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=True)
    change = controller.update()
    assert change is not None and change.reason.startswith("throughput rose 700% (320 -> 2560 tok/s)")


def test_failed_replies_deliver_nothing() -> None:
    clock = FakeClock()
    controller = limiter(clock, initial=8)
    clock.now += 10.0
    for number in range(200):  # one in four fails
        clock.now += 1.0
        controller.on_finished(latency_s=10.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=number % 4 != 0)
    change = controller.update()
    assert change is not None and change.reason == "8 gives 240 tok/s: trying 128"  # 320 with no failures


def test_follows_a_server_that_gets_faster() -> None:
    clock = FakeClock()
    controller = limiter(clock)
    capacity = {"streams": 16}
    server = Server(lambda c: 25.0 * min(c, capacity["streams"]))
    server.drive(controller, clock, 3 * 3600)
    assert controller.best_level == 16 and controller.at_knee
    capacity["streams"] = 64  # a neighbour left, or the server was upgraded
    changes = server.drive(controller, clock, 6 * 3600)
    probes = [change for change in changes if "re-probing" in change.reason]
    assert probes and probes[0].reason == "16 gives 400 tok/s: re-probing 15, a step from the knee at 16"
    assert steps(changes)[2:7] == [(16, 17), (17, 19), (19, 23), (23, 32), (32, 60)]
    assert controller.best_level == 64  # the new edge


def test_re_probes_after_some_latencies_held_not_after_some_windows() -> None:
    """At the knee a window is short, but a re-probe costs the same: one comes every ``hold_latencies``."""
    clock = FakeClock()
    controller = AdaptiveLimit(
        maximum=512,
        timeout_s=900.0,
        known_knee=KneeMemory(64, bracketed=True, worse_below=61, worse_above=67),
        clock=clock,
    )
    first = Server(lambda c: 30.0 * c if c <= 64 else 1920.0).drive(controller, clock, 4 * 13.4)
    assert steps(first) == [(64, 61)]
    changes = first + Server(lambda c: 30.0 * c if c <= 64 else 1920.0).drive(controller, clock, 3600)
    latency = 64 * TOKENS / 1920.0  # 13 s
    times = [index for index, change in enumerate(changes) if "re-probing" in change.reason]
    # An earlier run's knee is looked at again within a few latencies, a step below first: above a knee
    # may be a cliff, and a knee found a step too high would cost the whole run.
    assert changes and changes[0].reason == "64 gives 1920 tok/s: re-probing 61, a step from the knee at 64"
    assert 3600 / latency / 10 - 4 <= len(times) <= 3600 / latency / 10 + 1  # one per 10 latencies


def test_a_best_level_measured_lucky_hands_over_to_the_probe_that_beat_it_since() -> None:
    knee = KneeSearch.starting(50, DEFAULT_TUNING, None)
    knee.measured_best(1100.0, 0.001, DEFAULT_TUNING)  # 10% above what 50 gives
    knee.judge(60, 1150.0, 0.001, DEFAULT_TUNING)  # +4.5% for +20%: not enough against the lucky value
    assert (knee.best, knee.hi) == (50, 60)
    words = knee.measured_best(1000.0, 0.001, DEFAULT_TUNING)  # measured again: 60 did better
    assert words == "50 gives 1000 tok/s; 60 did better when probed: the best level now"
    assert (knee.lo, knee.best, knee.hi) == (50, 60, None)


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


def test_a_run_leaves_the_knee_as_last_bracketed_while_it_re_probes() -> None:
    clock = FakeClock()
    controller = AdaptiveLimit(
        maximum=512, timeout_s=900.0, known_knee=KneeMemory(64, bracketed=True, worse_below=61), clock=clock
    )
    server = Server(lambda c: 30.0 * c if c <= 64 else 1920.0)
    changes: list[LimitChange] = []
    while not changes or "re-probing" not in changes[-1].reason:
        changes += server.drive(controller, clock, 1.0)
    assert controller.limit != 64  # one bound forgotten while the probe lasts
    learned = controller.learned
    assert learned is not None and learned.tokens_per_s == pytest.approx(1920.0)  # for a next run to compare
    assert dataclasses.replace(learned, tokens_per_s=None) == KneeMemory(
        64, True, worse_below=61, worse_above=67
    )


def test_the_opening_jumps_further_when_replies_leave_room_under_the_timeout() -> None:
    """Replies of 2 s at 8 in flight: 32 times as many would still take a fraction of the 900 s timeout
    even if the server queued them all, so the first scrape takes the limit to a descent below the top."""
    clock = FakeClock()
    controller = limiter(clock)
    clock.now += 2.0
    for _ in range(4):  # too few for a window
        clock.now += 0.25
        controller.on_finished(latency_s=2.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=True)
    controller.on_server_load(ServerLoad(8, 0, 8 / 400, 0))
    change = controller.update()
    assert change == LimitChange(
        8,
        255,
        "the server runs all 8 with nothing waiting, KV cache 2% used (room for ~360): jumping to 255",
    )


def test_a_window_the_client_could_not_keep_full_decides_nothing() -> None:
    """At a run's tail (or while its reader stalls) fewer requests are in flight than the limit: the
    replies measure the client's supply, not the level, so no window there is judged."""
    clock = FakeClock()
    controller = limiter(clock, initial=64)
    clock.now += 10.0
    for in_flight in range(64, 0, -1):  # the last records: one fewer in flight with every reply
        clock.now += 0.5
        controller.on_finished(latency_s=10.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=True)
        assert controller.update(in_flight=in_flight) is None
    assert controller.limit == 64 and controller.learned is None


# A first run (no knee stored, started where this job's requests fit) and the next one, each about 30
# reply latencies at the best level, against the best of a fixed sweep, on both server models: the
# simulator's engine and the second one written apart from it (pipeline/bench/step_server.py). The job's
# requests: a 1,973-token prompt with a 1,000-token fixed part, answers of ~327 tokens of max_tokens 2048.
JOB = Workload(prompt_tokens=1973, output_tokens=327)
FIRST_RUNS = [
    # gpt-oss-120b whose KV cache holds 64 of them under --max-num-seqs 512: it collapses past 64
    pytest.param(("gpt-oss-120b", 64 * 2300, 512), 1850.0, (48, 64, 96), id="kv64"),
    # a dense 49B whose KV cache holds ~217 of them: past that it collapses
    pytest.param(("nemotron-super-49b", None, None), 3600.0, (192, 256, 320), id="49b"),
]


@pytest.mark.parametrize("model", SERVER_MODELS)
@pytest.mark.parametrize(("server", "duration_s", "levels"), FIRST_RUNS)
def test_a_first_run_reaches_092_of_the_best_fixed_level_and_the_next_097(
    model: str, server: tuple[str, int | None, int | None], duration_s: float, levels: tuple[int, ...]
) -> None:
    profile, kv_tokens, max_num_seqs = server
    scenario = Scenario(
        profile,
        duration_s,
        kv_cache_tokens=kv_tokens,
        max_num_seqs=max_num_seqs,
        workload=JOB,
        fit_start=True,
        server=model,
    )
    best = max(run_load(scenario, level).throughput() for level in levels)
    first = run_load(scenario)
    assert first.throughput() >= 0.92 * best, (first.throughput(), best)
    second = run_load(dataclasses.replace(scenario, known_knee=first.learned))
    assert second.throughput() >= 0.97 * best, (second.throughput(), best)


@pytest.mark.parametrize("model", SERVER_MODELS)
def test_a_knee_found_while_the_client_was_the_bottleneck_is_not_left_for_the_next_run(model: str) -> None:
    """A client that needs 2 s of its one core per reply handles half the replies the server gives at
    its knee: its timers fire late and its core is busy; the run leaves no knee, and says why."""
    scenario = Scenario(
        "gpt-oss-120b",
        1850,
        kv_cache_tokens=64 * 2300,
        max_num_seqs=512,
        workload=JOB,
        fit_start=True,
        server=model,
    )
    assert run_load(scenario).learned is not None  # with CPU to spare
    starved = run_load(dataclasses.replace(scenario, client_cpu_s=2.0))
    assert starved.learned is None and starved.client_bound is not None
    assert "event-loop lag" in starved.client_bound.words


def test_a_knee_slower_than_the_run_that_stored_it_is_searched_again() -> None:
    """The knee an earlier run stored at 64 delivered 2,880 tok/s there; now 64 gives 1,920 (another
    load on the server, a slower setting): the search looks around it again instead of holding."""
    clock = FakeClock()
    stored = KneeMemory(64, bracketed=True, worse_below=61, worse_above=67, tokens_per_s=2880.0)
    controller = AdaptiveLimit(maximum=512, timeout_s=900.0, known_knee=stored, clock=clock)
    changes = Server(lambda c: 30.0 * min(c, 80)).drive(controller, clock, 300)
    assert changes[0].reason.startswith(
        "64, the knee an earlier run stored, gives 1920 tok/s where it gave 2880: searching again"
    )
    assert controller.limit > 67  # past the bound the earlier run had found
    assert controller.learned is not None and controller.learned.tokens_per_s is not None


def test_a_knee_as_fast_as_the_run_that_stored_it_holds() -> None:
    clock = FakeClock()
    stored = KneeMemory(64, bracketed=True, worse_below=61, worse_above=67, tokens_per_s=1920.0)
    controller = AdaptiveLimit(maximum=512, timeout_s=900.0, known_knee=stored, clock=clock)
    changes = Server(lambda c: 30.0 * min(c, 64)).drive(controller, clock, 60)
    assert changes and "searching again" not in changes[0].reason


def test_a_stored_knee_keeps_what_it_delivered() -> None:
    memory = KneeMemory(64, bracketed=True, worse_below=61, tokens_per_s=2880.04)
    assert memory.as_json() == {"level": 64, "bracketed": True, "worse_below": 61, "tokens_per_s": 2880.0}
    assert KneeMemory.from_json(memory.as_json()) == KneeMemory(64, True, 61, None, 2880.0)
    assert KneeMemory.from_json({"level": 64, "bracketed": True, "tokens_per_s": "fast"}) == KneeMemory(
        64, True
    )


def test_a_client_too_starved_to_keep_its_limit_full_is_said_to_be_the_bottleneck() -> None:
    """On a loaded machine the client could not keep 64 in flight: its supply, not the server, set the
    replies, and its timers fired late; nothing is judged and nothing is left for the next run."""
    clock = FakeClock()
    controller = limiter(clock, initial=64)
    clock.now += 10.0
    for _ in range(200):
        clock.now += 0.5
        controller.on_finished(latency_s=10.0, output_tokens=TOKENS, prompt_tokens=PROMPT, ok=True)
        controller.on_client_load(ClientLoad(lag_s=0.2, cpu_share=0.4))
        assert controller.update(in_flight=40) is None
    bound = controller.client_bound
    assert controller.learned is None and bound is not None and bound.lag_s == pytest.approx(0.2)
