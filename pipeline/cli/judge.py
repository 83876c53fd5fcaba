"""``pipeline judge``: judge a sample's extracted values by keyboard in the browser (one variant, or two
blind), import judgments made elsewhere, or export the judged records as a gold file.

Each mode is one small function over the same parsed job and variants: ``--by-model`` has the job's
judge model (its ``judge:`` section, else its own model; ``--judge-model`` and ``--endpoint`` another, on
another server) judge every value of a larger sample. ``--model`` names the model that extracts in run,
status and check; here it is refused with what to give instead (it was this command's flag).
"""

from __future__ import annotations

import contextlib
import getpass
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from pipeline.cli.common import (
    DatabaseOption,
    JobArgument,
    VariantOption,
    app,
    fail,
    load_job_or_exit,
    read_or_exit,
    run_or_exit,
    sample_option,
    say_read_copy,
    seed_option,
    variant_names,
)
from pipeline.cli.logs import configure_logging
from pipeline.defaults import DEFAULT_JUDGING_PORT
from pipeline.errors import ConfigError, Ending, exit_code_for
from pipeline.wording import counted

if TYPE_CHECKING:  # judging loads when the command runs (see pipeline.cli)
    from pipeline.job.spec import JobSpec
    from pipeline.judging.model import ModelJudging
    from pipeline.judging.session import JudgingSession, SessionOptions
    from pipeline.reports import Sample

#: The sample a person judges on the page when --sample is not given.
DEFAULT_SAMPLE = 50
VariantsOption = Annotated[
    str | None,
    typer.Option(
        metavar="A,B",
        help="Two variants judged blind: the same records, their answers shown as 1 and 2 in an order "
        "drawn per record; the page never says which is which.",
    ),
]
JudgedSampleOption = Annotated[
    int | None,
    sample_option(
        f"The seeded sample of N source records (as `run --sample`) that have results "
        f"(default: {DEFAULT_SAMPLE}, or as many of them as have results)."
    ),
]
JudgedSeedOption = Annotated[int, seed_option("--sample: the same seed, the same records")]
PortOption = Annotated[
    int, typer.Option(min=0, max=65535, help="The page's port on 127.0.0.1 (0: a free one).")
]
JudgeOption = Annotated[
    str | None,
    typer.Option(
        "--judge",
        help="Your name in the judgments (default: your login name). With --export-gold: whose "
        "judgments, comma-separated (default: every person's).",
    ),
]
ImportOption = Annotated[
    Path | None,
    typer.Option(
        "--import",
        help="Import judgments from this file (JSON lines, or a .json list): record_id, variant, field, "
        "value, verdict, judge.",
    ),
]
#: A model judges a larger sample than a person: its judgments calibrated by people's narrow the interval.
DEFAULT_MODEL_SAMPLE = 500
PROGRESS_EVERY_S = 10.0
ByModelOption = Annotated[
    bool,
    typer.Option(
        "--by-model",
        help="No page: the job's judge model (`judge:` in the job, else its own model) judges every value "
        f"of the sample (default --sample {DEFAULT_MODEL_SAMPLE}); `eval --judged` then combines its "
        "judgments with people's.",
    ),
]
JudgeModelOption = Annotated[
    str | None,
    typer.Option(help="This model judges, instead of the job's judge model (no page: as --by-model)."),
]
JudgeEndpointOption = Annotated[
    str | None,
    typer.Option(
        "--endpoint",
        help="With --by-model or --judge-model: the judge's server, a base URL (http://gpu-box:8000/v1), "
        "instead of the one `judge:` (else the job) names.",
    ),
]


class _JudgeCommand(TyperCommand):
    """``--model`` was this command's flag, and is a model name in run, status and check: typed here
    (``--model`` or ``--model NAME``), it is answered with what to give instead, before click would
    refuse it as unknown (an option declared hidden for it would be offered as click's "did you mean")."""

    # ctx is typer's vendored click Context, which typer does not export.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        for index, arg in enumerate(args):
            if arg == "--model" or arg.startswith("--model="):
                following = args[index + 1] if index + 1 < len(args) else ""
                named = not following.startswith("-") and not following.endswith((".yaml", ".yml"))  # the job
                name = arg.partition("=")[2] or (following if named else "")
                raise fail(ConfigError(_no_model_option(name)))
        return super().parse_args(ctx, args)


ExportOption = Annotated[
    Path | None,
    typer.Option("--export-gold", help="Write the judged records as a gold file (.jsonl) for `eval --gold`."),
]


@app.command("judge", cls=_JudgeCommand)
def judge_command(
    job: JobArgument,
    variant: VariantOption = None,
    variants: VariantsOption = None,
    sample: JudgedSampleOption = None,
    seed: JudgedSeedOption = 0,
    port: PortOption = DEFAULT_JUDGING_PORT,
    judge: JudgeOption = None,
    import_file: ImportOption = None,
    export_file: ExportOption = None,
    by_model: ByModelOption = False,
    judge_model: JudgeModelOption = None,
    endpoint: JudgeEndpointOption = None,
    database: DatabaseOption = None,
) -> None:
    """Judge extracted values in the browser, by keyboard: a correct, x wrong, space skip, Backspace undo, select text + m for a value the model missed.

    Serves a page on 127.0.0.1 until Ctrl-C; every judgment is written at once to the job's database (or, while a run holds it, to a journal beside it, written when the run ends). Reopening the page goes on where you stopped. With --import or --export-gold, no page: judgments are imported, or the judged records written as a gold file.
    """  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    from pipeline.judging.session import SessionOptions
    from pipeline.reports import Sample

    by_model = by_model or judge_model is not None
    _check_options(variant, variants, [import_file, export_file, by_model or None])
    if judge_model is not None and not judge_model.strip():
        raise fail(ConfigError("--judge-model: give a model name"))
    if endpoint is not None:
        endpoint = _judge_server(endpoint, by_model)
    spec = load_job_or_exit(job, database, variant)
    names = (
        (spec.variant,) if variants is None else read_or_exit(lambda: variant_names(spec, variants, least=2))
    )
    if import_file is not None:
        _import(spec, import_file, judge or login_name(), variant)
    elif by_model:
        _judge_by_model(spec, names, Sample(sample or DEFAULT_MODEL_SAMPLE, seed), judge_model, endpoint)
    elif export_file is not None:
        given = tuple(name.strip() for name in judge.split(",") if name.strip()) if judge else None
        _export(spec, export_file, given, names if variant or variants else None)
    else:
        drawn = Sample(sample or DEFAULT_SAMPLE, seed)
        _serve(
            spec, SessionOptions(names, drawn, judge or login_name(), sample_given=sample is not None), port
        )


def _check_options(variant: str | None, variants: str | None, modes: list[object]) -> None:
    """One line and exit 2 for options that do not go together, before the job is read."""
    if variant is not None and variants is not None:
        raise fail(ConfigError("give --variant or --variants, not both"))
    if sum(mode is not None for mode in modes) > 1:
        raise fail(ConfigError("give one of --import, --export-gold and --by-model (or --judge-model)"))


def _no_model_option(name: str) -> str:
    """What ``judge --model [NAME]`` (this command's old flag; a model name in run, status and check) says."""
    instead = (
        f"give --judge-model {name} to have {name} judge the sample"
        if name
        else "give --by-model to have the job's judge model judge the sample, --judge-model NAME for another"
    )
    return f"judge has no --model (in run, status and check it names the model that extracts): {instead}"


def _judge_server(endpoint: str, by_model: bool) -> str:
    """``--endpoint``: the judge model's server, checked as the job file's URLs are."""
    from pipeline.servers.config import checked_url_option

    if not by_model:
        raise fail(
            ConfigError("--endpoint is the judge model's server: give it with --by-model or --judge-model")
        )
    return run_or_exit(lambda: checked_url_option("--endpoint", endpoint))


def login_name() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment or the password database
        return "judge"


def _import(spec: JobSpec, path: Path, judge: str, variant: str | None) -> None:
    from pipeline.judging.exchange import import_judgments

    imported = read_or_exit(lambda: import_judgments(spec, path, judge=judge, variant=variant))
    merged = imported.merged
    by_judge = ", ".join(f"{name}: {count:,}" for name, count in sorted(imported.judges.items()))
    typer.echo(
        f"imported {counted(imported.count, 'judgment')} from {path} ({by_judge}): {merged.added:,} added, "
        f"{merged.replaced:,} replaced (another verdict), {merged.unchanged:,} left as they were"
    )


def _export(
    spec: JobSpec, path: Path, judges: tuple[str, ...] | None, variants: tuple[str, ...] | None
) -> None:
    from pipeline.job.commands import Asked
    from pipeline.judging.exchange import export_gold

    export = read_or_exit(lambda: export_gold(spec, path, judges=judges, variants=variants))
    left = export.judged_records - export.records
    note = (
        f"; left out: {counted(left, 'judged record')} with no field settled (every value judged)"
        if left
        else ""
    )
    if export.unreadable:
        note += f"; {counted(export.unreadable, 'value')} marked missing not of its field's kind, left out"
    judged_by = ", ".join(export.judges)
    typer.echo(f"wrote {path}: {counted(export.records, 'gold record')}, judged by {judged_by}{note}")
    typer.echo(f"check:  {Asked.of(spec).command('eval', '--gold', str(path))}")


def _judge_by_model(
    spec: JobSpec, variants: tuple[str, ...], sample: Sample, model: str | None, endpoint: str | None
) -> None:
    from pipeline.job.commands import Asked
    from pipeline.judging.model import judge_sample_by_model

    configure_logging(json_lines=not sys.stderr.isatty(), level="warning")
    said_at = time.monotonic()

    def progress(so_far: ModelJudging) -> None:
        nonlocal said_at
        if time.monotonic() - said_at >= PROGRESS_EVERY_S:
            said_at = time.monotonic()
            typer.echo(f"{so_far.judge}: {_counts(so_far)}; {counted(so_far.left, 'record')} left", err=True)

    done = read_or_exit(
        lambda: judge_sample_by_model(
            spec, variants, sample, model=model, endpoint=endpoint, progress=progress
        )
    )
    typer.echo(
        f"{done.judge} judged {_counts(done)} in {done.seconds:.1f} s ({done.values_per_s:,.0f} values/s)"
    )
    if done.failed:
        classes = ", ".join(f"{name}: {count}" for name, count in sorted(done.failures.items()))
        failed = counted(len(done.failed), "record")
        typer.echo(f"{failed} failed ({classes}); the same command judges them again")
    both = ("--variants", ",".join(variants)) if len(variants) > 1 else ()
    typer.echo(f"next:  {Asked.of(spec).command('eval', '--judged', *both)}")
    if done.failed:
        raise typer.Exit(exit_code_for(Ending.FAILURES))


def _counts(judging: ModelJudging) -> str:
    share = f", {judging.correct_share:.1%} correct" if judging.correct_share is not None else ""
    skipped = f"; {judging.skipped:,} judged before" if judging.skipped else ""
    values = counted(judging.values, "value")
    return f"{judging.judged:,} of {counted(judging.records, 'record')} ({values}{share}){skipped}"


def _serve(spec: JobSpec, options: SessionOptions, port: int) -> None:
    import asyncio

    from pipeline.judging.journal import journal_path
    from pipeline.judging.server import serve_judging

    configure_logging(json_lines=not sys.stderr.isatty(), level="warning")

    def ready(session: JudgingSession, url: str) -> None:
        say_read_copy(session.read_copy)
        waiting = journal_path(spec.database)
        if waiting.exists():
            typer.echo(
                f"note: judgments wait in {waiting}: a run holds the database; written when it ends", err=True
            )
        what = (
            f"variants {' and '.join(options.variants)}, blind,"
            if options.blind
            else f"variant {options.variants[0]}"
        )
        typer.echo(f"judging {counted(len(session.records), 'record')} of {what} at {url} (Ctrl-C to stop)")
        sys.stdout.flush()

    def serve() -> None:
        # Ctrl-C before the page is up ends it too (once up, the server stops on it): nothing is unsaved.
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_judging(spec, options, ready, port=port))

    read_or_exit(serve)
