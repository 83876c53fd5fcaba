"""Servers of the family (:mod:`pipeline.bench.family_server`) drawn at random, and what `concurrency:
auto` and several jobs do on one, in the closed loop on the virtual clock: the figures the properties of
tests/properties/test_auto_family.py judge and benchmarks/server_family.py prints.

The job is benchmarks/auto_first_run.py's: a 1,973-token prompt of which 1,000 are its fixed part,
answers of ~327 tokens (±25%), ``max_tokens`` 2048. A first `auto` run starts where its requests fit (no
knee stored), the second from the first's knee; each lasts ~30 reply latencies at the best fixed level,
against the best of a sweep around the level the server's parameters say is best. Jobs run their
records to the end: one job alone, two of half its records together (and the second a quarter of the
lone job's time in), three of a third.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

from hypothesis import strategies as st

from pipeline.bench.closed_loop import FAMILY, Scenario, Workload, run_load
from pipeline.bench.family_server import FamilySpec
from pipeline.bench.shared_server import Job, JobResult, run_jobs

JOB = Workload(prompt_tokens=1973, output_tokens=327)  # its fixed part: Workload's 1,000 tokens
MAX_TOKENS = 2048
LENGTH = 30  # reply latencies at the best fixed level a first or a second run lasts
SWEEP = (0.7, 0.85, 1.0, 1.2, 1.5)  # the fixed sweep, around the level the parameters say is best
TURNOVERS = 40  # the lone job's records: this many times the best level's
MOST = 512  # auto's maximum, and the sweep's
LATE = 0.25  # the joiner starts this share of the lone job's time in
SETTLE = 5  # reply latencies the joiner has to reach its part before it is judged
SLOWEST_REPLY_S = 30.0  # the client's seconds of a reply at the best level, at most
SLOWEST = 2  # jobs are stopped at this many times the time they should take (the lone job's)
#: The job sizes the strategy draws from: how many of the job's requests the KV cache holds.
FITS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def servers(most_fit: int = 128, most_noise: float = 0.3) -> st.SearchStrategy[FamilySpec]:
    """A server of the family, on every axis: its KV cache by tokens or requests and how many of the job's
    requests it holds (up to ``most_fit``), past it a cliff, a decline or a queue, preempting or
    spilling, ``--max-num-seqs`` above or below it, chunked prefill and prefix caching on or off, its
    speed and how its speed grows with the batch, latency noise (up to ``most_noise``: a noisy server's
    windows last long, and the controller's CPU grows with the square of a window's scrapes), and
    /metrics with or without a queue. Each axis shrinks toward its first value."""
    axes = st.builds(
        FamilySpec,
        kv_by=st.sampled_from(["tokens", "requests"]),
        past=st.sampled_from(["decline", "cliff", "queue"]),
        fall_to=st.sampled_from([0.5, 0.3, 0.7]),
        overflow=st.sampled_from(["preempt", "spill"]),
        chunked_prefill=st.booleans(),
        prefix_caching=st.booleans(),
        single_tok_s=st.sampled_from([33.5, 10.0, 100.0, 4.0]),
        half_batch=st.sampled_from([32.0, 8.0, 128.0, 512.0]),
        prefill_tok_s=st.sampled_from([20_000.0, 5_000.0, 60_000.0]),
        noise=st.sampled_from([noise for noise in (0.0, 0.1, 0.3) if noise <= most_noise]),
        metrics_queue=st.booleans(),
        slot_tokens=st.sampled_from([4096, 2304, 1536]),
    )
    return st.builds(
        _sized,
        axes,
        fit=st.sampled_from([fit for fit in FITS if fit <= most_fit]),
        seqs=st.sampled_from([8.0, 2.0, 1.25, 0.75, 0.5]),
        peak=st.sampled_from([None, 0.5, 0.75]),
    )


def _sized(axes: FamilySpec, fit: int, seqs: float, peak: float | None) -> FamilySpec:
    """The server of ``axes`` holding ``fit`` of the job's requests, ``--max-num-seqs`` ``seqs`` times
    that, its throughput peaking at ``peak`` times that (None: it saturates)."""
    shared = JOB.prefix_tokens if axes.prefix_caching else 0
    per_request = JOB.prompt_tokens + JOB.output_tokens - shared
    size = fit if axes.kv_by == "requests" else shared + fit * per_request
    peak_batch = None if peak is None else max(1, round(peak * fit))
    return replace(axes, kv_size=size, max_num_seqs=max(1, round(seqs * fit)), peak_batch=peak_batch)


def steady(spec: FamilySpec, level: int) -> float:
    """Output tok/s at ``level`` in flight by the server's parameters (no run)."""
    return spec.steady_tokens_per_s(level, JOB.prompt_tokens, JOB.output_tokens, JOB.prefix_tokens)


@cache
def said_best(spec: FamilySpec) -> int:
    """The fewest in flight within 1% of the most the parameters say the server delivers."""
    curve = {level: steady(spec, level) for level in range(1, MOST + 1)}
    top = max(curve.values())
    return next(level for level, tokens in curve.items() if tokens >= 0.99 * top)


def latency_s(spec: FamilySpec, level: int) -> float:
    """A reply's seconds at ``level`` in flight, by Little's law over the parameters' throughput."""
    return level * JOB.output_tokens / steady(spec, level)


def scenario(spec: FamilySpec, duration_s: float) -> Scenario:
    """The server in the closed loop, its time compressed (as ``pipeline sim --speed`` does) so that the
    client waits at most ``SLOWEST_REPLY_S`` for a reply at the best level: the client's ticks and scrapes
    are what a run's CPU goes to."""
    compressed = max(1.0, latency_s(spec, said_best(spec)) / SLOWEST_REPLY_S)
    return Scenario(
        "family",
        duration_s,
        workload=JOB,
        max_tokens=MAX_TOKENS,
        fit_start=True,
        server=FAMILY,
        family=spec,
        maximum=MOST,
        speed=compressed,
    )


@dataclass(frozen=True, slots=True)
class AutoFigures:
    """A first and a second `auto` run against the best fixed level (output tok/s over whole runs)."""

    best_level: int
    best_tok_s: float
    first: float  # the first run's share of the best fixed level's throughput
    second: float
    first_kept: str  # where the first run ended and what it left the second


@cache
def auto_figures(spec: FamilySpec) -> AutoFigures:
    center = said_best(spec)
    setting = scenario(spec, LENGTH * latency_s(spec, center))
    levels = sorted({min(MOST, max(1, round(center * factor))) for factor in SWEEP})
    sweep = {level: run_load(setting, level).throughput() for level in levels}
    best = max(sweep, key=lambda level: sweep[level])
    first = run_load(setting)
    second = run_load(replace(setting, known_knee=first.learned))
    kept = f"{first.final_limit}, kept {first.learned.level if first.learned else None}"
    return AutoFigures(
        best, sweep[best], first.throughput() / sweep[best], second.throughput() / sweep[best], kept
    )


@dataclass(frozen=True, slots=True)
class JobsFigures:
    """Jobs together against one alone: their records a second over the time from the first start to the
    last end, as a share of the lone job's; and their longest time over their shortest."""

    share: float
    spread: float


@cache
def alone(spec: FamilySpec) -> JobResult:
    level = said_best(spec)
    records = TURNOVERS * level
    expected_s = records * latency_s(spec, level) / level
    (job,) = run_jobs(scenario(spec, SLOWEST * expected_s), [Job(records)])
    return job


def jobs_scenario(spec: FamilySpec) -> Scenario:
    """Long enough for jobs together to end, unless they go a few times slower than one alone (then
    every property of them fails as it is: their rate is a fraction of one job's)."""
    return scenario(spec, SLOWEST * alone(spec).duration_s)


def together(spec: FamilySpec, count: int) -> JobsFigures:
    """``count`` `auto` jobs sharing the lone job's records, started together."""
    return jobs_together(spec, (None,) * count)


@cache
def jobs_together(spec: FamilySpec, levels: tuple[int | None, ...]) -> JobsFigures:
    """Jobs sharing the lone job's records started together, one a level each (None: ``auto``)."""
    one = alone(spec)
    jobs = run_jobs(jobs_scenario(spec), [Job(one.records // len(levels), level) for level in levels])
    return JobsFigures(rate(jobs) / one.records_per_s, spread(jobs))


@dataclass(frozen=True, slots=True)
class JoinerFigures:
    """Two jobs of half the lone job's records, the second started a quarter of its time in: the pair's
    rate as a share of the lone job's; and, from a few reply latencies after it joined until the first
    of them ended, the joiner's replies over the other's."""

    share: float
    part: float


@cache
def joiner(spec: FamilySpec, level: int | None = None) -> JoinerFigures:
    """An `auto` job and one that joins it a quarter in, at ``level`` (None: ``auto``)."""
    one = alone(spec)
    late = LATE * one.duration_s
    jobs = [Job(one.records // 2), Job(one.records // 2, level, start_s=late)]
    first, second = run_jobs(jobs_scenario(spec), jobs)
    judged_from = late + SETTLE * latency_s(spec, said_best(spec))
    until = min(first.ended_s, second.ended_s)
    theirs = first.answered_between(judged_from, until)
    part = second.answered_between(judged_from, until) / theirs if theirs else 0.0
    return JoinerFigures(rate([first, second]) / one.records_per_s, part)


def rate(jobs: list[JobResult]) -> float:
    """The jobs' records a second, from the first start to the last end."""
    return sum(job.answered for job in jobs) / (max(j.ended_s for j in jobs) - min(j.started_s for j in jobs))


def spread(jobs: list[JobResult]) -> float:
    """The longest job's time over the shortest's (unfinished jobs count to the scenario's end)."""
    return max(job.duration_s for job in jobs) / min(job.duration_s for job in jobs)


@dataclass(frozen=True, slots=True)
class Property:
    """What must hold on every server of the family: a figure of it, at least ``at_least``."""

    name: str
    words: str
    figure: Callable[[FamilySpec], float]
    at_least: float

    def margin(self, server: FamilySpec) -> float:
        """How far the figure lies above what it must be (negative: the property fails), relative."""
        return self.figure(server) / self.at_least - 1.0


PROPERTIES = (
    Property("first", "a first run / best fixed", lambda s: auto_figures(s).first, 0.92),
    Property("second", "the second run / best fixed", lambda s: auto_figures(s).second, 0.97),
    Property("two", "2 jobs together / one alone", lambda s: together(s, 2).share, 0.9),
    Property("two_apart", "2 jobs: shortest / longest time", lambda s: 1 / together(s, 2).spread, 0.8),
    Property("three", "3 jobs together / one alone", lambda s: together(s, 3).share, 0.9),
    Property("three_apart", "3 jobs: shortest / longest time", lambda s: 1 / together(s, 3).spread, 0.8),
    Property("late", "a joiner a quarter in: both / one alone", lambda s: joiner(s).share, 0.9),
    Property("late_part", "the joiner's replies / the other's", lambda s: joiner(s).part, 0.8),
)
BY_NAME = {prop.name: prop for prop in PROPERTIES}


def figures(server: FamilySpec) -> str:
    """Every figure of a server, in words: what a failure prints beside its parameters."""
    auto, two, three, late = auto_figures(server), together(server, 2), together(server, 3), joiner(server)
    return (
        f"best fixed {auto.best_level} ({auto.best_tok_s:.0f} tok/s), first run {auto.first:.3f} "
        f"(ended at {auto.first_kept}), second {auto.second:.3f}; 2 jobs {two.share:.3f} "
        f"({two.spread:.2f}x apart), 3 jobs {three.share:.3f} ({three.spread:.2f}x apart), "
        f"a joiner a quarter in {late.share:.3f} (its part {late.part:.2f})"
    )
