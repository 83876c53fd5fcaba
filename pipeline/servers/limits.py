"""`concurrency: auto`: one adaptive concurrency limit per endpoint, found and tracked from the delivered
output tokens/s and, when the server has them, vLLM's own queue, KV-cache and preemption numbers.

Pure logic, the clock passed in. The endpoint calls ``on_finished`` for every reply, ``on_timeout`` for
every client timeout, ``on_server_load`` at each ``/metrics`` scrape and ``update`` a few times a second;
``update`` decides at most once per measurement window and returns the change with its reason.

Why throughput, not latency: vLLM never refuses work (no 429). Past its knee more concurrency only
queues, overflows the KV cache or slows every step, while long before it latency already rises with
the batch (gpt-oss-120b: ~12 s at c=1, ~120 s at c=256 for 25x the throughput), so Vegas/Gradient2's
no-load over current latency stops far too early. The delivery rate against the number in flight (as
in BBR) finds the knee. A window measures it by Little's law, ``in flight x tokens / latency``, exact to
~0.1%; tokens per second of a window depend on where its edges cut the replies (each delivers at its
end): ~0.4 sqrt(limit) / replies, 20% for a first window at c=8 whose requests all started together.

A window (:class:`~pipeline.servers.window.Window`) measures one level; the module says how long.

The search (:mod:`~pipeline.servers.knee_search` says how it steps: opening, ramp, bracket, hold) makes
one decision per window.

Server signals decide as soon as ``min_scrapes`` scrapes show them, one when a step up floods the queue
(``flood_share`` of those running wait); they back off and set a ceiling for ``ceiling_windows``
decisions:

* ``waiting`` above ``queue_share`` of those running in ``waiting_share`` of the scrapes: the limit
  exceeds what the server runs (its ``--max-num-seqs``, or what its KV cache admits); the next level is
  what it runs, judged against the best (a short queue is fine: it keeps a full server busy).
* preemptions above ``preemption_rate`` per reply, once the transient is over: a thrash; down one
  ``min_step``. Fewer are the price of a full cache, where throughput peaks when memory is the limit
  (nemotron-super-49b with 150,000 KV tokens: best at 88 streams, the cache full and a few preempted).

p90 latency above ``latency_share`` of the timeout (a timeout is a reply that took all of it) backs off
in proportion, to 0.8 of that share. Without ``/metrics`` (``ServerLoad`` fields None) the search and the
latency guard work alone. The limit stays in [minimum, maximum]. What a run learned (:attr:`learned`)
is the knee as last bracketed, or the best level and the nearest levels that did worse.

With the server's KV cache known (``fit``, :class:`~pipeline.servers.capacity.RequestFit`), a first run
(no ``known_knee``) starts at the number of this job's requests that fit, not with the ramp, and steps
from there in small steps, up first (below the fit a server is not overcommitted; past it, it
collapses); at its first window the fit is counted again at the replies' prompt and answer tokens (the
record's text and the answer as they are), and the limit moves there. The fit also gives the job's share
of a server other jobs use (:mod:`~pipeline.servers.sharing`): a ceiling the limit drops to at once, and
beside other jobs each window is judged by the server's throughput at the server's level.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from pipeline.servers.beside_others import (
    LimitChange as LimitChange,  # re-exported: callers take it from here
)
from pipeline.servers.beside_others import level_alone, share_cut
from pipeline.servers.capacity import RequestFit
from pipeline.servers.client_load import ClientLoad
from pipeline.servers.knee_search import KneeMemory, KneeSearch
from pipeline.servers.sharing import ServerShare, joining_share
from pipeline.servers.signals import Signal, aim_up, latency_signal, preemption_signal, queue_signal, room
from pipeline.servers.window import DEFAULT_TUNING, ServerLoad, Tuning, Window

DEFAULT_INITIAL = 8


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
        fit: RequestFit | None = None,
    ) -> None:
        """``known_knee``: what an earlier run learned on this server; the search starts at its level (in
        small steps around a bracketed knee, else ramping on within its bounds) instead of ramping from
        ``initial``. ``fit``: the job's requests the server's KV cache holds (:meth:`start_at_fit`)."""
        if not 1 <= minimum <= maximum:
            raise ValueError(f"concurrency limits need 1 <= minimum <= maximum, not {minimum} and {maximum}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.minimum, self.maximum, self.timeout_s = minimum, maximum, timeout_s
        self._tuning, self._clock = tuning, clock
        start = known_knee.level if known_knee is not None else initial
        self._limit = min(maximum, max(minimum, DEFAULT_INITIAL if start is None else start))
        self._knee = KneeSearch.starting(self._limit, tuning, known_knee)
        self._ceiling: int | None = None
        self._ceiling_left = 0
        self._at_knee = False
        self._bracket: KneeMemory | None = None  # the knee as last bracketed, kept while re-probing
        self._measured = False  # a window was judged, or a server signal moved the limit
        self._opening = known_knee is None  # jumps on the server's word until a step up did worse
        self._decided_at = self._best_at = clock()  # the last decision; the best level's last window
        self._load: ServerLoad | None = None  # the latest scrape
        first = self._precision_for(self._knee.reach_up)  # what the first step needs: a ramp's or a small one
        # From nothing in flight a short window will do: the opening level is small, or known to be good.
        self._window = Window(
            self._limit, clock(), grew=True, precision=first, share=tuning.window_share, from_nothing=True
        )
        self._server = ServerShare(kv_full=tuning.kv_high)  # the fit, this job's share of a server others use
        self._client_bound: ClientLoad | None = None  # the client was the bottleneck: its load then
        self._alone: int | None = None  # the best level measured before a share cut it: to go back to
        self._shared: int | None = None  # the share the limit was last set to
        # beside others: the server's best throughput measured and its level then (its own and theirs)
        self._server_best: tuple[float, int] | None = None
        if fit is not None and known_knee is None:
            self.start_at_fit(fit)

    def start_at_fit(self, fit: RequestFit, load: ServerLoad | None = None) -> int | None:
        """Before the first request: start at the number of this job's requests that fit in the KV cache
        (small steps from there, no ramp) when that is below the maximum, and keep ``fit`` for the job's
        share of the server; not after an earlier run's knee, nor once anything was measured. ``load``:
        the server's /metrics now; other jobs' requests there start this job at its share as it joins
        them (:func:`~pipeline.servers.sharing.joining_share`), even from an earlier run's knee.
        Returns the new start level, or None when the start stays."""
        self._server.fit = fit
        if self._measured or self._window.replies:
            return None
        # At or above the maximum the KV cache does not bound this job: the ramp finds the knee.
        level = fit.requests if self._opening and 0 < fit.requests < self.maximum else None
        share = joining_share(fit.requests, load)
        if share is not None:
            self._alone = None if self._opening else self._knee.best  # an earlier run's knee, for later
            level = self._shared = min(share, self.maximum)
        if level is None:
            return None
        self._limit = max(self.minimum, level)
        self._knee = KneeSearch.at_fit(self._limit, self._tuning)
        self._opening = False
        precision = self._precision_for(self._knee.reach_up)
        # Requests sent together from nothing at the fit are admitted a few a step, and wait meanwhile:
        # only later ones tell the level.
        self._window = Window(
            self._limit, self._clock(), grew=True, precision=precision, lockstep=True, from_nothing=True
        )
        return self._limit

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def best_level(self) -> int:
        """The level with the best throughput measured so far: the knee, once ``at_knee``."""
        return self._knee.best

    @property
    def share(self) -> int | None:
        """This job's share of the server while other jobs' requests run there (None: none do)."""
        return self._server.share

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
        if self._client_bound is not None:  # the client's knee is not the server's
            return None
        knee = self._knee
        if self._shared is not None or not self._measured:
            # Its share is not the server's knee: a night alone searches on from what it measured
            # alone, or the server's best level (with the others)
            level = level_alone(self)
            return KneeMemory(level, bracketed=False) if level is not None else None
        if self._bracket is not None and self._bracket.level == knee.best:
            return self._bracket
        return KneeMemory(knee.best, self._at_knee, knee.lo, knee.hi, knee.best_tp)

    @property
    def client_bound(self) -> ClientLoad | None:
        """The client's load when it was the bottleneck in a window of this run (None: never)."""
        return self._client_bound

    def on_finished(self, *, latency_s: float, output_tokens: int, prompt_tokens: int, ok: bool) -> None:
        """Every reply; ``ok`` False (an error status, a reset) delivered no tokens. ``prompt_tokens``: the
        reply's, as the server counted them (the fit is counted again at the first window's)."""
        self._window.reply(self._clock(), latency_s, output_tokens, ok)
        if ok:
            self._server.replied(prompt_tokens, output_tokens)

    def on_timeout(self) -> None:
        """A request the client gave up on: a reply that took the whole timeout and delivered nothing."""
        self._window.reply(self._clock(), self.timeout_s, 0, ok=False)

    def on_client_load(self, load: ClientLoad) -> None:
        """The client's own load over the last interval (:mod:`~pipeline.servers.client_load`)."""
        self._window.clients.append(load)

    def on_server_load(self, load: ServerLoad) -> None:
        self._window.scrape(load)
        self._load = load
        self._server.scraped(load)

    def update(self, *, in_flight: int | None = None, waiting: int = 0) -> LimitChange | None:
        """Decide, at most once per window (a server signal may decide sooner); None: no change.

        ``in_flight``: requests in flight now (the limiter's borrowed tokens); None means the limit is
        full, as it is while records are pending. ``waiting``: requests waiting for a slot (a pool of
        several jobs shares its limit by them, :mod:`~pipeline.servers.slot_pool`; one job's limit is
        its own)."""
        now, window = self._clock(), self._window
        in_flight = self._limit if in_flight is None else in_flight
        window.sample(in_flight)
        shared = share_cut(self, now, in_flight)
        if shared is not None:
            return shared
        signal = self._server_signal(window)
        if signal is None:
            if not window.complete(now, self._tuning):
                return self._jump_on_room(now, window, in_flight)
            signal = latency_signal(window, self._limit, self.timeout_s, self._tuning)
            if signal is None and window.client_bound is not None:  # the client's speed: judge nothing
                self._client_bound = window.client_bound
                return self._set(now, self._limit, "")
            if signal is None and not window.full(self._tuning.full_share):
                return self._set(now, self._limit, "")  # the client's supply ran short: measure again
        self._ceiling_left -= 1
        if self._ceiling_left <= 0:
            self._ceiling = None
        return self._back_off(now, *signal) if signal is not None else self._decide(now, window)

    def _cap(self) -> int:
        """The highest level the search may try now: the maximum, a server signal's ceiling, the share."""
        return min(level for level in (self.maximum, self._ceiling, self._server.share) if level is not None)

    def _floor(self) -> int:
        """The lowest level the search may try now: the minimum, and beside other jobs the fewest they
        still see as a job's (:func:`~pipeline.servers.sharing.least_share`)."""
        least = self._server.least if self._server.share is not None else None
        return max(self.minimum, min(least or 0, self.maximum))

    def _server_signal(self, window: Window) -> Signal | None:
        """A queue (and the level the server runs, True), or preemptions (False), or None."""
        limit, tuning = self._limit, self._tuning
        own_part = self._server.own_part  # another job's requests queue there too
        signal = queue_signal(window, limit, tuning, own_part) or preemption_signal(window, limit, tuning)
        least = self._server.least
        if signal is None or least is None:
            return signal
        return None if limit <= least else (max(signal[0], least), *signal[1:])

    def _jump_on_room(self, now: float, window: Window, in_flight: int | None) -> LimitChange | None:
        """The opening: while a scrape since the last change shows the server running everything sent,
        nothing waiting and its KV cache far from full, jump (:func:`~pipeline.servers.signals.room`)
        without waiting for a window; a step up that did worse, or a server signal, ends it."""
        if not self._opening or not window.scrapes or (in_flight is not None and in_flight < self._limit):
            return None
        jump = room(window, self._limit, self._cap(), self.timeout_s, self._tuning)
        if jump is None:
            return None
        target, top, reason = jump
        if target < self._limit * self._tuning.descent:  # near the top: windows take it from here
            self._opening = False
            return None
        self._knee.jumped(target, top)
        return self._set(now, target, reason)

    def _back_off(self, now: float, level: int, reason: str, runs: bool) -> LimitChange | None:
        """A server or latency signal: a probe there failed, and nothing above ``level`` for a while.
        ``runs``: ``level`` is what the server runs (it queues the rest), so the search goes on there."""
        level = max(self.minimum, min(level, self._limit - 1))
        self._ceiling = level if self._ceiling is None else min(self._ceiling, level)
        self._ceiling_left = self._tuning.ceiling_windows
        knee = self._knee
        if self._limit != knee.best:  # far above the best, nothing tells where between the knee lies
            knee.failed(self._limit, inside=self._limit > knee.best * self._tuning.descent**2)
            knee.heading_up = level > knee.best  # the server takes more than the best: look there first
        if level < knee.best:  # the best level itself is too much now
            knee.hi, knee.best, knee.best_tp = knee.best, level, None
            knee.lo = knee.lo if knee.lo is not None and knee.lo < level else None
            knee.reach_up = knee.reach_down = knee.smallest  # what the server runs is the knee, or near it
        knee.held, self._at_knee, self._measured, self._opening = 0, False, True, False
        if runs and level > knee.best:  # what the server runs: a probe, judged against the best level
            return self._set(now, level, f"{reason}: trying {level}, what it runs")
        self._best_at = now if self._limit == knee.best else self._best_at
        action = f"down to {knee.best}" if knee.best == level else f"back to {knee.best}, the best level"
        return self._set(now, knee.best, f"{reason}: {action}")

    def _decide(self, now: float, window: Window) -> LimitChange | None:
        """A complete window and no signal: judge its throughput and pick the next level."""
        tuning, knee, limit = self._tuning, self._knee, self._limit
        # Beside other jobs, the server's throughput at the server's level: the curve every job shares
        # (this job's own would rise with its share of a server past its best level).
        shared = self._server.share is not None
        others, throughput = window.server_view(self._load) if shared else (0, window.throughput)
        # The smallest step is of the server's level: a step of this job's alone moves it too little
        # beside others (4% of a half is 2%, whose gain is under the windows' noise) and never pays.
        knee.smallest = min(knee.descent, math.log1p(tuning.min_step * (limit + others) / limit))
        if limit == knee.best:
            words = knee.measured_best(throughput, window.error, tuning, others)
        else:
            words = knee.judge(limit, throughput, window.error, tuning, others)
        if shared and knee.best == limit and (self._server_best or (0.0, 0))[0] < throughput:
            self._server_best = throughput, round(limit + others)  # not the last best: its tail may be
            # the others' last requests draining
        self._measured = True
        self._opening = self._opening and knee.hi is None
        if knee.best == limit:
            self._best_at = now
        if limit == knee.best:  # the window saw the best level's KV cache: a step up starts there
            words += aim_up(knee, window, self._load, self._tuning)
        refit = self._refit()
        if refit is not None:
            fit_words = self._server.fit.words if self._server.fit is not None else ""
            return self._set(now, refit, f"{words}: {fit_words}: trying {refit}")
        cap, floor = self._cap(), self._floor()
        target = knee.next_probe(cap, floor)
        self._at_knee = target is None
        if target is None:
            self._bracket = KneeMemory(knee.best, True, knee.lo, knee.hi, knee.best_tp)
            held = (now - self._decided_at) / window.mean_latency
            target = knee.reprobe(cap, floor, held, tuning.hold_latencies) or knee.best
            action = f"re-probing {target}, a step from the knee at {knee.best}"
            action = action if target != knee.best else f"back to {knee.best}, the best level"
            return self._set(now, target, f"{words}: {action}")
        # Compare like with like: a probe only against a recent value of the best, as precise as needed.
        needed = self._precision_for(math.log(target / knee.best))
        age = (now - self._best_at) / window.mean_latency
        stale = age > tuning.stale_latencies or knee.best_error > 1.5 * needed
        if stale and limit != knee.best:
            return self._set(now, knee.best, f"{words}: back to {knee.best} to measure it again")
        return self._set(now, knee.best if stale else target, f"{words}: trying {target}")

    def _refit(self) -> int | None:
        """Once, at the first window of a start at the fit: the fit at the replies' prompts and answers
        as the server counted them; the level to try when it is a step or more from the limit."""
        fit = self._server.refine() if self._knee.at_fit_start else None  # not from an earlier run's knee
        if fit is None:
            return None
        # Up no more than a descent at once: the fit is the KV cache's word, and a peak may lie below it.
        level = min(
            self._cap(), max(self.minimum, fit.requests), math.ceil(self._limit * self._tuning.descent)
        )
        return level if abs(math.log(level / self._limit)) >= self._knee.smallest else None

    def _precision_for(self, log_step: float) -> float:
        """A window judges a step: a doubling must gain 23%, measured to 5% (as are larger ones); a 4%
        step, to 1%."""
        tuning = self._tuning
        needed = min(tuning.ramp_precision, tuning.min_elasticity * abs(log_step) / 4)
        return max(tuning.precision, needed)

    def _set(self, now: float, new: int, reason: str) -> LimitChange | None:
        self._decided_at = now
        old, self._limit = self._limit, max(self.minimum, min(self.maximum, new))
        precision = self._precision_for(math.log(self._limit / self._knee.best))
        share = min(1.0, max(self._tuning.window_share, abs(math.log(self._limit / old)) / math.log(2)))
        previous = self._window
        if self._limit == old:  # no transient to wait out; the scrapes still tell about this level
            kept = previous.scrapes[-2 * self._tuning.min_scrapes :]
            changed_at, grew = previous.changed_at, previous.grew
            window = Window(self._limit, changed_at, grew, precision, share, started_at=now, scrapes=kept)
            self._window = window
        else:
            lockstep = share >= 0.5
            self._window = Window(self._limit, now, self._limit > old, precision, share, lockstep=lockstep)
        return None if self._limit == old else LimitChange(old, self._limit, reason)
