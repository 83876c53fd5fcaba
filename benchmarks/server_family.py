"""`concurrency: auto` and several jobs on one server, over servers drawn at random from a family
(pipeline/bench/family_server.py: KV cache by tokens or by requests and its size, past it a cliff, a
decline or a queue, preempting or spilling, --max-num-seqs above or below it, chunked prefill, prefix
caching, speed, latency noise, /metrics with or without a queue), in the closed loop on the virtual clock.

    .venv/bin/python benchmarks/server_family.py                       # 200 servers, seed 0: about an hour
    .venv/bin/python benchmarks/server_family.py --servers 40 --seed 7 --most-fit 64

Hypothesis draws the servers from the same strategy as tests/properties/test_auto_family.py (from a
seed, no example database) and leans toward bad ones (``target``: each property's figure, the lower the
more interesting). For each property, how many servers it held on, and the worst server found: its
figure, all its figures, and its parameters (paste them as an ``@example`` of the property's test).
Prints a Markdown table; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings, target
from hypothesis import seed as hypothesis_seed
from support import print_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, of this checkout

from pipeline.bench.family_server import FamilySpec
from tests.support.server_family import PROPERTIES, figures, servers


def explore(count: int, seed: int, most_fit: int) -> tuple[dict[str, list[tuple[float, FamilySpec]]], int]:
    """Every property's margins over ``count`` servers drawn from ``seed``, worst first; and how many."""
    margins: dict[str, list[tuple[float, FamilySpec]]] = {prop.name: [] for prop in PROPERTIES}
    drawn: list[FamilySpec] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate, Phase.target],
        suppress_health_check=list(HealthCheck),
    )
    @given(servers(most_fit))
    def draw(server: FamilySpec) -> None:
        started = time.perf_counter()
        for prop in PROPERTIES:
            margin = prop.margin(server)
            target(-margin, label=prop.name)
            margins[prop.name].append((margin, server))
        drawn.append(server)
        print(
            f"{len(drawn)}: {time.perf_counter() - started:.0f} s: {figures(server)}: {server!r}",
            file=sys.stderr,
            flush=True,
        )

    draw()
    return {name: sorted(found, key=lambda pair: pair[0]) for name, found in margins.items()}, len(drawn)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=200, help="servers to draw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--most-fit", type=int, default=128, help="the most of the job's requests a KV cache holds"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    margins, drawn = explore(args.servers, args.seed, args.most_fit)
    rows = []
    for prop in PROPERTIES:
        found = margins[prop.name]
        worst_margin, worst = found[0]
        held = sum(1 for margin, _ in found if margin >= 0)
        rows.append(
            (
                f"{prop.words} >= {prop.at_least:g}",
                f"{held} of {len(found)}",
                f"{(1 + worst_margin) * prop.at_least:.3f}",
                figures(worst),
                f"`{worst!r}`",
            )
        )
    header = ("property", "held on", "worst figure", "the worst server's figures", "its parameters")
    print_rows(header, rows)
    wall = time.perf_counter() - started
    print(
        f"\n{drawn} servers drawn from seed {args.seed} (KV caches of up to {args.most_fit}),"
        f" {wall:.0f} s wall"
    )


if __name__ == "__main__":
    main()
