"""Commands that measure a job's results: eval (against a gold file), compare (two variants), review
(an HTML page to check them by eye)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from pipeline.cli.common import (
    DatabaseOption,
    JobArgument,
    JsonOption,
    SampleOption,
    SeedOption,
    VariantOption,
    app,
    fail,
    load_job_or_exit,
    read_or_exit,
    sample_option,
    say_read_copy,
    variant_names,
)
from pipeline.defaults import DEFAULT_BOOTSTRAP_SEED, DEFAULT_RESAMPLES, DEFAULT_REVIEW_SAMPLE, DEFAULT_SHOWN
from pipeline.errors import ConfigError
from pipeline.wording import counted

if TYPE_CHECKING:  # the measuring loads when a command runs (see pipeline.cli)
    from pipeline.job.spec import JobSpec
    from pipeline.reports import EvalSettings, JudgedSettings
    from pipeline.reports.review_page import ReviewPage

T = TypeVar("T")

HtmlOption = Annotated[
    Path | None, typer.Option(help="Also write the review page (one self-contained HTML file) here.")
]
FuzzyOption = Annotated[
    float | None,
    typer.Option(
        min=0,
        max=100,
        help="Text also matches when rapidfuzz fuzz.ratio of the normalised texts is at least this (0-100).",
    ),
]
ResamplesOption = Annotated[
    int, typer.Option(min=100, help="Bootstrap resamples over records for the 95% intervals.")
]
ResampleSeedOption = Annotated[
    int, typer.Option(help="The seed of the bootstrap: the same seed, the same intervals.")
]


def _write_page(page: ReviewPage | None, path: Path | None, *, to_stderr: bool = False) -> None:
    from pipeline.reports.review_page import write_review

    if page is None or path is None:
        return
    written = read_or_exit(lambda: write_review(page, path))
    _say_written(written, page, to_stderr=to_stderr)


def _say_written(path: Path, page: ReviewPage | None, *, to_stderr: bool = False) -> None:
    if page is not None:
        typer.echo(f"wrote {path} ({counted(len(page.records), 'record')})", err=to_stderr)


GoldOption = Annotated[
    Path | None,
    typer.Option(help="The gold file (.jsonl, .json or .csv): an id and the right values of some fields."),
]
JudgedOption = Annotated[
    bool,
    typer.Option(
        "--judged",
        help="Measure against the judgments of `pipeline judge` instead of a gold file: precision (and "
        "recall where misses were marked) for the whole run, from a judged sample.",
    ),
]
JudgeOption = Annotated[
    str | None,
    typer.Option(
        help="With --judged: count only this person's judgments, or use this model judge (model:NAME)."
    ),
]

PairOption = Annotated[
    str | None,
    typer.Option(
        "--variants",
        metavar="A,B",
        help="Two variants on the gold records both have: B - A per field, its interval and a verdict.",
    ),
]
FieldsOption = Annotated[
    str | None,
    typer.Option(help="Only these fields, comma-separated (default: every field the gold file gives)."),
]
ToleranceOption = Annotated[
    float, typer.Option(min=0, help="Numbers also match within this relative tolerance (0.05: 5%).")
]


@app.command("eval")
def eval_command(
    job: JobArgument,
    gold: GoldOption = None,
    judged: JudgedOption = False,
    judge: JudgeOption = None,
    variant: VariantOption = None,
    variants: PairOption = None,
    fields: FieldsOption = None,
    fuzzy: FuzzyOption = None,
    tolerance: ToleranceOption = 0.0,
    sample: SampleOption = None,
    seed: SeedOption = 0,
    resamples: ResamplesOption = DEFAULT_RESAMPLES,
    resample_seed: ResampleSeedOption = DEFAULT_BOOTSTRAP_SEED,
    as_json: JsonOption = False,
    html: HtmlOption = None,
    database: DatabaseOption = None,
) -> None:
    """Measure a variant's results against a gold file: accuracy per field, precision/recall/F1 per list, each with a 95% bootstrap interval; or, with --judged, against the judgments of a sample: precision (and recall) for the whole run.

    Also: how many grounded values were found in the record text, and every gold record without a result (failed, with its class; not extracted yet; not in the source). With --variants A,B: whether B is better than A, per field. With --judged and a model judge beside people: the people's precision and the combined one (prediction-powered inference), and how often the model agrees with them. The exit code is 0 whatever the scores.
    """  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    from pipeline.quality.bootstrap import Bootstrap
    from pipeline.reports import EvalSettings, JudgedSettings, Sample, evaluate, format_eval, parse_fields

    if variants is not None and variant is not None:
        raise fail(ConfigError("--variants compares two variants: give it without --variant"))
    gold_options = {
        "--fields": fields,
        "--fuzzy": fuzzy,
        "--tolerance": tolerance or None,
        "--sample": sample,
    }
    gold_file = _gold_file(gold, judged, judge, gold_options)
    spec = load_job_or_exit(job, database, variant)
    if gold_file is None:
        bootstrap = read_or_exit(lambda: Bootstrap(resamples, resample_seed))
        _eval_judged(spec, variants, JudgedSettings(judge, bootstrap, review=html is not None), as_json, html)
        return
    settings = read_or_exit(
        lambda: EvalSettings(
            parse_fields(fields),
            fuzzy,
            tolerance,
            review=html is not None,
            sample=Sample(sample, seed) if sample else None,
            bootstrap=Bootstrap(resamples, resample_seed),
        )
    )
    if variants is not None:
        _eval_pair(spec, gold_file, variants, settings, as_json, html)
        return
    report = read_or_exit(lambda: evaluate(spec, gold_file, settings))
    say_read_copy(report.read_copy)
    typer.echo(_json(report.to_json()) if as_json else format_eval(report))
    _write_page(report.review, html, to_stderr=as_json)


def _gold_file(
    gold: Path | None, judged: bool, judge: str | None, gold_options: dict[str, Any]
) -> Path | None:
    """The gold file to measure against, or None for the judgments (``--judged``); exit 2 unless
    exactly one of them is given, with only its own options."""
    problem = None
    if gold is not None and judged:
        problem = "--judged measures against judgments, --gold against a gold file: give one of them"
    elif gold is None and not judged:
        problem = "give --gold FILE (a gold file) or --judged (the judgments of `pipeline judge`)"
    elif judge is not None and not judged:
        problem = "--judge chooses whose judgments count: give it with --judged"
    elif judged and (given := [name for name, value in gold_options.items() if value is not None]):
        problem = f"--judged takes no {', '.join(given)} (options of matching a gold file)"
    if problem is not None:
        raise fail(ConfigError(problem))
    return gold


def _eval_judged(
    spec: JobSpec, variants: str | None, settings: JudgedSettings, as_json: bool, html: Path | None
) -> None:
    from pipeline.reports import (
        evaluate_judged,
        evaluate_judged_pair,
        format_judged_eval,
        format_paired_judged,
    )

    if variants is None:
        report = read_or_exit(lambda: evaluate_judged(spec, settings))
        say_read_copy(report.read_copy)
        typer.echo(_json(report.to_json()) if as_json else format_judged_eval(report))
        _write_page(report.review, html, to_stderr=as_json)
        return
    names = read_or_exit(lambda: variant_names(spec, variants, least=2))
    pair = read_or_exit(lambda: evaluate_judged_pair(spec, names, settings))
    say_read_copy(pair.read_copy)
    typer.echo(_json(pair.to_json()) if as_json else format_paired_judged(pair))
    _write_page(pair.review, html, to_stderr=as_json)


def _eval_pair(
    spec: JobSpec, gold: Path, variants: str, settings: EvalSettings, as_json: bool, html: Path | None
) -> None:
    from pipeline.reports import evaluate_pair, format_paired_eval

    names = read_or_exit(lambda: variant_names(spec, variants, least=2))
    pair = read_or_exit(lambda: evaluate_pair(spec, gold, names, settings))
    say_read_copy(pair.a.read_copy)
    typer.echo(_json(pair.to_json()) if as_json else format_paired_eval(pair))
    _write_page(pair.review, html, to_stderr=as_json)


def _json(data: dict[str, Any]) -> str:
    import orjson

    return orjson.dumps(data, default=str).decode()


@app.command()
def compare(
    job: JobArgument,
    variants: Annotated[str, typer.Option(metavar="A,B", help="The two variants; A is the reference.")],
    sample: SampleOption = None,
    seed: SeedOption = 0,
    show: Annotated[int, typer.Option(min=0, help="How many of the most differing records to show.")] = (
        DEFAULT_SHOWN
    ),
    as_json: JsonOption = False,
    html: Annotated[
        Path | None,
        typer.Option(
            help="Also write the compare page (one self-contained HTML file) here: these numbers, then "
            "the records side by side."
        ),
    ] = None,
    fuzzy: FuzzyOption = None,
    resamples: ResamplesOption = DEFAULT_RESAMPLES,
    resample_seed: ResampleSeedOption = DEFAULT_BOOTSTRAP_SEED,
    database: DatabaseOption = None,
) -> None:
    """Compare two variants on the records both extracted: agreement per field (A as the reference) with 95% intervals, tokens and latency per record, failures, grounding, and the records that differ most.

    Failures are counted over the records both variants attempted. Temperature 0 on vLLM is not deterministic: with a re-run of A (`pipeline run JOB --variant A --rerun`), each field's A-vs-B agreement is set beside A-vs-rerun, and the fields beyond that noise are flagged.
    """  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    from pipeline.quality.bootstrap import Bootstrap
    from pipeline.reports import CompareSettings, Sample, compare_page, compare_variants, format_compare

    spec = load_job_or_exit(job, database)
    reference, candidate = read_or_exit(lambda: variant_names(spec, variants, least=2))
    settings = CompareSettings(
        sample=Sample(sample, seed) if sample is not None else None,
        fuzzy_threshold=fuzzy,
        bootstrap=read_or_exit(lambda: Bootstrap(resamples, resample_seed)),
    )
    if html is None:
        report = read_or_exit(lambda: compare_variants(spec, reference, candidate, settings))
    else:
        report = read_or_exit(lambda: compare_page(spec, html, reference, candidate, settings))
    say_read_copy(report.read_copy)
    if as_json:
        typer.echo(_json(report.to_json(show)))
    else:
        database_text = str(database) if database is not None else None
        typer.echo(format_compare(report, job=str(job), show=show, database=database_text))
    if html is not None:
        _say_written(html, report.review, to_stderr=as_json)


@app.command()
def review(
    job: JobArgument,
    html: Annotated[Path, typer.Option(help="The HTML file to write; replaced if it exists.")],
    variant: VariantOption = None,
    variants: Annotated[
        str | None,
        typer.Option(
            metavar="A,B", help="Two variants side by side, with where they differ (not with --variant)."
        ),
    ] = None,
    sample: Annotated[
        int, sample_option("The seeded sample of N source records to show (as `run --sample`).")
    ] = DEFAULT_REVIEW_SAMPLE,
    seed: SeedOption = 0,
    database: DatabaseOption = None,
) -> None:
    """Write one self-contained HTML page to check extractions by eye: each record's text, each variant's extraction or failure, its grounded values highlighted in the text.

    Shows the records of the sample that the variant (of two: either) has a result or a failure for.
    """  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    from pipeline.reports import Sample, review_page

    if variant is not None and variants is not None:
        raise fail(ConfigError("give --variant or --variants, not both"))
    spec = load_job_or_exit(job, database, variant)
    names = (
        (spec.variant,) if variants is None else read_or_exit(lambda: variant_names(spec, variants, least=1))
    )
    page = read_or_exit(lambda: review_page(spec, html, names, Sample(sample, seed)))
    say_read_copy(page.read_copy)
    _say_written(html, page)
