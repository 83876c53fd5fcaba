"""What a finished run's numbers are, read where a person or a scraper reads them: its row in the runs
table, the Prometheus textfile it wrote, and the chat requests the simulator counted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from pipeline.store.numbers import RunNumbers
from tests.support.jobs import table_rows
from tests.support.processes import sim_metric


def prometheus(textfile: Path) -> dict[str, float]:
    """Each series of the textfile summed over its labels other than ``job``, and each labelled one too."""
    values: dict[str, float] = {}
    for line in textfile.read_text().splitlines():
        match = re.fullmatch(r"(\w+)\{([^}]*)\} (\S+)", line)
        if match is None:
            continue
        name, labels, value = match.groups()
        other = ",".join(label for label in labels.split(",") if not label.startswith("job="))
        values[name] = values.get(name, 0.0) + float(value)
        if other:
            values[f"{name}{{{other}}}"] = float(value)
    return values


def stored(database: Path) -> tuple[str, RunNumbers]:
    """The newest run's status and numbers, as its row has them."""
    with_names = table_rows(database, "SELECT to_json(runs) FROM runs ORDER BY run_id DESC LIMIT 1")
    row: dict[str, Any] = orjson.loads(with_names[0][0])
    return str(row["status"]), RunNumbers.of(row)


def sim_requests(url: str) -> int:
    """The chat requests the simulator received (/tokenize aside)."""
    return int(sim_metric(url, "pipeline_sim:chat_requests_total"))
