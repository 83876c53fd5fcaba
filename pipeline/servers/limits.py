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

A window (:class:`~pipeline.servers.knee_search.Window`) starts at the first reply to a request sent after the
last change and lasts until its rate is as precise as the comparison at hand needs: ~8 minutes at c=256
with 2-minute replies, ~1 minute at c=8.

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
from dataclasses import dataclass

from pipeline.servers.knee_search import DEFAULT_TUNING, KneeMemory, KneeSearch, ServerLoad, Tuning, Window

DEFAULT_INITIAL = 8


@dataclass(frozen=True, slots=True)
class LimitChange:
    old: int
    new: int
    reason: str  # plain words, for the log


class AdaptiveLimit:
    """The concurrency limit of one endpoint; the module docstring says how it moves."""

    def __init__(
        self,
        *,
        maximum: int,
        timeout_s: float,
        minimum: int = 1,
        initial: int | None = None,
        known_knee: KneeMemory | None = None,
        clock: Callable[[], float] = time.monotonic,
        tuning: Tuning = DEFAULT_TUNING,
    ) -> None:
        """``known_knee``: what an earlier run learned on this server; the search starts at its level (in
        small steps around a bracketed knee, else ramping on within its bounds) instead of ramping from
        ``initial``."""
        if not 1 <= minimum <= maximum:
            raise ValueError(f"concurrency limits need 1 <= minimum <= maximum, not {minimum} and {maximum}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.minimum, self.maximum, self.timeout_s = minimum, maximum, timeout_s
        self._tuning, self._clock = tuning, clock
        start = known_knee.level if known_knee is not None else initial
        self._limit = min(maximum, max(minimum, DEFAULT_INITIAL if start is None else start))
        smallest, largest = math.log1p(tuning.min_step), math.log(tuning.growth)
        self._knee = KneeSearch.starting(self._limit, smallest, largest, known_knee)
        self._ceiling: int | None = None
        self._ceiling_left = 0
        self._at_knee = False
        self._measured = False  # a window was judged, or a server signal moved the limit
        self._load: ServerLoad | None = None  # the latest scrape
        first = self._precision_for(self._knee.reach_up)  # what the first step needs: a ramp's or a small one
        self._window = Window(self._limit, clock(), grew=True, precision=first)

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

    @property
    def learned(self) -> KneeMemory | None:
        """What this run measured, for the next one to start from (None before anything was): the knee
        once bracketed, else the best level so far and the nearest levels that did worse."""
        if not self._measured:
            return None
        knee = self._knee
        return KneeMemory(knee.best, self._at_knee, worse_below=knee.lo, worse_above=knee.hi)

    def on_finished(self, *, latency_s: float, output_tokens: int, ok: bool) -> None:
        """Every reply; ``ok`` False (an error status, a reset) delivered no tokens."""
        self._window.reply(self._clock(), latency_s, output_tokens, ok)

    def on_timeout(self) -> None:
        """A request the client gave up on: a reply that took the whole timeout and delivered nothing."""
        self._window.reply(self._clock(), self.timeout_s, 0, ok=False)

    def on_server_load(self, load: ServerLoad) -> None:
        self._window.scrape(load)
        self._load = load

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

    def _server_signal(self, window: Window) -> tuple[int, str] | None:
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

    def _latency_signal(self, window: Window) -> tuple[int, str] | None:
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
        knee.held, self._at_knee, self._measured = 0, False, True
        action = f"down to {knee.best}" if knee.best == level else f"back to {knee.best}, the best level"
        return self._set(now, knee.best, f"{reason}: {action}")

    def _decide(self, now: float, window: Window) -> LimitChange | None:
        """A complete window and no signal: judge its throughput and pick the next level."""
        tuning, knee, limit = self._tuning, self._knee, self._limit
        if limit == knee.best:
            words = knee.measured_best(window.throughput, window.error, tuning.shift)
        else:
            words = knee.judge(limit, window.throughput, window.error, tuning)
        self._measured = True
        words += self._aim_up(window)
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

    def _aim_up(self, window: Window) -> str:
        """What ``/metrics`` say about the next step up: small ones near a full KV cache; with room (no
        queue, the cache far from full) faster ones while steps pay well, but no further than the KV
        wall, where the cache would be full at the KV each running request uses now."""
        tuning, knee, load = self._tuning, self._knee, self._load
        kv = window.mean([scrape.kv_usage for scrape in window.scrapes])
        if kv is not None and kv >= tuning.kv_high:  # collapse is near: approach it in small steps
            knee.reach_up = knee.smallest
            return f" (KV cache {kv:.0%} used: small steps up)"
        if load is None or not load.running or not load.kv_usage or load.waiting is None or load.waiting > 0:
            return ""
        if knee.reach_up >= knee.largest:
            knee.reach_up = math.log(tuning.sprint)
        wall = tuning.kv_fill * load.running / load.kv_usage
        if math.log(wall / knee.best) >= knee.reach_up:
            return ""
        knee.reach_up = max(knee.smallest, math.log(wall / knee.best))
        return f" (KV cache {load.kv_usage:.0%} used by {load.running:.0f} requests: room for ~{wall:.0f})"

    def _precision_for(self, log_step: float) -> float:
        """A window judges a step: a doubling must gain 23%, measured to 5% (as are larger ones); a 4%
        step, to 1%."""
        tuning = self._tuning
        needed = min(tuning.ramp_precision, tuning.min_elasticity * abs(log_step) / 4)
        return max(tuning.precision, needed)

    def _set(self, now: float, new: int, reason: str) -> LimitChange | None:
        old, self._limit = self._limit, max(self.minimum, min(self.maximum, new))
        precision = self._precision_for(math.log(self._limit / self._knee.best))
        if self._limit == old:  # no transient to wait out
            changed_at, grew = self._window.changed_at, self._window.grew
            self._window = Window(self._limit, changed_at, grew, precision, started_at=now)
        else:
            self._window = Window(self._limit, now, self._limit > old, precision)
        return None if self._limit == old else LimitChange(old, self._limit, reason)
