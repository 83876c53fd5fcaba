"""How long the intervals of ``pipeline eval`` take: measuring agreement, the bootstrap intervals of every
score (1,000 resamples), and the paired difference of two variants, on 10^3 to 10^5 records.

    .venv/bin/python benchmarks/bootstrap.py                   # 10^3, 10^4, 10^5 records
    .venv/bin/python benchmarks/bootstrap.py --records 100000 --resamples 2000

The records are synthetic extractions of the LinkedIn schema (schemas/linkedin.py, 27 scored paths):
a gold and two variants that agree with it most of the time, drawn with a fixed seed. Prints a table;
nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.quality.agreement import measure_agreement
from pipeline.quality.bootstrap import Bootstrap
from pipeline.quality.fields import schema_fields
from pipeline.quality.intervals import paired_differences, with_intervals
from schemas.linkedin import JobPosting

SKILLS = [f"skill {index}" for index in range(300)]
LEVELS = ["junior", "mid", "senior", "lead"]


def posting(rng: random.Random) -> dict[str, Any]:
    return {
        "title": f"Role {rng.randint(1, 500)}",
        "company": f"Company {rng.randint(1, 200)}",
        "location": rng.choice(["Leeds", "London", "York", None]),
        "remote_policy": rng.choice(["onsite", "hybrid", "remote", "unspecified"]),
        "seniority": rng.choice(LEVELS),
        "manages_people": rng.random() < 0.3,
        "explicit_skills": rng.sample(SKILLS, rng.randint(0, 8)),
        "benefits": rng.sample(SKILLS, rng.randint(0, 4)),
        "salary": {"minimum": float(rng.randint(20, 60) * 1000), "maximum": None, "currency": "GBP"},
    }


def noisy(rng: random.Random, gold: dict[str, Any], error: float) -> dict[str, Any]:
    """``gold`` with each field redrawn with probability ``error``."""
    other = posting(rng)
    return {name: other[name] if rng.random() < error else value for name, value in gold.items()}


def measure(records: int, bootstrap: Bootstrap) -> tuple[float, float, float, int]:
    rng = random.Random(0)
    gold = {index: posting(rng) for index in range(records)}
    a = {index: noisy(rng, value, 0.2) for index, value in gold.items()}
    b = {index: noisy(rng, value, 0.18) for index, value in gold.items()}
    specs = schema_fields(JobPosting)
    started = time.perf_counter()
    report_a = measure_agreement(gold, a, specs)
    report_b = measure_agreement(gold, b, specs)
    measured = (time.perf_counter() - started) / 2
    started = time.perf_counter()
    with_intervals(report_a, bootstrap)
    intervals = time.perf_counter() - started
    started = time.perf_counter()
    paired_differences(report_a, report_b, bootstrap)
    paired = time.perf_counter() - started
    return measured, intervals, paired, len(report_a.fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--resamples", type=int, default=1000)
    arguments = parser.parse_args()
    bootstrap = Bootstrap(resamples=arguments.resamples)
    print(f"{'records':>9}  {'paths':>5}  {'measure s':>9}  {'intervals s':>11}  {'paired diff s':>13}")
    for records in arguments.records:
        measured, intervals, paired, paths = measure(records, bootstrap)
        print(f"{records:>9,}  {paths:>5}  {measured:>9.2f}  {intervals:>11.2f}  {paired:>13.2f}")
    print(f"({bootstrap.describe()}; paired: two variants' columns under the same resamples, plus swaps)")


if __name__ == "__main__":
    main()
