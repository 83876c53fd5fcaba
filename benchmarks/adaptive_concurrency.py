"""`concurrency: auto` against the best fixed concurrency, per simulator profile, in the closed loop.

    .venv/bin/python benchmarks/adaptive_concurrency.py                    # 3 model hours per run
    .venv/bin/python benchmarks/adaptive_concurrency.py --cases nano --trace
    .venv/bin/python benchmarks/adaptive_concurrency.py --latencies 30 --latency 5   # first runs of 30
    .venv/bin/python benchmarks/adaptive_concurrency.py --speed 60        # replies 60x faster to the client
    .venv/bin/python benchmarks/adaptive_concurrency.py --duration 1800 --speed 100 --real-time

For each case (a profile of `pipeline sim`, two with a KV cache far too small for their max-num-seqs,
one of them issue 18's server with room for ~64 requests), runs the closed-loop harness of
pipeline/bench/closed_loop.py at each fixed level of a sweep and once under AdaptiveLimit, for the same
duration, with /metrics scraped and the limit updated as often as the router does (1 s, 0.25 s). Time
is virtual by default (the event loop's clock jumps to its next timer: no real waiting, deterministic);
`--real-time` waits for real.
`--speed` makes the server that much faster than the client's clock, as `pipeline sim --speed` does to
a real client: scrapes stay 1 s and updates 0.25 s apart while replies take a fraction of that;
`--latency S` sets it per case so that a reply at about the best level takes S of the client's seconds,
and `--latencies N` makes each case's runs last N such replies. All numbers are in the model's seconds.

Fixed levels are measured after their first quarter (ramp-up). `auto` is reported over the whole run
and over its steady state: from the moment it first brackets its knee (its warm-up) to the end. The
ratio is steady auto over the best fixed level; "collapsed" asks whether auto's final limit lies where
the sweep (interpolated) gives less than 80% of the best. The last two columns compare whole runs, as a
run of a job is timed: the first run of `auto` (from nothing) and the next one (from what the first
learned, as the next run of a job starts from runs.knees) over the best fixed level's whole run.
Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from support import print_rows

from pipeline.bench.closed_loop import LoadResult, Scenario, run_load
from pipeline.sim.profiles import PROFILES, REFERENCE_OUTPUT_TOKENS, REFERENCE_PROMPT_TOKENS

LEVELS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 320, 384)


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    scenario: Scenario
    expected: int  # about the best level: --latencies and --latency are set from its reply latency
    levels: tuple[int, ...] = LEVELS

    def reply_latency_s(self) -> float:
        """A reply's model seconds at ``expected`` in flight, by the profile's curve (within its KV)."""
        running = float(self.expected)
        if self.scenario.kv_cache_tokens:
            request = REFERENCE_PROMPT_TOKENS + REFERENCE_OUTPUT_TOKENS
            running = min(running, self.scenario.kv_cache_tokens / request)
        throughput = PROFILES[self.scenario.profile].measured_at(running)
        return self.expected * REFERENCE_OUTPUT_TOKENS / throughput


CASES = (
    Case("gpt-oss", Scenario("gpt-oss-120b", 0), 256),
    Case("49b", Scenario("nemotron-super-49b", 0), 256),
    Case("nano", Scenario("nemotron-nano-9b", 0), 8, levels=(1, 2, 4, 8, 16, 32, 64)),
    # 150,000 tokens hold ~88 requests of the reference shape; max-num-seqs stays 512.
    Case(
        "49b-kv",
        Scenario("nemotron-super-49b", 0, kv_cache_tokens=150_000),
        88,
        levels=(8, 16, 32, 64, 80, 88, 96, 128, 192, 256),
    ),
    # Issue 18's server: a KV cache with room for ~64 requests, --max-num-seqs 512.
    Case(
        "kv64",
        Scenario("gpt-oss-120b", 0, kv_cache_tokens=120_000, max_num_seqs=512),
        64,
        levels=(16, 32, 48, 64, 72, 80, 96, 128, 256, 512),
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    case: Case
    sweep: dict[int, float]  # fixed level -> tok/s after its first quarter
    whole: dict[int, float]  # fixed level -> tok/s over the whole run, as auto's first run is measured
    auto: LoadResult
    next_run: LoadResult  # auto again, starting from the first run's knee (as the next night does)

    @property
    def best(self) -> tuple[int, float]:
        return max(self.sweep.items(), key=lambda item: item[1])

    @property
    def warmup_s(self) -> float:
        return self.auto.knee_at if self.auto.knee_at is not None else self.auto.duration_s / 2

    def sweep_at(self, concurrency: float) -> float:
        """The sweep's throughput at any level, interpolated in log concurrency."""
        levels = sorted(self.sweep)
        if concurrency <= levels[0] or concurrency >= levels[-1]:
            return self.sweep[levels[0] if concurrency <= levels[0] else levels[-1]]
        index = bisect.bisect_left(levels, concurrency)
        low, high = levels[index - 1], levels[index]
        share = math.log(concurrency / low) / math.log(high / low)
        return self.sweep[low] + share * (self.sweep[high] - self.sweep[low])


def _run(scenario: Scenario, concurrency: int | None) -> LoadResult:
    return run_load(scenario, concurrency)


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the runs last and how fast the server is, the same for every case or in latencies."""

    duration_s: float
    speed: float
    real_time: bool
    latencies: float | None = None  # each case's runs last this many of its replies' latency, and
    latency_s: float | None = None  # the server is as fast as makes a reply take this many seconds

    def scenario(self, case: Case) -> Scenario:
        reply = case.reply_latency_s()
        duration = self.latencies * reply if self.latencies else self.duration_s
        speed = reply / self.latency_s if self.latency_s else self.speed
        return replace(case.scenario, duration_s=duration, speed=speed, real_time=self.real_time)


def measure(cases: list[Case], timing: Timing, jobs: int) -> list[Outcome]:
    """Every run of every case, in ``jobs`` processes (each run is one process's event loop)."""
    scenarios = {case.name: timing.scenario(case) for case in cases}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        autos = {case.name: pool.submit(_run, scenarios[case.name], None) for case in cases}
        fixed = {
            (case.name, level): pool.submit(_run, scenarios[case.name], level)
            for case in cases
            for level in case.levels
        }
        nexts = {
            name: pool.submit(_run, replace(scenarios[name], known_knee=auto.result().learned), None)
            for name, auto in autos.items()
        }
        outcomes = []
        for case in cases:
            runs = {level: fixed[case.name, level].result() for level in case.levels}
            quarter = scenarios[case.name].duration_s / 4
            sweep = {level: run.throughput(quarter) for level, run in runs.items()}
            whole = {level: run.throughput() for level, run in runs.items()}
            auto, next_run = autos[case.name].result(), nexts[case.name].result()
            outcomes.append(Outcome(case, sweep, whole, auto, next_run))
    return outcomes


def summary_row(outcome: Outcome) -> tuple[object, ...]:
    auto, (best_level, best_tps) = outcome.auto, outcome.best
    warmup = outcome.warmup_s
    steady = auto.throughput(warmup)
    after = auto.limits_between(warmup)
    final_share = outcome.sweep_at(auto.final_limit) / best_tps
    whole_best = max(outcome.whole.values())  # a whole run, start-up and all, as auto's are measured
    return (
        outcome.case.scenario.label,
        f"{outcome.auto.duration_s / outcome.case.reply_latency_s():.0f}",
        best_level,
        f"{best_tps:.0f}",
        f"{auto.throughput():.0f}",
        f"{steady:.0f}",
        f"{steady / best_tps:.3f}",
        f"{warmup / 60:.0f}",
        auto.final_limit,
        f"{min(after)}-{max(after)} (max {max(limit for _, limit in auto.trace)})",
        "no" if final_share >= 0.8 else f"YES ({final_share:.0%} of best)",
        f"{auto.throughput() / whole_best:.3f}",
        f"{outcome.next_run.throughput() / whole_best:.3f}",
    )


def print_trace(outcome: Outcome) -> None:
    print(
        f"\n{outcome.case.scenario.label}: sweep "
        + ", ".join(f"{c}: {t:.0f}" for c, t in outcome.sweep.items())
    )
    for at, change in outcome.auto.changes:
        print(f"  {at / 60:6.1f} min  {change.old:>4} -> {change.new:<4} {change.reason}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3 * 3600.0, help="model seconds per run")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="the server this much faster than the client"
    )
    parser.add_argument("--real-time", action="store_true", help="wait for real (default: virtual time)")
    parser.add_argument(
        "--cases", default=",".join(case.name for case in CASES), help="a comma-separated subset"
    )
    parser.add_argument(
        "--latencies", type=float, default=None, help="each case's runs last this many of its replies"
    )
    parser.add_argument(
        "--latency", type=float, default=None, help="the client's seconds of a reply at the best level"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel")
    parser.add_argument("--trace", action="store_true", help="also print auto's changes with their reasons")
    args = parser.parse_args()
    chosen = args.cases.split(",")
    cases = [case for case in CASES if case.name in chosen]
    if not cases:
        parser.error(f"--cases: none of {args.cases!r}; choose from {', '.join(case.name for case in CASES)}")
    started = time.perf_counter()
    timing = Timing(args.duration, args.speed, args.real_time, args.latencies, args.latency)
    outcomes = measure(cases, timing, args.jobs)
    header = (
        "profile",
        "run length (latencies)",
        "best fixed c",
        "best fixed tok/s",
        "auto tok/s (whole run)",
        "auto tok/s (steady)",
        "ratio",
        "warm-up min",
        "auto's final limit",
        "limits after warm-up",
        "collapsed?",
        "first run / best fixed (whole runs)",
        "next run from what it learned / best fixed",
    )
    print_rows(header, [summary_row(outcome) for outcome in outcomes])
    clock = "real time" if args.real_time else "virtual time"
    length = (
        f"{args.latencies:g} replies' latency" if args.latencies else f"{args.duration / 3600:g} model hours"
    )
    fast = (
        f"replies of {args.latency:g} s to the client"
        if args.latency
        else f"the server {args.speed:g}x faster"
    )
    print(f"\n{length} per run, {clock}, {fast}, {time.perf_counter() - started:.0f} s wall")
    if args.trace:
        for outcome in outcomes:
            print_trace(outcome)


if __name__ == "__main__":
    main()
