"""The search behind `concurrency: auto` (:mod:`pipeline.servers.limits`): the state of the search for
the knee, how a measured level is judged against the best, and what a run leaves the next one. What one
window measured, the knobs and a scrape are in :mod:`pipeline.servers.window`.

The search, one decision per window, is built for a first run of one to two hours: the ramp must cost
a few request latencies, not a fifth of the run (a real vLLM server's knee is at 64 to 512 in flight).

1. Opening, on the server's word: while a ``/metrics`` scrape since the last change shows the server
   running all that was sent, nothing waiting and its KV cache far from full, jump at once (``sprint``
   x, more while the replies' latency leaves room under the timeout), without a window, up to a
   ``descent`` below the top: the KV wall (``kv_fill`` of the cache at the KV each running request uses
   now) or the maximum. The first window is there: below a peak of throughput that may lie below the wall.
2. Ramp, by windows (servers without /metrics, or faster than the scrapes): from ``initial`` (8) a first
   step to ``first_level``, then ``growth`` x while each step pays well (elasticity, the relative
   throughput gain per relative concurrency step, >= ``ramp_elasticity``); a step that pays less halves
   the next, and a long one looks inside first. Steps up aim at the KV wall (a ``descent`` below it
   first), and near a full cache at where it would be full. With ``known_knee`` (an earlier run's), start
   there: small steps around a bracketed knee, else on with the ramp within its bounds.
3. Bracket: an increase pays when throughput rises by more than ``noise`` and by ``min_elasticity`` of
   the step (+3% for +10%); a decrease pays when it costs under half that (a plateau) or gains (past
   the peak). A step that does not pay bounds the knee and sends the limit back to the best level (a
   collapse lasts one window); one that gained, only not enough, halves the bracket; else the search
   goes on in ``min_step`` steps that double while they pay, never past a bracket's middle, until the
   nearest worse levels on both sides are a step away. The best level measured again below what a bound
   gave when probed hands over to it; measured again after ``stale_latencies``, or when less precise
   than a comparison needs.
4. Hold: after ``hold_latencies`` mean reply latencies, forget one side's bound (up, then down) and step
   once, so a server that got faster or slower is followed; a shift of ``shift`` at the held level
   restarts the search.

Beside other jobs a level is judged at the server's level (this job's and theirs) by the server's
throughput (:meth:`~pipeline.servers.window.Window.server_view`): the curve every job on it shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeGuard

from pipeline.servers.window import Tuning


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


def _elasticity(base_level: float, base: float, level: float, throughput: float) -> float:
    """The relative throughput change per relative concurrency change, from the base to a level (none
    between levels that are one)."""
    if abs(math.log(level / base_level)) < SAME_LEVEL:
        return 0.0
    if base > 0 < throughput:
        return math.log(throughput / base) / math.log(level / base_level)
    up = level > base_level  # from or to nothing: as steep as can be
    return (1.0 if throughput > base else -1.0) * (math.inf if up else -math.inf)


def pays(base_level: float, base: float, level: float, throughput: float, tuning: Tuning) -> bool:
    """Whether ``level`` is better than the base: up, the extra concurrency must return enough
    throughput; down, giving concurrency back must cost next to nothing (a plateau) or gain (past the
    peak). Beside other jobs the levels are the server's (this job's and theirs), which may not differ:
    then only a gain pays."""
    if abs(math.log(level / base_level)) < SAME_LEVEL:
        return throughput >= base * (1 + tuning.noise)
    elasticity = _elasticity(base_level, base, level, throughput)
    if level > base_level:
        return throughput >= base * (1 + tuning.noise) and elasticity >= tuning.min_elasticity
    return throughput > 0 and elasticity < tuning.min_elasticity / 2


#: Levels closer than this (in log) are one: beside other jobs, theirs may have moved against this one's.
SAME_LEVEL = 0.005


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
    # Other jobs' requests on the server beside the best level's window: beside others a level is judged
    # by the server's throughput at the server's level (theirs and this job's), the curve all jobs share.
    best_others: float = 0.0

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
        self.best, self.best_tp, self.best_error, self.best_others = level, None, math.inf, 0.0
        self.lo = self.hi = None
        self.seen = {}
        self.reach_up = self.reach_down = self.smallest
        self.held = 0

    def measured_best(self, throughput: float, error: float, tuning: Tuning, others: float = 0.0) -> str:
        """A window at the best level: refresh its throughput; a large shift restarts the search, and so
        does an earlier run's knee found slower than that run measured it (beyond the window's noise).
        ``others``: other jobs' requests on the server meanwhile (``throughput`` is then the server's)."""
        previous, self.best_tp, self.best_error = self.best_tp, throughput, error
        self.best_others = others
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
            others = self.best_others
            if not pays(self.best + others, self.best_tp or 0.0, level + others, self.seen[level], tuning):
                continue
            old, self.best, self.best_tp, self.best_error = self.best, level, self.seen[level], math.inf
            self.hi, self.lo = (None, self.lo) if level == self.hi else (self.hi, None)
            self.hi, self.lo = (old, self.lo) if old > level else (self.hi, old)
            self.reach_up = self.reach_down = self.smallest
            self.heading_up = level > old
            return f"; {level} did better when probed: the best level now"
        return ""

    def judge(self, level: int, throughput: float, error: float, tuning: Tuning, others: float = 0.0) -> str:
        """A window at a probe: move the best level there if it paid, else bound the knee by it.
        ``others``: other jobs' requests on the server meanwhile (``throughput`` is then the server's)."""
        base, old, up = self.best_tp or 0.0, self.best, level > self.best
        server_levels = (old + self.best_others, base, level + others, throughput)
        paid = pays(*server_levels, tuning)
        elasticity = _elasticity(*server_levels)
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
        self.best_others, self.held = others, 0
        return words

    def jumped(self, level: int, top: int) -> None:
        """The limit jumped to ``level`` on the server's word (it ran everything sent), unmeasured: the
        search goes on from there, up to ``top`` first (where the KV cache or the maximum ends it)."""
        self.best, self.best_tp, self.best_error, self.best_others = level, None, math.inf, 0.0
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
