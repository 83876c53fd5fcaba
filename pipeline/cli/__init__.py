"""The ``pipeline`` command: parse arguments, configure logging, call the library, print, exit.

Exit codes (decided in :mod:`pipeline.errors`: :func:`~pipeline.errors.exit_code_for`, through
:func:`~pipeline.cli.common.run_or_exit`): 0 all done · 1 finished with failures · 2 configuration
error, nothing sent (a bad job, option or input, a model the server does not serve, the ``local``
extra missing, a duckdb_memory_limit too small) · 3 aborted (server unreachable, key refused, the
server gone, its answers stopped validating, the database held by another process or failing, the
local server failed) · 4 already running · 5 stalled · 130 interrupted.

May import every package: it is the top layer. Every command registers at import, so ``pipeline --help``
imports every command's module: at their top these import only typer, the standard library,
:mod:`pipeline.errors` and :mod:`pipeline.defaults` (the defaults ``--help`` shows); what a command
needs (the job spec, DuckDB, the HTTP clients, rapidfuzz) is imported in the function that uses it,
its types under ``TYPE_CHECKING``. ``tests/test_imports.py`` holds what ``--help`` loads.
"""

# Importing a command's module registers it; this order is the order of `pipeline --help`.
# isort: off
from pipeline.cli import load, run, status  # noqa: F401  (importing it registers its commands)
from pipeline.cli import quality, results, sim, servers  # noqa: F401  (importing it registers its commands)
from pipeline.cli import judge  # noqa: F401  (importing it registers its commands)
from pipeline.cli import check  # noqa: F401  (importing it registers its commands)

# isort: on
from pipeline.cli.common import app

__all__ = ["app", "main"]


def main() -> None:
    app()
