"""``pipeline run``: its options, turned into a job spec and :class:`RunOptions`, and its summary."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pipeline.cli.common import (
    DatabaseOption,
    Display,
    JobArgument,
    LogFormat,
    LogFormatOption,
    LogLevelOption,
    SampleOption,
    SeedOption,
    VariantOption,
    app,
    event_loop_options,
    fail,
    load_job_or_exit,
    run_or_exit,
    say_kept_options,
    saying_a_new_database,
    setup_logging,
)
from pipeline.defaults import class_names
from pipeline.errors import PERMANENT_FAILURE_CLASSES, ConfigError, FailureClass
from pipeline.wording import counted, number

if TYPE_CHECKING:  # the run loads when the command runs (see pipeline.cli)
    from pipeline.job.commands import Asked
    from pipeline.job.spec import JobSpec
    from pipeline.run.options import VariantOptions
    from pipeline.run.progress import ProgressReporter
    from pipeline.run.runner import RunOptions, RunSummary
    from pipeline.source.versions import StaleCause

# Transient failures are retried by every run, so --class takes only the others.
FAILURE_CLASSES = class_names(PERMANENT_FAILURE_CLASSES)

LimitOption = Annotated[int | None, typer.Option(min=1, help="Extract at most this many records.")]
ConcurrencyOption = Annotated[
    str | None,
    typer.Option(help="Override the concurrency of every endpoint: a number, or auto (adaptive)."),
]
RetryFailedOption = Annotated[bool, typer.Option(help="Also retry records that failed permanently.")]
OnlyFailedOption = Annotated[
    bool, typer.Option(help="Retry failed records (all, or --class) and take no new ones.")
]
RetryClassOption = Annotated[
    list[str] | None,
    typer.Option(
        "--class",
        help=f"Retry only this failure class (repeatable): {', '.join(FAILURE_CLASSES)}. Alone it is "
        "--retry-failed --class (new records too); with --only-failed, nothing new.",
    ),
]
RedoStaleOption = Annotated[
    str | None,
    typer.Option(
        metavar="[CAUSES]",
        help="Also redo results made by an older version of the job: every cause, or only "
        "those listed (prompt,schema,model,settings,unknown). Changed content is always redone.",
    ),
]
EndpointOption = Annotated[str | None, typer.Option(help="Override endpoint.base_url.")]
ModelOption = Annotated[str | None, typer.Option(help="Override the model name.")]
PromptFileOption = Annotated[
    Path | None,
    typer.Option(
        help="Override prompt keys from a YAML file (system, user, examples...), or the "
        "system prompt from any other file's text."
    ),
]
TimeoutOption = Annotated[float | None, typer.Option(min=1, help="Override request_timeout_s.")]
GraceOption = Annotated[
    float | None, typer.Option(min=0, help="Seconds requests in flight get after SIGINT/SIGTERM.")
]
StallWarningOption = Annotated[
    float | None, typer.Option(min=1, help="Warn after this many seconds without an answer.")
]
StallAbortOption = Annotated[
    float | None, typer.Option(min=1, help="End the run (exit 5) after this many seconds without one.")
]
MetricsPortOption = Annotated[
    int | None, typer.Option(min=0, max=65535, help="Serve Prometheus metrics on this port.")
]
MetricsHostOption = Annotated[
    str | None,
    typer.Option(
        help="Where --metrics-port listens (default 127.0.0.1, or operations.metrics_host); "
        "0.0.0.0 or :: for every interface, without authentication."
    ),
]
MetricsTextfileOption = Annotated[
    Path | None, typer.Option(help="Keep a Prometheus textfile here (node_exporter).")
]
LocalOption = Annotated[bool, typer.Option(help="Start the bundled local vLLM server for this run.")]
RerunOption = Annotated[
    bool,
    typer.Option(
        help="Run the variant again with exactly its settings, on the records it has a current result "
        "for, stored as VARIANT~rerun: the noise floor `pipeline compare` measures against."
    ),
]
ProgressOption = Annotated[Display, typer.Option(help="auto: a live bar on a terminal, log lines otherwise.")]


@dataclass(frozen=True, slots=True)
class _Overrides:
    """The options that change how the job runs (``None``: keep the job's); what it sends besides,
    the model and the prompt, is :class:`VariantOptions`'s."""

    concurrency: str | None
    base_url: str | None
    request_timeout_s: float | None
    shutdown_grace_s: float | None
    stall_warning_s: float | None
    stall_abort_s: float | None
    metrics_host: str | None


@dataclass(frozen=True, slots=True)
class _Selection:
    """The options that choose which records the run takes."""

    limit: int | None
    retry_failed: bool
    retry_class: list[str] | None
    only_failed: bool
    redo_stale: str | None
    sample: int | None
    seed: int


@app.command()
def run(
    job: JobArgument,
    limit: LimitOption = None,
    concurrency: ConcurrencyOption = None,
    retry_failed: RetryFailedOption = False,
    only_failed: OnlyFailedOption = False,
    retry_class: RetryClassOption = None,
    redo_stale: RedoStaleOption = None,
    sample: SampleOption = None,
    seed: SeedOption = 0,
    variant: VariantOption = None,
    rerun: RerunOption = False,
    endpoint: EndpointOption = None,
    model: ModelOption = None,
    prompt_file: PromptFileOption = None,
    timeout: TimeoutOption = None,
    grace: GraceOption = None,
    stall_warning: StallWarningOption = None,
    stall_abort: StallAbortOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = None,
    metrics_textfile: MetricsTextfileOption = None,
    local: LocalOption = False,
    database: DatabaseOption = None,
    progress: ProgressOption = Display.AUTO,
    log_format: LogFormatOption = LogFormat.AUTO,
    log_level: LogLevelOption = "info",
) -> None:
    """Extract every record not done yet; safe to interrupt and run again.

    A variant other than main given none of --model, --prompt-file and --local runs with those its last run was given: a variant made from options stays that variant."""  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    import anyio

    from pipeline.job.commands import Asked
    from pipeline.job.spec import MAIN_VARIANT
    from pipeline.job.variants import rerun_name
    from pipeline.run.options import VariantOptions, options_of_variant
    from pipeline.run.runner import runner_for

    setup_logging(log_format, log_level)
    changes = _Overrides(concurrency, endpoint, timeout, grace, stall_warning, stall_abort, metrics_host)
    spec = load_job_or_exit(job, database, rerun_name(variant or MAIN_VARIANT) if rerun else variant)
    given = VariantOptions(endpoint, model, prompt_file, local)
    made = run_or_exit(lambda: options_of_variant(spec, given, for_run=True))
    say_kept_options(made, spec.variant, "runs")
    spec = run_or_exit(lambda: _overridden(spec, changes, made))
    selection = _Selection(limit, retry_failed, retry_class, only_failed, redo_stale, sample, seed)
    options = _run_options(selection, _reporter(progress), metrics_port, metrics_textfile)
    options = replace(options, variant_options=made.words())
    runner = runner_for(spec, local=made.local)
    with saying_a_new_database(spec, database):
        summary: RunSummary = run_or_exit(
            lambda: anyio.run(runner, spec, options, backend_options=event_loop_options())
        )
    _print_summary(summary, Asked(job, database, endpoints=(endpoint,) if endpoint else ()), made)
    raise typer.Exit(summary.exit_code)


def _reporter(progress: Display) -> ProgressReporter:
    from pipeline.run.progress import LiveProgress, LogProgress

    bar = progress is Display.BAR or (progress is Display.AUTO and sys.stderr.isatty())
    return LiveProgress() if bar else LogProgress()


def _run_options(
    selection: _Selection, reporter: ProgressReporter, metrics_port: int | None, metrics_textfile: Path | None
) -> RunOptions:
    from pipeline.run.runner import RunOptions

    return RunOptions(
        limit=selection.limit,
        retry_failed=selection.retry_failed,
        retry_classes=_failure_classes(selection.retry_class or [], selection.only_failed),
        only_failed=selection.only_failed,
        redo_stale=_redo_causes(selection.redo_stale, selection.only_failed),
        sample=selection.sample,
        seed=selection.seed,
        handle_signals=True,
        progress=reporter,
        metrics_port=metrics_port,
        metrics_textfile=metrics_textfile,
    )


def _overridden(spec: JobSpec, changes: _Overrides, made: VariantOptions) -> JobSpec:
    """The job as the variant and the command-line options make it (a bad one: ConfigError)."""
    from pipeline.servers.config import checked_host_option, checked_url_option

    if changes.base_url is not None:
        checked_url_option("--endpoint", changes.base_url, local_allowed=True)
    if changes.metrics_host is not None:
        checked_host_option("--metrics-host", changes.metrics_host)
    overrides: dict[str, Any] = {name: getattr(changes, name) for name in changes.__slots__}
    return made.applied(spec.with_overrides(**overrides))


def _redo_causes(value: str | None, only_failed: bool) -> frozenset[StaleCause]:
    from pipeline.source.versions import parse_causes

    if value is None:
        return frozenset()
    if only_failed:
        raise fail(ConfigError("--only-failed retries failures and nothing else: drop --redo-stale or it"))
    return run_or_exit(lambda: parse_causes([] if value == "all" else [value], "--redo-stale"))


def _failure_classes(names: list[str], only_failed: bool) -> frozenset[FailureClass]:
    from pipeline.reports.failures import parse_failure_classes

    # A plain run retries transient failures anyway; --only-failed may ask for them alone.
    allowed = frozenset(FailureClass) if only_failed else PERMANENT_FAILURE_CLASSES
    return frozenset(run_or_exit(lambda: parse_failure_classes(names, allowed=allowed)))


def _print_summary(summary: RunSummary, given: Asked, made: VariantOptions) -> None:
    """The run's end, and the commands that go on from it: each reads or runs the database, variant
    and endpoint this run did, with the options that made its results."""
    from pipeline.job.spec import MAIN_VARIANT
    from pipeline.quality.drift import against as drift_baseline
    from pipeline.run.progress import format_duration
    from pipeline.run.runner import RunStatus

    asked = replace(given, variant=None if summary.variant == MAIN_VARIANT else summary.variant)
    making = made.words_of_making()
    if summary.status is RunStatus.NOTHING_TO_DO and summary.source_records == 0:
        load = f"`{asked.command('load')}` adds some"
        typer.echo(f"nothing to do: the source has no records ({summary.database}; {load})")
        return
    if summary.status is RunStatus.NOTHING_TO_DO:  # kept as a run of its own, but nothing was sent
        states = "done, failed permanently or blank" if summary.blank else "done or failed permanently"
        typer.echo(f"nothing to do: every record is {states} ({summary.database})")
        _print_blank(summary)
        _print_stale_kept(summary, asked, making)
        return
    numbers = summary.numbers
    typer.echo(
        f"run {summary.run_id} {summary.status}: {number(numbers.done)} done, {number(numbers.failed)} "
        f"failed of {number(numbers.pending_at_start)} in {format_duration(numbers.elapsed_s)} "
        f"({numbers.records_per_min:,.1f} records/min, {numbers.output_tokens_per_s:,.0f} output tok/s)"
    )
    typer.echo(f"results:  table {summary.results_table} in {summary.database}")
    if summary.failed:
        failures, retry = asked.command("failures"), asked.command("run", "--only-failed", *making)
        typer.echo(
            f"failures: table {summary.failures_table} (`{failures}` shows them, `{retry}` retries them "
            "and takes no new record)"
        )
    _print_too_long_unsent(numbers.too_long_unsent, asked, making)
    _print_blank(summary)
    _print_stale_kept(summary, asked, making)
    if summary.drift:
        moved = "; ".join(entry.describe() for entry in summary.drift)
        label = "drift:   " if any(entry.fails for entry in summary.drift) else "better:  "  # no alert
        against = f"beyond the usual run-to-run variation of {drift_baseline(summary.drift)}"
        typer.echo(f"{label} {moved}; {against} (`{asked.command('report')}`)")
    typer.echo(f"look:     {_look_command(summary)}")


def _look_command(summary: RunSummary) -> str:
    """A shell command that shows a few results when pasted: this interpreter, which has duckdb (a bare
    `python` may not), with the path as a Python string and the whole quoted for the shell."""
    from pipeline.job.spec import MAIN_VARIANT

    literal = summary.variant.replace("'", "''")
    where = f" WHERE variant = '{literal}'" if summary.variant != MAIN_VARIANT else ""
    query = f"SELECT record_id, extracted FROM {summary.results_table}{where} LIMIT 5"
    database = json.dumps(str(summary.database), ensure_ascii=False)  # a JSON string is a Python one
    code = f"import duckdb; duckdb.connect({database}, read_only=True).sql({json.dumps(query)}).show()"
    return shlex.join([sys.executable, "-c", code])


def _print_blank(summary: RunSummary) -> None:
    """The records the run set aside unsent, every prompt field empty: nothing to extract from."""
    if summary.blank:
        typer.echo(f"blank:    {summary.blank.describe('not sent')}")


def _print_too_long_unsent(unsent: int, asked: Asked, making: tuple[str, ...]) -> None:
    """Why records failed without a request: sending them again would only fail them again."""
    if not unsent:
        return
    again = asked.command("run", "--only-failed", "--class", "too_long", *making)
    typer.echo(
        f"too long: {counted(unsent, 'record')} not sent: by the count of its prompt (the server's, in "
        "this run or an earlier one, or one token a word) it cannot fit the context with an answer; split "
        f"it (`chunking:` in the job) or raise the context (the server's --max-model-len), then `{again}`"
    )


def _print_stale_kept(summary: RunSummary, asked: Asked, making: tuple[str, ...]) -> None:
    if not summary.stale_kept:
        return

    total = summary.stale_kept.get("total", 0)
    causes = ", ".join(
        f"{cause} {number(count)}" for cause, count in summary.stale_kept.items() if cause != "total"
    )
    status = asked.command("status", *making)
    which = f"; `{status}` says which model made them" if summary.stale_kept.get("model") else ""
    typer.echo(
        f"stale:    {counted(total, 'result')} made by an older version of the job ({causes}); "
        f"kept as they are: `{asked.command('run', '--redo-stale', *making)}` redoes them{which}"
    )
