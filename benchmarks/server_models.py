"""`concurrency: auto` and two jobs sharing one server, on both server models the closed loop runs: the
simulator's engine (pipeline/sim/, which the policy was tuned on) and a second one written apart from it
from the seeds' curves (pipeline/bench/step_server.py: its own batching, and past its KV cache it spills
and slows rather than preempting). A policy that meets its aims on one only is not done.

    .venv/bin/python benchmarks/server_models.py                 # ~3 minutes on the virtual clock
    .venv/bin/python benchmarks/server_models.py --cases kv64 --records 3000

Per server (benchmarks/auto_first_run.py's cases) and model: the best of a fixed sweep, a first `auto`
run (no knee stored: it starts where the job's requests fit) and a second (from the first's knee), each
of ``--length`` reply latencies at the best level, as a share of the best fixed level's throughput; then
two `auto` jobs of ``--records`` each started together against one job of twice as many alone (the
pair's records over the later one's time, as a share of the lone job's rate) and each job's time; and
the same two with the second started a quarter of the lone job's time in; and three and four jobs sharing
the lone job's records started together on one machine (one pool of slots for all:
pipeline/servers/slot_pool.py), and two and three each on its own machine (only the server's counts),
with their longest time over their shortest.
Prints a Markdown table; nothing here is a pass/fail test (tests/servers/test_limits.py and
tests/bench/test_shared_server.py hold the aims).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from auto_first_run import CASES, Case, closed_loop_scenario
from support import print_rows

from pipeline.bench.closed_loop import SERVER_MODELS, Scenario, run_load
from pipeline.bench.shared_server import Job, JobResult, run_jobs

DEFAULT_CASES = ("gpt-oss", "49b", "nano", "kv64", "49b-kv")


def row(case: Case, model: str, length: float, records: int) -> tuple[object, ...]:
    scenario = replace(closed_loop_scenario(case, length), server=model)
    sweep = {level: run_load(scenario, level).throughput() for level in case.levels}
    best = max(sweep.values())
    first = run_load(scenario)
    second = run_load(replace(scenario, known_knee=first.learned))
    jobs = replace(scenario, duration_s=10**7, speed=10.0)  # to the last record; fewer ticks to run
    (alone,) = run_jobs(jobs, [Job(2 * records)])
    pair = run_jobs(replace(jobs, duration_s=10 * alone.duration_s), [Job(records), Job(records)])
    together = sum(job.answered for job in pair) / max(job.ended_s for job in pair)
    quarter = [Job(records), Job(records, start_s=alone.duration_s / 4)]
    late = run_jobs(replace(jobs, duration_s=10 * alone.duration_s), quarter)
    joined = sum(job.answered for job in late) / max(job.ended_s for job in late)
    return (
        case.label,
        model,
        f"{max(sweep, key=lambda level: sweep[level])} ({best:.0f} tok/s)",
        f"{first.throughput() / best:.3f}",
        f"{second.throughput() / best:.3f}",
        f"{together / alone.records_per_s:.3f}",
        ", ".join(f"{job.ended_s:,.0f}" for job in pair) + f" (alone: {alone.duration_s:,.0f})",
        f"{joined / alone.records_per_s:.3f}",
        *(several(jobs, alone, count, one_machine) for count, one_machine in SEVERAL),
    )


#: The columns of several jobs started together: how many, and whether they run on one machine (one pool
#: of slots: pipeline/servers/slot_pool.py) or each on its own (only the server's counts).
SEVERAL = ((3, True), (4, True), (2, False), (3, False))


def several(jobs: Scenario, alone: JobResult, count: int, one_machine: bool) -> str:
    """``count`` jobs sharing the lone job's records, started together: their rate as a share of the lone
    job's, and their longest time over their shortest."""
    part = [Job(alone.records // count)] * count
    ran = run_jobs(replace(jobs, duration_s=10 * alone.duration_s), part, one_machine=one_machine)
    rate = sum(job.answered for job in ran) / max(job.ended_s for job in ran)
    spread = max(job.duration_s for job in ran) / min(job.duration_s for job in ran)
    return f"{rate / alone.records_per_s:.3f} ({spread:.2f}x apart)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="of auto_first_run.py's cases")
    parser.add_argument("--length", type=float, default=30.0, help="auto runs' length in reply latencies")
    parser.add_argument("--records", type=int, default=3000, help="records per job of the pair")
    args = parser.parse_args()
    chosen = args.cases.split(",")
    cases = [case for case in CASES if case.name in chosen]
    if not cases or len(cases) != len(chosen):
        parser.error(f"--cases {args.cases!r}: choose from {', '.join(case.name for case in CASES)}")
    started = time.perf_counter()
    rows = [row(case, model, args.length, args.records) for case in cases for model in SERVER_MODELS]
    header = (
        "server",
        "model",
        "best fixed c",
        "first auto run / best fixed",
        "second auto run / best fixed",
        f"two auto jobs of {args.records:,} / one of {2 * args.records:,}",
        "the two jobs' times (model s)",
        "the second started a quarter in / one alone",
        *(
            f"{count} jobs together{'' if one_machine else f' on {count} machines'} / one alone"
            for count, one_machine in SEVERAL
        ),
    )
    print_rows(header, rows)
    print(
        f"\nclosed loop, virtual clock, auto runs of ~{args.length:g} latencies, "
        f"{time.perf_counter() - started:.0f} s wall"
    )


if __name__ == "__main__":
    main()
