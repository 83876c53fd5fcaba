"""The ``pipeline`` command: parse arguments, configure logging, call the library, map exit codes.

Exit codes: 0 all done · 1 finished with failures · 2 configuration error · 3 run aborted (server
unreachable, key refused, model not served, database in use, local server failed) · 130 interrupted.
"""

from pipeline.cli import jobs, quality, results, servers  # noqa: F401  (registers the commands)
from pipeline.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()
