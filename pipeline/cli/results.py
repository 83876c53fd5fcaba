"""Commands that read a job's output: failures, export, report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from pipeline.cli.common import (
    DatabaseOption,
    JobArgument,
    JsonOption,
    VariantOption,
    app,
    in_an_existing_folder,
    load_job_or_exit,
    read_or_exit,
    run_or_exit,
    say_read_copy,
)
from pipeline.defaults import DEFAULT_RUNS, FORMAT_BY_EXTENSION
from pipeline.errors import Ending, FailureClass, exit_code_for
from pipeline.wording import counted

if TYPE_CHECKING:  # the reading loads when a command runs (see pipeline.cli)
    from pipeline.reports.export import ExportReport
    from pipeline.reports.failures import FailureReport

T = TypeVar("T")


@app.command()
def failures(
    job: JobArgument,
    failure_classes: Annotated[
        list[str] | None,
        typer.Option("--class", metavar="CLASS", help="Only this failure class (repeatable)."),
    ] = None,
    examples: Annotated[int, typer.Option(min=0, help="Examples to show per class.")] = 3,
    as_json: JsonOption = False,
    database: DatabaseOption = None,
    variant: VariantOption = None,
) -> None:
    """Failures by class, largest first, with a few examples each and how to retry them."""
    import orjson

    from pipeline.job.commands import Asked
    from pipeline.reports.failures import failure_report, parse_failure_classes

    spec = load_job_or_exit(job, database, variant)
    classes = read_or_exit(lambda: parse_failure_classes(failure_classes or []))
    report = read_or_exit(lambda: failure_report(spec, classes, examples))
    say_read_copy(report.read_copy)
    if as_json:
        typer.echo(orjson.dumps(report.to_json(), default=str).decode())
        return
    asked = Asked(job, database, variant)
    retry = asked.command("run", "--only-failed", *(word for name in classes for word in ("--class", name)))
    typer.echo(_failures_text(report, classes, retry))


def _failures_text(report: FailureReport, asked: list[FailureClass], retry_command: str) -> str:
    where = f"{report.database} (table {report.table})"
    if not report.classes:
        of_classes = f" of class {', '.join(asked)}" if asked else ""
        return f"no failures{of_classes} in {where}"
    lines = [f"{counted(report.total, 'failure')} in {where}"]
    for summary in report.classes:
        lines += ["", f"{summary.failure_class}: {summary.count:,}"]
        if summary.advice:
            lines.append(f"  what to do: {summary.advice}")
        for example in summary.examples:
            attempts = counted(example.attempts, "attempt") if example.attempts is not None else "?"
            lines.append(f"  id {example.record_id} ({attempts}): {example.message}")
            if example.raw_output:
                lines.append(f"      output: {example.raw_output}")
        if summary.count > len(summary.examples) and summary.examples:
            lines.append(f"  … and {summary.count - len(summary.examples):,} more")
    lines += ["", f"retry them (no new record is taken): {retry_command}"]
    return "\n".join(lines)


ExportOutOption = Annotated[Path, typer.Option("--out", help="The file to write; replaced if it exists.")]
ExportFormatOption = Annotated[
    str | None,
    typer.Option(
        "--format",
        metavar="parquet|jsonl|csv",
        help=f"Default: from --out's extension ({', '.join(FORMAT_BY_EXTENSION)}).",
    ),
]
IncludeFailuresOption = Annotated[
    bool,
    typer.Option(
        help="Also write the failures (same format) beside --out: "
        "results.parquet -> results.failures.parquet."
    ),
]
HistoryOption = Annotated[
    bool,
    typer.Option(
        "--history",
        help="Also write the results that redos replaced beside --out: "
        "results.parquet -> results.history.parquet (with superseded_at, superseded_by_run).",
    ),
]
FlattenOption = Annotated[
    bool,
    typer.Option(
        "--flatten",
        help="A column per schema field instead of extracted (salary.minimum, requirements[].text); "
        "lists are arrays, in CSV joined with '; '.",
    ),
]


@app.command("export")
def export_command(
    job: JobArgument,
    out: ExportOutOption,
    file_format: ExportFormatOption = None,
    include_failures: IncludeFailuresOption = False,
    history: HistoryOption = False,
    flatten: FlattenOption = False,
    database: DatabaseOption = None,
    variant: VariantOption = None,
) -> None:
    """Write the results, joined to the source ids, to Parquet, JSON lines or CSV.

    One row per result whose id is still in the source, in no particular order.

    Columns: the id (named as the job's source.id_column), extracted (nested JSON in jsonl, JSON in parquet, JSON text in csv), model, attempts, prompt_tokens, completion_tokens, reasoning_tokens (of the last attempt), finish_reason, created_at (UTC), variant, run_id, latency_s, max_tokens, total_prompt_tokens, total_completion_tokens, total_reasoning_tokens, total_latency_s (over every attempt), and the version key: content_hash, prompt_hash, schema_hash, settings_hash. With --flatten, extracted is replaced by a column per schema field, typed as the schema says.

    The file is written beside --out and renamed into place: an interrupted export leaves no half file.
    """  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    from pipeline.reports.export import export_results
    from pipeline.reports.variants import require_known_variant

    spec = load_job_or_exit(job, database, variant)
    run_or_exit(lambda: in_an_existing_folder("--out", out))  # as --database: never made
    read_or_exit(lambda: require_known_variant(spec))
    report = read_or_exit(
        lambda: export_results(
            spec, out, file_format, include_failures=include_failures, history=history, flatten=flatten
        )
    )
    say_read_copy(report.read_copy)
    typer.echo(_export_text(report))


def _export_text(report: ExportReport) -> str:
    text = f"exported {counted(report.rows, 'result')} to {report.out} ({report.format})"
    if report.failures_out is not None:
        text += f", {counted(report.failure_rows or 0, 'failure')} to {report.failures_out}"
    if report.history_out is not None:
        text += f", {counted(report.history_rows or 0, 'replaced result')} to {report.history_out}"
    return text


@app.command()
def report(
    job: JobArgument,
    runs: Annotated[int, typer.Option(min=1, help="How many of the last runs to show.")] = DEFAULT_RUNS,
    as_json: JsonOption = False,
    html: Annotated[
        Path | None, typer.Option(help="Also write the report page (one self-contained HTML file) here.")
    ] = None,
    fail_on_drift: Annotated[
        bool,
        typer.Option(
            help="Exit 1 when the newest run drifted for the worse, or in a number with no better side "
            "(for a nightly cron line); an improvement, or a run not judged (nothing to do, far smaller "
            "than usual, a retry of failures), is 0. Only the newest run is judged: a drift alerts once."
        ),
    ] = False,
    database: DatabaseOption = None,
    variant: VariantOption = None,
) -> None:
    """The last runs side by side: fill rate and grounded share per field, tokens, latency, failures and speed, with their trends, and what moved in the newest run beyond its usual run-to-run variation, which way, and against which runs."""  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    import orjson

    from pipeline.reports.pages import runs_page
    from pipeline.reports.runs_report import format_runs_report, runs_report

    spec = load_job_or_exit(job, database, variant)
    found = read_or_exit(lambda: runs_report(spec, runs) if html is None else runs_page(spec, html, runs))
    say_read_copy(found.read_copy)
    data = found.to_json()
    typer.echo(orjson.dumps(data, default=str).decode() if as_json else format_runs_report(found))
    if html is not None:
        typer.echo(f"wrote {html} ({counted(len(found.runs), 'run')})", err=as_json)
    if fail_on_drift and found.fails:
        raise typer.Exit(exit_code_for(Ending.DRIFTED))
