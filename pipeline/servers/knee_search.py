"""The search behind `concurrency: auto` (:mod:`pipeline.servers.limits`): what one measurement window
saw, the state of the search for the knee, what a run leaves the next one, the controller's knobs and
what a ``/metrics`` scrape says.

A window starts at the first reply to a request sent after the last change (earlier ones belong to the
old limit: the transient). After a step of a ``descent`` or more it counts only replies to requests sent
after that first reply: the requests sent with the step run in lockstep (their prefills together, their
KV cache growing together) and tell little of the level in steady state. It lasts ``window_share`` of a
turnover after a small step, a whole one after a doubling (the limit in replies, and the replies' mean
latency in time, within ``min_window_s`` and ``max_window_s``: a fast server is not measured on a slow
one's clock), and until the standard error of its rate is below what its comparison needs (``precision``
for a small step, 5% for a doubling or more). It measures the delivery rate by Little's law,
``in flight x tokens / latency``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeGuard

from pipeline.servers.client_load import ClientLoad


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """One ``/metrics`` scrape; a field is None when the server does not report it."""

    running: float | None  # vllm:num_requests_running
    waiting: float | None  # vllm:num_requests_waiting
    kv_usage: float | None  # vllm:kv_cache_usage_perc, 0..1 (older vLLM: vllm:gpu_cache_usage_perc)
    preemptions_total: float | None  # vllm:num_preemptions_total, a counter


@dataclass(frozen=True, slots=True)
class Tuning:
    """The controller's knobs; the defaults are what the benchmark and the tests ran with."""

    first_level: int = 128  # the ramp's first step goes this far (a real server's knee is at 64 to 512),
    growth: float = 4.0  # then its factor per window while steps pay well, and at least that,
    sprint: float = 4.0  # and while /metrics show room (nothing waiting, the KV cache far from full)
    descent: float = 1.41  # the largest step down: below a level the curve is steeper than above
    kv_fill: float = 0.9  # a jump aims no higher than this KV use, at the KV used per running request
    min_step: float = 0.04  # the smallest relative step: the precision of the knee
    min_elasticity: float = 0.3  # an increase must return >= 0.3% throughput per 1% of concurrency
    ramp_elasticity: float = 0.35  # a step that returns this much is followed by a twice larger one
    noise: float = 0.02  # relative throughput changes below this are noise (a real client's windows)
    window_share: float = 0.25  # a window lasts this share of a turnover (the limit in replies and its
    # mean latency in time) after a small step, a whole one after a doubling or more (the server needs
    # a turnover to settle: a KV cache fills up as the new requests grow),
    min_replies: int = 8  # at least this many replies,
    min_window_s: float = 0.0  # bounded below
    max_window_s: float = 15.0  # and above (a slow server's replies count is what makes it long),
    precision: float = 0.01  # and until its rate's relative standard error is below this
    ramp_precision: float = 0.05  # the precision a window needs for a step of a doubling or more
    min_scrapes: int = 3  # /metrics scrapes before a server signal counts
    waiting_share: float = 0.5  # share of scrapes with waiting > 0 that means "sustained",
    full_share: float = 0.9  # a window counts while the requests in flight are at least this share of the
    # limit (a sample a second: a refill in progress is not a gap)
    queue_share: float = 0.05  # unless the mean number waiting is below this share of those running;
    flood_share: float = 0.25  # one scrape suffices after a step up when this share of those running waits
    kv_high: float = 0.9  # mean KV-cache use above which steps up are min_step only
    preemption_rate: float = 1.0  # preemptions per reply above which the limit backs off: a thrash
    latency_share: float = 0.5  # p90 latency above this share of the timeout backs off
    hold_latencies: float = 10.0  # mean reply latencies held at the knee between two re-probes,
    confirm_latencies: float = 3.0  # and before the first one, from a knee an earlier run found
    stale_latencies: float = 30.0  # a best level measured longer ago is measured again before a probe
    ceiling_windows: int = 12  # decisions a ceiling from a server signal lasts
    shift: float = 0.25  # throughput change at the held level that restarts the search
    slower: float = 0.1  # an earlier run's knee this much slower than it was (and than the noise) is left


DEFAULT_TUNING = Tuning()


@dataclass(slots=True)
class Window:
    """What one measurement window saw: replies after the transient, in-flight samples, scrapes."""

    limit: int
    changed_at: float
    grew: bool  # after an increase, server signals count at once (an overload shows immediately)
    precision: float  # the relative standard error its rate must reach
    share: float = 1.0  # of a turnover it lasts at least (Tuning.window_share)
    # After a large step the requests sent with it run in lockstep (their prefills together, their KV
    # growing together), unlike any later: only replies to requests sent after the first reply count.
    lockstep: bool = False
    started_at: float | None = None
    replies: list[tuple[float, float]] = field(default_factory=list)  # (tokens delivered, latency s)
    in_flight: list[int] = field(default_factory=list)
    scrapes: list[ServerLoad] = field(default_factory=list)
    settled_scrape: int = 0  # the first scrape after the transient
    clients: list[ClientLoad] = field(default_factory=list)  # the client's own load, a reading a scrape

    @property
    def client_bound(self) -> ClientLoad | None:
        """The client's load over the window when it was the bottleneck (its mean reading), else None."""
        load = ClientLoad.mean(self.clients)
        return load if load is not None and load.bound else None

    def reply(self, now: float, latency_s: float, tokens: int, ok: bool) -> None:
        if now - latency_s < self.changed_at - 1e-9:
            return  # sent under the old limit: its latency tells about that one
        if self.started_at is None:
            self.started_at = now  # the first reply to a request sent under this limit
            self.settled_scrape = len(self.scrapes)
        if self.lockstep and now - latency_s < self.started_at:
            return
        self.replies.append((tokens if ok else 0, latency_s))

    def full(self, share: float) -> bool:
        """Whether the limit was kept full (every sample at least ``share`` of it): else the window
        measured the client's supply (a run's start or tail), not the level."""
        return all(sample >= share * self.limit for sample in self.in_flight)

    def sample(self, in_flight: int) -> None:
        if self.started_at is not None:
            self.in_flight.append(in_flight)

    def scrape(self, load: ServerLoad) -> None:
        if self.started_at is not None or self.grew:  # not while the old, higher limit drains
            self.scrapes.append(load)

    def complete(self, now: float, tuning: Tuning) -> bool:
        if self.started_at is None or len(self.replies) < max(tuning.min_replies, self.share * self.limit):
            return False
        floor = self.share * self.mean_latency
        floor = min(max(floor, tuning.min_window_s), tuning.max_window_s)
        return now - self.started_at >= floor and self.error <= self.precision

    @property
    def mean_latency(self) -> float:
        return sum(seconds for _, seconds in self.replies) / len(self.replies) if self.replies else math.inf

    @property
    def throughput(self) -> float:
        """Little's law: requests in flight (the limit, kept full) x tokens per second of latency."""
        latency = sum(seconds for _, seconds in self.replies)
        return self.limit * sum(tokens for tokens, _ in self.replies) / latency if latency > 0 else 0.0

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


def change_words(base: float, throughput: float) -> str:
    gain = throughput / base - 1 if base > 0 else 0.0
    numbers = f"({base:.0f} -> {throughput:.0f} tok/s)"
    if abs(gain) < 0.005:
        return f"throughput unchanged {numbers}"
    return f"throughput {'rose' if gain > 0 else 'fell'} {abs(gain):.0%} {numbers}"


@dataclass(frozen=True, slots=True)
class KneeMemory:
    """What `concurrency: auto` learned on one server in a run, for the next run to start from (stored
    as JSON in ``runs.knees``; a plain number there is a knee an earlier version bracketed)."""

    level: int  # the best level measured: the knee when ``bracketed``
    bracketed: bool  # the nearest worse levels on both sides were a step away
    worse_below: int | None = None  # the nearest level below ``level`` that did worse
    worse_above: int | None = None  # the nearest level above it that did worse: overloaded, or slower
    tokens_per_s: float | None = None  # what ``level`` delivered then: a next run slower there looks again

    def as_json(self) -> dict[str, int | bool | float]:
        bounds = {"worse_below": self.worse_below, "worse_above": self.worse_above}
        known: dict[str, int | bool | float] = {k: level for k, level in bounds.items() if level is not None}
        if self.tokens_per_s is not None:
            known["tokens_per_s"] = round(self.tokens_per_s, 1)
        return {"level": self.level, "bracketed": self.bracketed, **known}

    @classmethod
    def from_json(cls, value: object) -> KneeMemory | None:
        """A stored value as written now, or an older plain level; None for anything else."""
        if _level(value):
            return cls(value, bracketed=True)
        if not isinstance(value, dict) or not _level(level := value.get("level")):
            return None
        below, above, speed = value.get("worse_below"), value.get("worse_above"), value.get("tokens_per_s")
        return cls(
            level,
            value.get("bracketed") is True,
            below if _level(below) and below < level else None,
            above if _level(above) and above > level else None,
            float(speed)
            if isinstance(speed, int | float) and not isinstance(speed, bool) and speed > 0
            else None,
        )


def _elasticity(base_level: int, base: float, level: int, throughput: float) -> float:
    """The relative throughput change per relative concurrency change, from the base to a level."""
    if base > 0 < throughput:
        return math.log(throughput / base) / math.log(level / base_level)
    up = level > base_level  # from or to nothing: as steep as can be
    return (1.0 if throughput > base else -1.0) * (math.inf if up else -math.inf)


def pays(base_level: int, base: float, level: int, throughput: float, tuning: Tuning) -> bool:
    """Whether ``level`` is better than the base: up, the extra concurrency must return enough
    throughput; down, giving concurrency back must cost next to nothing (a plateau) or gain (past the
    peak)."""
    elasticity = _elasticity(base_level, base, level, throughput)
    if level > base_level:
        return throughput >= base * (1 + tuning.noise) and elasticity >= tuning.min_elasticity
    return throughput > 0 and elasticity < tuning.min_elasticity / 2


def _level(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(slots=True)
class KneeSearch:
    """The search: the best level, its last throughput, and the nearest worse levels around it."""

    best: int
    smallest: float  # log of the smallest step, 1 + min_step
    largest: float  # log of the largest step up, growth
    descent: float  # log of the largest step down
    best_tp: float | None = None
    best_error: float = math.inf  # the relative standard error of best_tp
    lo: int | None = None  # the nearest level below ``best`` known to do worse
    hi: int | None = None  # the nearest level above ``best`` known to do worse
    reach_up: float = 0.0  # log of the next step up
    reach_down: float = 0.0
    held: float = 0.0  # latencies held at the knee since the last probe
    heading_up: bool = True  # the side to try first: where the last paid step went
    reprobe_up: bool = True
    seen: dict[int, float] = field(default_factory=dict)  # the last throughput measured at each level
    remembered: float | None = None  # what an earlier run's knee delivered, until measured again here
    at_fit_start: bool = False  # started where the job's requests fit (not at an earlier run's knee)

    @classmethod
    def starting(cls, level: int, tuning: Tuning, memory: KneeMemory | None) -> KneeSearch:
        """At ``level``: a ramp, or where an earlier run left the search (small steps around a bracketed
        knee; otherwise on with its ramp, within the levels that did worse)."""
        smallest, largest = math.log1p(tuning.min_step), math.log(tuning.growth)
        descent = max(smallest, math.log(tuning.descent))
        if memory is None:  # the first step is the largest: what a server runs starts well above 8
            first = max(largest, math.log(tuning.first_level / level))
            return cls(level, smallest, largest, descent, reach_up=first, reach_down=smallest)
        below, above = memory.worse_below, memory.worse_above
        return cls(
            level,
            smallest,
            largest,
            descent,
            lo=below if below is not None and below < level else None,
            hi=above if above is not None and above > level else None,
            reach_up=smallest if memory.bracketed else largest,
            reach_down=smallest,
            # An earlier run's knee is looked at again soon, a step below first: above a knee may be a
            # cliff, and a knee found a step too high costs the whole run.
            held=tuning.hold_latencies - tuning.confirm_latencies,
            reprobe_up=False,
            remembered=memory.tokens_per_s,
        )

    @classmethod
    def at_fit(cls, level: int, tuning: Tuning) -> KneeSearch:
        """At the number of the job's requests that fit in the KV cache: small steps, up first (below the
        fit the server is not overcommitted; past it, it collapses), no bounds known."""
        smallest, largest = math.log1p(tuning.min_step), math.log(tuning.growth)
        descent = max(smallest, math.log(tuning.descent))
        return cls(
            level, smallest, largest, descent, reach_up=smallest, reach_down=smallest, at_fit_start=True
        )

    def restart_at(self, level: int) -> None:
        """The server changed under the search (other jobs came or went): it starts again at ``level`` in
        small steps, with nothing measured (what was measured before is not comparable)."""
        self.best, self.best_tp, self.best_error = level, None, math.inf
        self.lo = self.hi = None
        self.seen = {}
        self.reach_up = self.reach_down = self.smallest
        self.held = 0

    def measured_best(self, throughput: float, error: float, tuning: Tuning) -> str:
        """A window at the best level: refresh its throughput; a large shift restarts the search, and so
        does an earlier run's knee found slower than that run measured it (beyond the window's noise)."""
        previous, self.best_tp, self.best_error = self.best_tp, throughput, error
        self.seen[self.best] = throughput
        # Against an earlier run's, not the first window from nothing (its requests were sent together).
        remembered = self.remembered if previous is not None else None
        self.remembered = self.remembered if previous is None else None
        if remembered is not None and throughput < remembered * (1 - max(tuning.slower, 3 * error)):
            words = f"{self.best}, the knee an earlier run stored, gives {throughput:.0f} tok/s where it gave"
            # Around it in steps of a descent: the knee was here once, far above may be a collapse.
            return self._search_again(throughput, f"{words} {remembered:.0f}: searching again", self.descent)
        if previous is not None and previous > 0 and abs(throughput / previous - 1) > tuning.shift:
            words = (
                f"{change_words(previous, throughput)} at {self.best}: the server changed, searching again"
            )
            return self._search_again(throughput, words, self.largest)
        return f"{self.best} gives {throughput:.0f} tok/s" + self._overtaken(tuning)

    def _search_again(self, throughput: float, words: str, reach_up: float) -> str:
        """Nothing known around the best level any more: steps of ``reach_up`` up, a descent down."""
        self.lo = self.hi = None
        self.seen = {self.best: throughput}
        self.reach_up, self.reach_down, self.held = reach_up, self.descent, 0
        return words

    def _overtaken(self, tuning: Tuning) -> str:
        """The best level measured again did worse than a bound did when it was probed (the earlier
        value was lucky, or the server changed): that bound is the best level now, to measure again."""
        for level in (self.hi, self.lo):
            if level is None or level not in self.seen:
                continue
            if not pays(self.best, self.best_tp or 0.0, level, self.seen[level], tuning):
                continue
            old, self.best, self.best_tp, self.best_error = self.best, level, self.seen[level], math.inf
            self.hi, self.lo = (None, self.lo) if level == self.hi else (self.hi, None)
            self.hi, self.lo = (old, self.lo) if old > level else (self.hi, old)
            self.reach_up = self.reach_down = self.smallest
            self.heading_up = level > old
            return f"; {level} did better when probed: the best level now"
        return ""

    def judge(self, level: int, throughput: float, error: float, tuning: Tuning) -> str:
        """A window at a probe: move the best level there if it paid, else bound the knee by it."""
        base, old, up = self.best_tp or 0.0, self.best, level > self.best
        elasticity = _elasticity(old, base, level, throughput)
        paid = pays(old, base, level, throughput, tuning)
        words = f"{change_words(base, throughput)} from {old} to {level}"
        self.seen[level] = throughput
        if not paid:
            if up and throughput > base * 0.995 > 0:
                words = words.replace("rose", "rose only", 1) + f" ({level / old:.2f}x the concurrency)"
            self.failed(level, inside=up and throughput >= base)
            return words
        if up:  # a step that paid well is followed by one twice as large, else by one half as large
            well = elasticity >= tuning.ramp_elasticity
            self.lo, self.reach_up = old, min(self.largest, 2 * self.reach_up) if well else self.reach_up / 2
            self.reach_up = max(self.smallest, self.reach_up)
            if not well and math.log(level / old) > self.descent:  # a peak may lie within a long step
                self.reach_down = self.descent
                up = False
        else:  # down a plateau or a slope that pays: faster
            self.hi, self.reach_down = old, min(self.descent, 2 * self.reach_down)
            words += " (a plateau: as much for less)" if throughput < base else ""
        self.best, self.best_tp, self.best_error, self.heading_up = level, throughput, error, up
        self.held = 0
        return words

    def jumped(self, level: int, top: int) -> None:
        """The limit jumped to ``level`` on the server's word (it ran everything sent), unmeasured: the
        search goes on from there, up to ``top`` first (where the KV cache or the maximum ends it)."""
        self.best, self.best_tp, self.best_error = level, None, math.inf
        self.lo = self.hi = None
        self.reach_up = max(self.descent, math.log(top / level) - self.descent)  # to where the ramp aimed
        self.reach_down, self.heading_up = self.descent, True
        self.held = 0

    def failed(self, level: int, *, inside: bool = False) -> None:
        """A probe did worse: it bounds the knee. ``inside``: a step up that gained, only not enough: the
        knee lies between, so the next probe halves the bracket (in log). Otherwise the knee is near:
        small steps, the other side first."""
        self.hi, self.lo = (level, self.lo) if level > self.best else (self.hi, level)
        self.heading_up = inside or level < self.best
        self.reach_up = self.largest if inside else self.smallest
        if self.lo is not None:  # else nothing below was measured: the knee may be far down
            self.reach_down = self.smallest
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

    def reprobe(self, cap: int, minimum: int, held: float, hold: float) -> int | None:
        """At the knee, after ``hold`` latencies held (``held`` more now): forget one side's bound
        (alternately) and step."""
        self.held += held
        if self.held < hold:
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
