"""What the property tests drew, for `make soak`'s figures: one JSON line per sequence in the file
``PIPELINE_PROPERTY_LOG`` names (nothing when it names none)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import orjson


def log_sequence(test: str, steps: int) -> None:
    """One sequence of ``test`` ended, after ``steps`` steps."""
    where = os.environ.get("PIPELINE_PROPERTY_LOG")
    if where:
        with Path(where).open("ab") as log:
            log.write(orjson.dumps({"test": test, "steps": steps}) + b"\n")


def figures(log: Path) -> list[str]:
    """One line per test of what ``log`` holds: its sequences and their steps."""
    sequences: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    for line in log.read_bytes().splitlines():
        entry = orjson.loads(line)
        sequences[entry["test"]] += 1
        steps[entry["test"]] += entry["steps"]
    return [f"{test}: {sequences[test]:,} sequences, {steps[test]:,} steps" for test in sorted(sequences)]


if __name__ == "__main__":
    print("\n".join(figures(Path(sys.argv[1]))))
