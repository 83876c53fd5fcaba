"""The ``pipeline`` command: parse arguments, configure logging, call the library, print, exit.

Exit codes (decided in :mod:`pipeline.errors`): 0 all done · 1 finished with failures · 2
configuration error · 3 run aborted (server unreachable, key refused, model not served, database in
use, local server failed) · 4 already running · 5 stalled · 130 interrupted.

May import every package: it is the top layer.
"""

# Importing a command's module registers it; this order is the order of `pipeline --help`.
# isort: off
from pipeline.cli import load, run, status  # noqa: F401
from pipeline.cli import quality, results, sim, servers  # noqa: F401
from pipeline.cli import judge  # noqa: F401
from pipeline.cli import check  # noqa: F401

# isort: on
from pipeline.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()
