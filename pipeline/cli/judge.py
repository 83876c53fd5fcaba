"""``pipeline judge``: judge a sample's extracted values by keyboard in the browser (one variant, or two
blind), import judgments made elsewhere, or export the judged records as a gold file.

Each mode is one small function over the same parsed job and variants: ``--model`` has the job's judge
model (its ``judge:`` section, else its own model) judge every value of a larger sample.
"""

from __future__ import annotations

import contextlib
import getpass
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.common import (
    DatabaseOption,
    JobArgument,
    VariantOption,
    app,
    fail,
    load_job_or_exit,
    read_or_exit,
    sample_option,
    say_read_copy,
    seed_option,
    variant_names,
)
from pipeline.cli.logs import configure_logging
from pipeline.defaults import DEFAULT_JUDGING_PORT
from pipeline.errors import ConfigError, Ending, exit_code_for

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
JudgedSeedOption = Annotated[int, seed_option("--sample (and of the blind order)")]
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
ModelOption = Annotated[
    bool,
    typer.Option(
        "--model",
        help="No page: the job's judge model (`judge:` in the job, else its own model) judges every value "
        f"of the sample (default --sample {DEFAULT_MODEL_SAMPLE}); `eval --judged` then combines its "
        "judgments with people's.",
    ),
]
JudgeModelOption = Annotated[
    str | None, typer.Option(help="With --model: this model judges instead of the job's judge model.")
]
ExportOption = Annotated[
    Path | None,
    typer.Option("--export-gold", help="Write the judged records as a gold file (.jsonl) for `eval --gold`."),
]


@app.command("judge")
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
    model: ModelOption = False,
    judge_model: JudgeModelOption = None,
    database: DatabaseOption = None,
) -> None:
    """Judge extracted values in the browser, by keyboard: a correct, x wrong, space skip, Backspace undo, select text + m for a value the model missed.

    Serves a page on 127.0.0.1 until Ctrl-C; every judgment is written at once to the job's database (or, while a run holds it, to a journal beside it, written when the run ends). Reopening the page goes on where you stopped. With --import or --export-gold, no page: judgments are imported, or the judged records written as a gold file.
    """  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    from pipeline.judging.session import SessionOptions
    from pipeline.reports import Sample

    if variant is not None and variants is not None:
        raise fail(ConfigError("give --variant or --variants, not both"))
    if sum([import_file is not None, export_file is not None, model]) > 1:
        raise fail(ConfigError("give one of --import, --export-gold and --model"))
    if judge_model is not None and not model:
        raise fail(ConfigError("--judge-model goes with --model"))
    if judge_model is not None and not judge_model.strip():
        raise fail(ConfigError("--judge-model: give a model name"))
    spec = load_job_or_exit(job, database, variant)
    names = (
        (spec.variant,) if variants is None else read_or_exit(lambda: variant_names(spec, variants, least=2))
    )
    if import_file is not None:
        _import(spec, import_file, judge or login_name(), variant)
    elif model:
        _judge_by_model(spec, names, Sample(sample or DEFAULT_MODEL_SAMPLE, seed), judge_model)
    elif export_file is not None:
        given = tuple(name.strip() for name in judge.split(",") if name.strip()) if judge else None
        _export(spec, export_file, given, names if variant or variants else None)
    else:
        drawn = Sample(sample or DEFAULT_SAMPLE, seed)
        _serve(
            spec, SessionOptions(names, drawn, judge or login_name(), sample_given=sample is not None), port
        )


def login_name() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment or the password database
        return "judge"


def _import(spec: JobSpec, path: Path, judge: str, variant: str | None) -> None:
    from pipeline.judging.exchange import import_judgments

    imported = read_or_exit(lambda: import_judgments(spec, path, judge=judge, variant=variant))
    by_judge = ", ".join(f"{name}: {count:,}" for name, count in sorted(imported.judges.items()))
    typer.echo(f"imported {imported.count:,} judgments from {path} ({by_judge})")


def _export(
    spec: JobSpec, path: Path, judges: tuple[str, ...] | None, variants: tuple[str, ...] | None
) -> None:
    from pipeline.job.commands import Asked
    from pipeline.judging.exchange import export_gold

    export = read_or_exit(lambda: export_gold(spec, path, judges=judges, variants=variants))
    left = export.judged_records - export.records
    note = f"; {left:,} judged records have no field with every value judged" if left else ""
    typer.echo(f"wrote {path}: {export.records:,} gold records, judged by {', '.join(export.judges)}{note}")
    typer.echo(f"check:  {Asked.of(spec).command('eval', '--gold', str(path))}")


def _judge_by_model(spec: JobSpec, variants: tuple[str, ...], sample: Sample, model: str | None) -> None:
    from pipeline.job.commands import Asked
    from pipeline.judging.model import judge_sample_by_model

    configure_logging(json_lines=not sys.stderr.isatty(), level="warning")
    said_at = time.monotonic()

    def progress(so_far: ModelJudging) -> None:
        nonlocal said_at
        if time.monotonic() - said_at >= PROGRESS_EVERY_S:
            said_at = time.monotonic()
            typer.echo(f"{so_far.judge}: {_counts(so_far)}; {so_far.left:,} records left", err=True)

    done = read_or_exit(lambda: judge_sample_by_model(spec, variants, sample, model=model, progress=progress))
    typer.echo(
        f"{done.judge} judged {_counts(done)} in {done.seconds:.1f} s ({done.values_per_s:,.0f} values/s)"
    )
    if done.failed:
        classes = ", ".join(f"{name}: {count}" for name, count in sorted(done.failures.items()))
        typer.echo(f"{len(done.failed):,} records failed ({classes}); the same command judges them again")
    both = ("--variants", ",".join(variants)) if len(variants) > 1 else ()
    typer.echo(f"next:  {Asked.of(spec).command('eval', '--judged', *both)}")
    if done.failed:
        raise typer.Exit(exit_code_for(Ending.FAILURES))


def _counts(judging: ModelJudging) -> str:
    share = f", {judging.correct_share:.1%} correct" if judging.correct_share is not None else ""
    skipped = f"; {judging.skipped:,} judged before" if judging.skipped else ""
    return f"{judging.judged:,} of {judging.records:,} records ({judging.values:,} values{share}){skipped}"


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
        typer.echo(f"judging {len(session.records):,} records of {what} at {url} (Ctrl-C to stop)")
        sys.stdout.flush()

    def serve() -> None:
        # Ctrl-C before the page is up ends it too (once up, the server stops on it): nothing is unsaved.
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_judging(spec, options, ready, port=port))

    read_or_exit(serve)
