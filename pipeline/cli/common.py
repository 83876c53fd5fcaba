"""The Typer app and what every command shares: options, logging, error output and exit codes (each
from :func:`pipeline.errors.exit_code_for`, through :func:`fail` and :func:`run_or_exit`)."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from pipeline.cli.logs import LOG_LEVELS, configure_logging
from pipeline.errors import ConfigError, Ending, FatalRunError, exit_code_for

if TYPE_CHECKING:  # what a command needs loads when it runs, not for `pipeline --help` (see pipeline.cli)
    from pipeline.job.spec import JobSpec
    from pipeline.run.options import VariantOptions
    from pipeline.store.read_copy import ReadCopy

#: Options whose value may be left out, and what they mean then: ``--redo-stale`` alone redoes every
#: job cause, ``--redo-stale prompt,schema`` only those (click has no optional option values).
OPTIONAL_VALUES = {"--redo-stale": "all"}
_CAUSE_LIST = re.compile(r"^[a-z]+(,[a-z]*)*$")


def with_optional_values(args: list[str]) -> list[str]:
    """``args`` with the implied value after an optional-value option that was given none."""
    completed: list[str] = []
    for index, arg in enumerate(args):
        completed.append(arg)
        implied = OPTIONAL_VALUES.get(arg)
        following = args[index + 1] if index + 1 < len(args) else None
        if implied is not None and (following is None or not _CAUSE_LIST.match(following)):
            completed.append(implied)
    return completed


class _Commands(TyperGroup):
    # ctx is typer's vendored click Context, which typer does not export.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, with_optional_values(args))


T = TypeVar("T")

app = typer.Typer(
    cls=_Commands,
    help="Concurrency-first batch LLM extraction: DuckDB in, validated JSON out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def version_line() -> str:
    """What ``pipeline --version`` prints: the installed package's version and the Python it runs on."""
    from importlib.metadata import PackageNotFoundError, version  # only when asked: it is not light

    try:
        installed = version("pipeline")
    except PackageNotFoundError:  # run from a checkout that was never installed
        installed = "(not installed)"
    python = ".".join(str(part) for part in sys.version_info[:3])
    return f"pipeline {installed} (Python {python}, {sys.executable})"


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(version_line())
        raise typer.Exit


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Options of `pipeline` itself, before the command."""


class Display(StrEnum):
    AUTO = "auto"
    BAR = "bar"
    LOG = "log"


class LogFormat(StrEnum):
    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


JobArgument = Annotated[Path, typer.Argument(help="The job spec, e.g. jobs/linkedin.yaml.")]

DatabaseOption = Annotated[
    Path | None, typer.Option(help="Use this DuckDB file instead of the job's `database` (e.g. for a trial).")
]

VariantOption = Annotated[
    str | None,
    typer.Option(help="The variant (declared under `variants:` in the job, or any name); default: main."),
]

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def sample_option(help_text: str = "Only records of a seeded random sample of N source records.") -> Any:
    """``--sample N``: a seeded sample of the source (:func:`pipeline.source.pending.sample_sql`)."""
    return typer.Option(min=1, help=help_text)


def seed_option(seeds: str = "--sample: the same seed, the same records") -> Any:
    """``--seed S``, with what it ``seeds`` in its help."""
    return typer.Option(help=f"The seed of {seeds}.")


SampleOption = Annotated[int | None, sample_option()]
SeedOption = Annotated[int, seed_option()]

LogFormatOption = Annotated[LogFormat, typer.Option(help="auto: JSON lines unless stderr is a terminal.")]

LogLevelOption = Annotated[str, typer.Option(help=f"One of {', '.join(LOG_LEVELS)}.")]


def event_loop_options() -> dict[str, Any]:
    """uvloop where it is installed: the event loop is the client's hot path at thousands of req/s."""
    try:
        import uvloop  # noqa: F401  (only to learn it is installed: anyio imports it itself)
    except ImportError:
        return {}
    return {"use_uvloop": True}


def setup_logging(log_format: LogFormat, log_level: str) -> None:
    """Logging as the options ask; an unknown ``--log-level`` is one line and exit 2."""
    if log_level.lower() not in LOG_LEVELS:
        raise fail(ConfigError(f"--log-level {log_level!r}: must be one of {', '.join(LOG_LEVELS)}"))
    json_lines = log_format is LogFormat.JSON or (log_format is LogFormat.AUTO and not sys.stderr.isatty())
    configure_logging(json_lines=json_lines, level=log_level)


def fail(error: FatalRunError, *, reading: bool = False) -> typer.Exit:
    """``error`` said in one line on stderr; the exit to raise, with its code (``reading``: for a
    command that only reads the job's database, see :func:`pipeline.errors.exit_code_for`)."""
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(exit_code_for(error, reading=reading))


def run_or_exit(call: Callable[[], T], *, reading: bool = False) -> T:
    """``call()``, a command's work: a fatal error is one line and its exit code (:func:`fail`), Ctrl-C
    is exit 130 without a traceback."""
    try:
        return call()
    except FatalRunError as error:
        raise fail(error, reading=reading) from error
    except KeyboardInterrupt:
        raise typer.Exit(exit_code_for(Ending.INTERRUPTED)) from None


def read_or_exit(read: Callable[[], T]) -> T:
    """:func:`run_or_exit` for a command's reading of the job's database: a database a run holds is
    exit 3 (a reader is not the run that is already running)."""
    return run_or_exit(read, reading=True)


def load_job_or_exit(job: Path, database: Path | None = None, variant: str | None = None) -> JobSpec:
    """The job file, as ``variant`` makes it, on ``database`` if given; exit 2 on any problem.

    ``--database`` in a folder that does not exist is a typo, not a new job: refused before anything
    is created (:func:`in_an_existing_folder`)."""
    return run_or_exit(lambda: _job_on(job, database, variant))


def _job_on(job: Path, database: Path | None, variant: str | None) -> JobSpec:
    from pipeline.job.spec import load_job

    path = in_an_existing_folder("--database", database) if database is not None else None
    spec = load_job(job)
    if variant is not None:
        spec = spec.for_variant(variant)
    return spec.with_overrides(database=path)


def in_an_existing_folder(option: str, path: Path) -> Path:
    """``path``, given as ``option`` (--database, --out), resolved: a file the command writes goes into a
    folder that exists. One that does not is a typo, refused before anything is created, not made."""
    resolved = path.expanduser().resolve()
    if not resolved.parent.is_dir():
        raise ConfigError(f"{option} {path}: folder {resolved.parent} does not exist (nothing was created)")
    return resolved


@contextmanager
def saying_a_new_database(spec: JobSpec, database: Path | None) -> Iterator[None]:
    """Around the work of a command that creates the job's database (run, load): once it succeeded, a
    line on stderr when ``--database`` named a file that did not exist and does now. A command that
    fails creates nothing (:func:`pipeline.store.opening.new_database`), so says nothing of it."""
    new = database is not None and not spec.database.exists()
    yield
    if new and spec.database.exists():
        typer.echo(f"note: --database {database} did not exist: a new database was created there", err=True)


def variant_names(spec: JobSpec, text: str, *, least: int) -> tuple[str, ...]:
    """``--variants A,B`` (at least ``least`` names), each a variant of the job: a bad name is a
    :class:`ConfigError` naming the rule."""
    from pipeline.reports.comparison import parse_variants

    names = parse_variants(text, least=least)
    for name in names:
        spec.for_variant(name)
    return names


def say_kept_options(made: VariantOptions, variant: str, does: str) -> None:
    """On stderr: the variant ``does`` (runs, is judged) with the options its last run was given."""
    if made.kept:
        from pipeline.job.variants import rerun_of

        maker = rerun_of(variant)  # a re-run's are those of the variant it repeats
        whose = f"variant {maker} was" if maker else "it was"
        typer.echo(
            f"note: variant {variant} {does} with the options {whose} made with, kept with its last run: "
            f"{shlex.join(made.words_of_making())} (give --model, --prompt-file or --local for others)",
            err=True,
        )


def say_read_copy(copy: ReadCopy | str | None) -> None:
    """On stderr (stdout stays the report): the numbers come from a running job's read copy (``copy``,
    or how a page described it)."""
    if copy is not None:
        described = copy if isinstance(copy, str) else copy.describe()
        typer.echo(f"note: a run holds the database; read from its copy, {described}", err=True)
