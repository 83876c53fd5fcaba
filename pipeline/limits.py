"""`concurrency: auto`: one adaptive concurrency limit per endpoint, found and tracked from the delivered
output tokens/s and, when the server has them, vLLM's own queue, KV-cache and preemption numbers.

Pure logic, the clock passed in. The endpoint calls ``on_finished`` for every reply, ``on_timeout`` for
every client timeout, ``on_server_load`` at each ``/metrics`` scrape and ``update`` every second or so;
``update`` decides at most once per measurement window and returns the change with its reason.

Why throughput, not latency: vLLM never refuses work (no 429). Past its knee more concurrency only
queues, overflows the KV cache or slows every step, while long before it latency already rises with
the batch (gpt-oss-120b: ~12 s at c=1, ~120 s at c=256 for 25x the throughput), so Vegas/Gradient2's
no-load over current latency stops far too early. The delivery rate against the number in flight (as
in BBR) finds the knee. A window measures it by Little's law, ``in flight x tokens / latency``, exact to
~0.1%; tokens per second of a window depend on where its edges cut the replies (each delivers at its
end): ~0.4 sqrt(limit) / replies, 20% for a first window at c=8 whose requests all started together.

A window starts at the first reply to a request sent after the last change (earlier ones belong to the
old limit: the transient) and lasts ``window_replies`` x limit replies, ``min_window_s``, and until the
standard error of its rate is below what its comparison needs (``precision`` for a small step, 5% for a
doubling, which must gain 23%): ~8 minutes at c=256 with 2-minute replies, ~1 minute at c=8.

The search, one decision per window:

1. Ramp: from ``initial`` (8), double while each step pays well (elasticity, the relative throughput
   gain per relative concurrency step, >= ``ramp_elasticity``); a step that pays less halves the next.
   With ``known_knee`` (an earlier run's), start there in small steps instead.
2. Bracket: an increase pays when throughput rises by more than ``noise`` and by ``min_elasticity`` of
   the step (+3% for +10%); a decrease pays when it costs under half that (a plateau) or gains (past
   the peak). A step that does not pay bounds the knee and sends the limit back to the best level (a
   collapse lasts one window); the search goes on in ``min_step`` steps that double while they pay,
   never past a bracket's middle, until the nearest worse levels on both sides are a step away. The
   best level is measured again when older than two probes or less precise than a comparison needs.
3. Hold: every ``hold_windows`` windows, forget one side's bound (up, then down) and step once, so a
   server that got faster or slower is followed; a shift of ``shift`` at the held level restarts it all.

Server signals decide as soon as ``min_scrapes`` scrapes show them (a doubling into a collapse costs
seconds); the first two back off and set a ceiling for ``ceiling_windows`` decisions:

* ``waiting > 0`` in ``waiting_share`` of the scrapes: the limit exceeds what the server runs (its
  ``--max-num-seqs``, or what its KV cache admits); down by the mean number waiting.
* preemptions above ``preemption_rate`` per reply, once the transient is over: the KV cache overflows;
  down one ``min_step``.
* KV use >= ``kv_high``: steps up are ``min_step`` only, no back-off by itself: when memory is the limit
  throughput peaks with the cache full (nemotron-super-49b with 150,000 KV tokens: 99% of its best at 86
  streams and 97% KV; 89% at 76 streams and KV < 90%). Preemptions and the queue say when it is too full.

p90 latency above ``latency_share`` of the timeout (a timeout is a reply that took all of it) backs off
in proportion, to 0.8 of that share. Without ``/metrics`` (``ServerLoad`` fields None) the search and the
latency guard work alone. The limit stays in [minimum, maximum].
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_INITIAL = 8


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """One ``/metrics`` scrape; a field is None when the server does not report it."""

    running: float | None  # vllm:num_requests_running
    waiting: float | None  # vllm:num_requests_waiting
    kv_usage: float | None  # vllm:kv_cache_usage_perc, 0..1 (older vLLM: vllm:gpu_cache_usage_perc)
    preemptions_total: float | None  # vllm:num_preemptions_total, a counter


@dataclass(frozen=True, slots=True)
class LimitChange:
    old: int
    new: int
    reason: str  # plain words, for the log


@dataclass(frozen=True, slots=True)
class Tuning:
    """The controller's knobs; the defaults are what the benchmark and the tests ran with."""

    growth: float = 2.0  # the ramp's factor per window while steps pay well
    min_step: float = 0.04  # the smallest relative step: the precision of the knee
    min_elasticity: float = 0.3  # an increase must return >= 0.3% throughput per 1% of concurrency
    ramp_elasticity: float = 0.35  # a step that returns this much is followed by a twice larger one
    noise: float = 0.01  # relative throughput changes below this are noise
    window_replies: float = 2.0  # a window lasts at least this many times the limit in replies,
    min_window_s: float = 15.0  # at least this long,
    precision: float = 0.01  # and until its rate's relative standard error is below this
    min_scrapes: int = 3  # /metrics scrapes before a server signal counts
    waiting_share: float = 0.5  # share of scrapes with waiting > 0 that means "sustained"
    kv_high: float = 0.9  # mean KV-cache use above which steps up are min_step only
    preemption_rate: float = 0.02  # preemptions per reply above which the limit backs off
    latency_share: float = 0.5  # p90 latency above this share of the timeout backs off
    hold_windows: int = 8  # windows held at the knee between two re-probes
    ceiling_windows: int = 12  # decisions a ceiling from a server signal lasts
    shift: float = 0.25  # throughput change at the held level that restarts the search


DEFAULT_TUNING = Tuning()


@dataclass(slots=True)
class _Window:
    """What one measurement window saw: replies after the transient, in-flight samples, scrapes."""

    limit: int
    changed_at: float
    grew: bool  # after an increase, server signals count at once (an overload shows immediately)
    precision: float  # the relative standard error its rate must reach
    started_at: float | None = None
    replies: list[tuple[float, float]] = field(default_factory=list)  # (tokens delivered, latency s)
    in_flight: list[int] = field(default_factory=list)
    scrapes: list[ServerLoad] = field(default_factory=list)
    settled_scrape: int = 0  # the first scrape after the transient

    def reply(self, now: float, latency_s: float, tokens: int, ok: bool) -> None:
        if now - latency_s < self.changed_at - 1e-9:
            return  # sent under the old limit: its latency tells about that one
        if self.started_at is None:
            self.started_at = now  # the first reply to a request sent under this limit
            self.settled_scrape = len(self.scrapes)
            return
        self.replies.append((tokens if ok else 0, latency_s))

    def sample(self, in_flight: int) -> None:
        if self.started_at is not None:
            self.in_flight.append(in_flight)

    def scrape(self, load: ServerLoad) -> None:
        if self.started_at is not None or self.grew:  # not while the old, higher limit drains
            self.scrapes.append(load)

    def complete(self, now: float, tuning: Tuning) -> bool:
        if self.started_at is None or now - self.started_at < tuning.min_window_s:
            return False
        return len(self.replies) >= tuning.window_replies * self.limit and self.error <= self.precision

    @property
    def throughput(self) -> float:
        """Little's law: requests in flight x tokens per second of latency."""
        latency = sum(seconds for _, seconds in self.replies)
        in_flight = sum(self.in_flight) / len(self.in_flight) if self.in_flight else self.limit
        return in_flight * sum(tokens for tokens, _ in self.replies) / latency if latency > 0 else 0.0

    @property
    def error(self) -> float:
        """The relative standard error of tokens per second of latency (a ratio estimator)."""
        count, tokens = len(self.replies), sum(tokens for tokens, _ in self.replies)
        if count < 2 or tokens <= 0:
            return math.inf if count < 2 else 0.0  # nothing delivered is exactly nothing
        rate = tokens / sum(seconds for _, seconds in self.replies)
        residuals = sum((delivered - rate * seconds) ** 2 for delivered, seconds in self.replies)
        return math.sqrt(residuals / (count - 1) / count) / (tokens / count)

    @property
    def p90_latency(self) -> float:
        ordered = sorted(seconds for _, seconds in self.replies)
        return ordered[int(0.9 * (len(ordered) - 1))] if ordered else 0.0

    @staticmethod
    def mean(values: list[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return sum(known) / len(known) if known else None


def _change_words(base: float, throughput: float) -> str:
    gain = throughput / base - 1 if base > 0 else 0.0
    numbers = f"({base:.0f} -> {throughput:.0f} tok/s)"
    if abs(gain) < 0.005:
        return f"throughput unchanged {numbers}"
    return f"throughput {'rose' if gain > 0 else 'fell'} {abs(gain):.0%} {numbers}"


@dataclass(slots=True)
class _Knee:
    """The search: the best level, its last throughput, and the nearest worse levels around it."""

    best: int
    smallest: float  # log of the smallest step, 1 + min_step
    largest: float  # log of the largest step, growth
    best_tp: float | None = None
    best_error: float = math.inf  # the relative standard error of best_tp
    lo: int | None = None  # the nearest level below ``best`` known to do worse
    hi: int | None = None  # the nearest level above ``best`` known to do worse
    reach_up: float = 0.0  # log of the next step up
    reach_down: float = 0.0
    probes_since_best: int = 0
    held: int = 0
    heading_up: bool = True  # the side to try first: where the last paid step went
    reprobe_up: bool = True

    def measured_best(self, throughput: float, error: float, shift: float) -> str:
        """A window at the best level: refresh its throughput; a large shift restarts the search."""
        previous, self.best_tp, self.best_error, self.probes_since_best = self.best_tp, throughput, error, 0
        if previous is not None and previous > 0 and abs(throughput / previous - 1) > shift:
            self.lo = self.hi = None
            self.reach_up, self.reach_down, self.held = self.smallest, self.smallest, 0
            return (
                f"{_change_words(previous, throughput)} at {self.best}: the server changed, searching again"
            )
        return f"{self.best} gives {throughput:.0f} tok/s"

    def judge(self, level: int, throughput: float, error: float, tuning: Tuning) -> str:
        """A window at a probe: move the best level there if it paid, else bound the knee by it."""
        base, old, up = self.best_tp or 0.0, self.best, level > self.best
        if base > 0 < throughput:  # relative throughput change per relative concurrency change
            elasticity = math.log(throughput / base) / math.log(level / old)
        else:  # from or to nothing: as steep as can be
            elasticity = (1.0 if throughput > base else -1.0) * (math.inf if up else -math.inf)
        if up:  # the extra concurrency must return enough throughput
            paid = throughput >= base * (1 + tuning.noise) and elasticity >= tuning.min_elasticity
        else:  # giving concurrency back must cost next to nothing (a plateau) or gain (past the peak)
            paid = throughput > 0 and elasticity < tuning.min_elasticity / 2
        words = f"{_change_words(base, throughput)} from {old} to {level}"
        if not paid:
            if up and throughput > base * 0.995 > 0:
                words = words.replace("rose", "rose only", 1) + f" ({level / old:.2f}x the concurrency)"
            self.failed(level)
            return words
        if up:  # a step that paid well is followed by one twice as large, else by one half as large
            well = elasticity >= tuning.ramp_elasticity
            self.lo, self.reach_up = old, min(self.largest, 2 * self.reach_up) if well else self.reach_up / 2
            self.reach_up = max(self.smallest, self.reach_up)
        else:  # down a plateau or a slope that pays: faster
            self.hi, self.reach_down = old, min(self.largest, 2 * self.reach_down)
            words += " (a plateau: as much for less)" if throughput < base else ""
        self.best, self.best_tp, self.best_error, self.heading_up = level, throughput, error, up
        self.probes_since_best = self.held = 0
        return words

    def failed(self, level: int) -> None:
        """A probe did worse: it bounds the knee, which is near: small steps, the other side first."""
        self.hi, self.lo = (level, self.lo) if level > self.best else (self.hi, level)
        self.heading_up = level < self.best
        self.reach_up = self.reach_down = self.smallest
        self.probes_since_best += 1
        self.held = 0

    def next_probe(self, cap: int, minimum: int) -> int | None:
        """The next level to try, on the heading side first; None when both nearest worse levels are a
        step away."""
        sides = (self._above(cap), self._below(minimum))
        first, second = sides if self.heading_up else sides[::-1]
        return first if first is not None else second

    def _above(self, cap: int) -> int | None:
        up = max(self.best + 1, math.ceil(self.best * math.exp(self.smallest)))
        bound = min(cap + 1, self.hi if self.hi is not None else cap + 1)
        if bound <= up:
            return None
        level = math.ceil(self.best * math.exp(self.reach_up))
        if self.hi is not None:  # never past the middle of the bracket
            level = min(level, round(math.sqrt(self.best * self.hi)))
        return max(up, min(level, bound - 1))

    def _below(self, minimum: int) -> int | None:
        down = min(self.best - 1, math.floor(self.best / math.exp(self.smallest)))
        floor = self.lo if self.lo is not None else minimum - 1
        if floor >= down:
            return None
        level = math.floor(self.best / math.exp(self.reach_down))
        if self.lo is not None:
            level = max(level, round(math.sqrt(self.lo * self.best)))
        return min(down, max(level, floor + 1))

    def reprobe(self, cap: int, minimum: int, hold_windows: int) -> int | None:
        """At the knee, every ``hold_windows`` windows: forget one side's bound (alternately) and step."""
        self.held += 1
        if self.held < hold_windows:
            return None
        self.held = 0
        sides = (True, False) if self.reprobe_up else (False, True)
        self.reprobe_up = not self.reprobe_up
        for up in sides:
            saved = self.lo, self.hi
            self.hi, self.lo = (None, self.lo) if up else (self.hi, None)
            self.reach_up = self.reach_down = self.smallest
            level = self.next_probe(cap, minimum)
            if level is not None:
                return level
            self.lo, self.hi = saved
        return None


class AdaptiveLimit:
    """The concurrency limit of one endpoint; the module docstring says how it moves."""

    def __init__(
        self,
        *,
        maximum: int,
        timeout_s: float,
        minimum: int = 1,
        initial: int | None = None,
        known_knee: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        tuning: Tuning = DEFAULT_TUNING,
    ) -> None:
        """``known_knee``: the knee an earlier run found on this server; the search starts there in
        small steps instead of ramping from ``initial`` (at c=256 the ramp takes ~45 minutes)."""
        if not 1 <= minimum <= maximum:
            raise ValueError(f"concurrency limits need 1 <= minimum <= maximum, not {minimum} and {maximum}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.minimum, self.maximum, self.timeout_s = minimum, maximum, timeout_s
        self._tuning, self._clock = tuning, clock
        start = known_knee or initial or DEFAULT_INITIAL
        self._limit = min(maximum, max(minimum, start))
        smallest, largest = math.log1p(tuning.min_step), math.log(tuning.growth)
        reach_up = largest if known_knee is None else smallest
        self._knee = _Knee(self._limit, smallest, largest, reach_up=reach_up, reach_down=smallest)
        self._ceiling: int | None = None
        self._ceiling_left = 0
        self._at_knee = False
        first = self._precision_for(reach_up)  # what the first step needs: a ramp's, or a small one
        self._window = _Window(self._limit, clock(), grew=True, precision=first)

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def best_level(self) -> int:
        """The level with the best throughput measured so far: the knee, once ``at_knee``."""
        return self._knee.best

    @property
    def ceiling(self) -> int | None:
        """The level a server signal forbids exceeding for now, if any."""
        return self._ceiling

    @property
    def at_knee(self) -> bool:
        """The knee is bracketed: the limit holds there, re-probing one small step now and then."""
        return self._at_knee

    def on_finished(self, *, latency_s: float, output_tokens: int, ok: bool) -> None:
        """Every reply; ``ok`` False (an error status, a reset) delivered no tokens."""
        self._window.reply(self._clock(), latency_s, output_tokens, ok)

    def on_timeout(self) -> None:
        """A request the client gave up on: a reply that took the whole timeout and delivered nothing."""
        self._window.reply(self._clock(), self.timeout_s, 0, ok=False)

    def on_server_load(self, load: ServerLoad) -> None:
        self._window.scrape(load)

    def update(self, *, in_flight: int | None = None) -> LimitChange | None:
        """Decide, at most once per window (a server signal may decide sooner); None: no change.

        ``in_flight``: requests in flight now (the limiter's borrowed tokens); None means the limit is
        full, as it is while records are pending."""
        now, window = self._clock(), self._window
        window.sample(self._limit if in_flight is None else in_flight)
        signal = self._server_signal(window)
        if signal is None:
            if not window.complete(now, self._tuning):
                return None
            signal = self._latency_signal(window)
        self._ceiling_left -= 1
        if self._ceiling_left <= 0:
            self._ceiling = None
        return self._back_off(now, *signal) if signal is not None else self._decide(now, window)

    def _server_signal(self, window: _Window) -> tuple[int, str] | None:
        tuning, limit, scrapes = self._tuning, self._limit, window.scrapes
        if len(scrapes) < tuning.min_scrapes:
            return None
        waiting = window.mean([load.waiting for load in scrapes])
        queued = sum(1 for load in scrapes if (load.waiting or 0) > 0)
        if waiting is not None and queued >= tuning.waiting_share * len(scrapes):
            running = window.mean([load.running for load in scrapes])
            runs = f", {running:.0f} running" if running is not None else ""
            return limit - max(1, round(waiting)), (
                f"the server queues at {limit}: {waiting:.0f} waiting{runs} (mean of {len(scrapes)} scrapes)"
            )
        # Preemptions count after the transient: a step up admits its requests at once, and a few are
        # preempted until the batch settles, at a level that runs without any.
        settled = scrapes[window.settled_scrape :] if window.started_at is not None else []
        counter = [load.preemptions_total for load in settled if load.preemptions_total is not None]
        preempted = counter[-1] - counter[0] if counter else 0.0
        expected = max(len(window.replies), tuning.window_replies * limit)  # replies in the window
        if preempted >= 3 and preempted > tuning.preemption_rate * expected:
            kv = window.mean([load.kv_usage for load in scrapes])
            full = f", KV cache {kv:.0%} used" if kv is not None else ""
            replies = len(window.replies)
            return limit - max(1, round(limit * tuning.min_step)), (
                f"the server preempted {preempted:.0f} requests in {replies} replies at {limit}{full}"
            )
        return None

    def _latency_signal(self, window: _Window) -> tuple[int, str] | None:
        allowed, p90 = self._tuning.latency_share * self.timeout_s, window.p90_latency
        if p90 <= allowed:
            return None
        timeouts = sum(seconds >= self.timeout_s for _, seconds in window.replies)
        timed_out = f", {timeouts} of {len(window.replies)} replies timed out" if timeouts else ""
        return math.floor(self._limit * 0.8 * allowed / p90), (
            f"p90 latency {p90:.0f} s at {self._limit} is above {self._tuning.latency_share:.0%} "
            f"of the {self.timeout_s:.0f} s timeout{timed_out}"
        )

    def _back_off(self, now: float, level: int, reason: str) -> LimitChange | None:
        """A server or latency signal: a probe there failed, and nothing above ``level`` for a while."""
        level = max(self.minimum, min(level, self._limit - 1))
        self._ceiling = level if self._ceiling is None else min(self._ceiling, level)
        self._ceiling_left = self._tuning.ceiling_windows
        knee = self._knee
        if self._limit != knee.best:
            knee.failed(self._limit)
            knee.heading_up = level > knee.best  # the server takes more than the best: look there first
        if level < knee.best:  # the best level itself is too much now
            knee.hi, knee.best, knee.best_tp = knee.best, level, None
            knee.lo = knee.lo if knee.lo is not None and knee.lo < level else None
        knee.held, self._at_knee = 0, False
        action = f"down to {knee.best}" if knee.best == level else f"back to {knee.best}, the best level"
        return self._set(now, knee.best, f"{reason}: {action}")

    def _decide(self, now: float, window: _Window) -> LimitChange | None:
        """A complete window and no signal: judge its throughput and pick the next level."""
        tuning, knee, limit = self._tuning, self._knee, self._limit
        if limit == knee.best:
            words = knee.measured_best(window.throughput, window.error, tuning.shift)
        else:
            words = knee.judge(limit, window.throughput, window.error, tuning)
        kv = window.mean([load.kv_usage for load in window.scrapes])
        if kv is not None and kv >= tuning.kv_high:  # collapse is near: approach it in small steps
            knee.reach_up = knee.smallest
            words += f" (KV cache {kv:.0%} used: small steps up)"
        cap = self.maximum if self._ceiling is None else min(self.maximum, self._ceiling)
        target = knee.next_probe(cap, self.minimum)
        self._at_knee = target is None
        if target is None:
            target = knee.reprobe(cap, self.minimum, tuning.hold_windows) or knee.best
            action = f"re-probing {target}, a step from the knee at {knee.best}"
            action = action if target != knee.best else f"back to {knee.best}, the best level"
            return self._set(now, target, f"{words}: {action}")
        # Compare like with like: a probe only against a recent value of the best, as precise as needed.
        needed = self._precision_for(math.log(target / knee.best))
        stale = knee.probes_since_best >= 2 or knee.best_error > 1.5 * needed
        if stale and limit != knee.best:
            return self._set(now, knee.best, f"{words}: back to {knee.best} to measure it again")
        return self._set(now, knee.best if stale else target, f"{words}: trying {target}")

    def _precision_for(self, log_step: float) -> float:
        """A window judges a step: a doubling must gain 23%, measured to 5%; a 4% step, to 1%."""
        return max(self._tuning.precision, self._tuning.min_elasticity * abs(log_step) / 4)

    def _set(self, now: float, new: int, reason: str) -> LimitChange | None:
        old, self._limit = self._limit, max(self.minimum, min(self.maximum, new))
        precision = self._precision_for(math.log(self._limit / self._knee.best))
        if self._limit == old:  # no transient to wait out
            changed_at, grew = self._window.changed_at, self._window.grew
            self._window = _Window(self._limit, changed_at, grew, precision, started_at=now)
        else:
            self._window = _Window(self._limit, now, self._limit > old, precision)
        return None if self._limit == old else LimitChange(old, self._limit, reason)
