"""What the commands' options default to and list, where ``--help`` can read them cheaply.

Each value here is the default of a library function (or the choices of one of its arguments) that a
command's option shows in its help. The modules that take them (``run.check``, ``reports.*``,
``judging.server``, ``quality.bootstrap``) import DuckDB, the HTTP clients or rapidfuzz; the CLI
registers every command at import, so a default read from there would load all of that for
``pipeline --help``. Kept here, with nothing heavier than the error module beneath them, they are
one value each: the function and ``--help`` read the same name.

May import: :mod:`pipeline.errors`.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum

from pipeline.errors import FailureClass

#: ``check``: the probe requests made of a sample of the job's records, and how long one may take alone.
DEFAULT_PROBES = 3
DEFAULT_PROBE_TIMEOUT_S = 120.0

#: ``eval`` and ``compare``: the bootstrap's resamples over records for the 95% intervals, and its seed.
DEFAULT_RESAMPLES = 1000
DEFAULT_BOOTSTRAP_SEED = 0

#: ``compare``: how many of the most differing records are shown.
DEFAULT_SHOWN = 5

#: ``review``: the seeded sample of source records the page shows.
DEFAULT_REVIEW_SAMPLE = 100

#: ``report``: how many of the last runs are set side by side.
DEFAULT_RUNS = 10

#: ``judge``: the judging page's port on 127.0.0.1.
DEFAULT_JUDGING_PORT = 8780


class ExportFormat(StrEnum):
    """``export --format``: the files ``export`` writes."""

    PARQUET = "parquet"
    JSONL = "jsonl"
    CSV = "csv"


#: ``export``: the format an ``--out`` path's extension means when ``--format`` is not given.
FORMAT_BY_EXTENSION = {
    ".parquet": ExportFormat.PARQUET,
    ".jsonl": ExportFormat.JSONL,
    ".ndjson": ExportFormat.JSONL,
    ".csv": ExportFormat.CSV,
}


def class_names(allowed: Collection[FailureClass] = tuple(FailureClass)) -> list[str]:
    """``--class``'s choices: the ``allowed`` classes' names, in the order the failure classes are
    defined."""
    return [str(failure_class) for failure_class in FailureClass if failure_class in allowed]
