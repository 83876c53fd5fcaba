"""Two jobs with `concurrency: auto` on one server against one job of as many records alone, in the
closed-loop harness (pipeline/bench/closed_loop.py: the simulator's engine in process on a virtual
clock, collapsing past its KV cache as a real server does).

    .venv/bin/python benchmarks/two_jobs.py                   # 3,000 records each, ~10 s
    .venv/bin/python benchmarks/two_jobs.py --records 1000 --kv-requests 128

The server: gpt-oss-120b's curve with a KV cache that holds ``--kv-requests`` (64) of the job's
requests (1,500-token prompts, answers of ~400 of max_tokens 2048) and --max-num-seqs 512, so its
throughput collapses past 64 in flight. Each job starts where its requests fit (the server's
vllm:cache_config_info) and takes the server's running + waiting beyond its own as the other's
(pipeline/servers/sharing.py). Rows: one auto job of 2 x records alone; two auto jobs of records each
started together; the same two as before they shared (no fit known: each ramps on its own and reads
only its own signals); for contrast two jobs at a fixed c=256 each. A job's time is to its last reply (a
timed-out request is sent again); the pair's throughput is both jobs' records over the later one's
time, against the job alone. Runs stop at ``--cap`` times the lone job's time. Prints a Markdown table;
nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from pipeline.bench.closed_loop import JobResult, Scenario, Workload, run_jobs
from pipeline.sim.profiles import REFERENCE_OUTPUT_TOKENS, REFERENCE_PROMPT_TOKENS


def scenario(kv_requests: int) -> Scenario:
    request = REFERENCE_PROMPT_TOKENS + REFERENCE_OUTPUT_TOKENS
    return Scenario(
        "gpt-oss-120b",
        duration_s=10**7,
        kv_cache_tokens=kv_requests * request,
        max_num_seqs=512,
        workload=Workload(),
        timeout_s=3600.0,
        fit_start=True,
        speed=10.0,  # replies 10x faster to the client (its scrapes stay 1 s apart): fewer ticks to run
    )


def row(label: str, jobs: list[JobResult], alone: float) -> tuple[object, ...]:
    times = [job.duration_s for job in jobs]
    answered = sum(job.answered for job in jobs)
    pair = answered / max(times)
    unfinished = [job for job in jobs if not job.finished]
    words = f" ({sum(j.answered for j in unfinished)} answered, stopped)" if unfinished else ""
    return (
        label,
        ", ".join(f"{seconds:,.0f}" for seconds in times) + words,
        f"{max(times) / min(times):.2f}",
        f"{pair:.3f}",
        f"{pair / alone:.3f}",
        ", ".join(str(job.peak_limit) for job in jobs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=3000, help="records per job of the pair")
    parser.add_argument("--kv-requests", type=int, default=64, help="requests the KV cache holds")
    parser.add_argument("--fixed", type=int, default=256, help="the contrast's fixed concurrency")
    parser.add_argument("--cap", type=float, default=10.0, help="stop runs at this x the lone job's time")
    args = parser.parse_args()
    started = time.perf_counter()
    server = scenario(args.kv_requests)
    (one,) = run_jobs(server, [(2 * args.records, None)])
    capped = replace(server, duration_s=args.cap * one.duration_s)
    pair = run_jobs(capped, [(args.records, None), (args.records, None)])
    alone_each = run_jobs(replace(capped, fit_start=False), [(args.records, None), (args.records, None)])
    fixed = run_jobs(capped, [(args.records, args.fixed), (args.records, args.fixed)])
    alone = one.records_per_s
    rows = [
        row(f"one auto job of {2 * args.records:,}", [one], alone),
        row(f"two auto jobs of {args.records:,}", pair, alone),
        row(f"two auto jobs of {args.records:,}, each blind to the other (before)", alone_each, alone),
        row(f"two jobs of {args.records:,} at c={args.fixed}", fixed, alone),
    ]
    header = (
        "jobs",
        "each job's time (model s)",
        "slower / faster",
        "records/s (both)",
        "against one job alone",
        "peak limit",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for values in rows:
        print("| " + " | ".join(str(value) for value in values) + " |")
    print(
        f"\nKV cache for {args.kv_requests} requests, closed loop on a virtual clock, "
        f"{time.perf_counter() - started:.0f} s wall"
    )


if __name__ == "__main__":
    main()
