"""``pipeline status``: done, failed, pending and stale, tokens and grounding, the last run; or the
live numbers of a run that holds the database."""

from __future__ import annotations

import dataclasses
import datetime as dt
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pipeline.cli.common import (
    DatabaseOption,
    JobArgument,
    JsonOption,
    VariantOption,
    app,
    load_job_or_exit,
    read_or_exit,
    run_or_exit,
    say_kept_options,
    say_read_copy,
)
from pipeline.wording import counted, number

if TYPE_CHECKING:  # the reading loads when the command runs (see pipeline.cli)
    from pipeline.job.commands import Asked, Verb
    from pipeline.reports.status import JobStatus
    from pipeline.run.options import VariantOptions

LocalOption = Annotated[
    bool, typer.Option(help="Judge the results as `pipeline run --local` would: made by the bundled model.")
]
ModelOption = Annotated[
    str | None, typer.Option(help="Judge the results as `pipeline run --model NAME` would.")
]
PromptFileOption = Annotated[
    Path | None, typer.Option(help="Judge the results as `pipeline run --prompt-file FILE` would.")
]


@dataclass(frozen=True, slots=True)
class _Asked:
    """The command as given, which the hints repeat: the job, its database and variant, the job file's
    model, and the options the results are judged against."""

    given: Asked
    job_model: str  # the job file's, before --local or --model
    made: VariantOptions  # --local, --model, --prompt-file: given, or kept with the variant

    def command(self, verb: Verb, *options: str) -> str:
        return self.given.command(verb, *options)

    @property
    def making(self) -> tuple[str, ...]:
        return self.made.words_of_making()

    def judging_as_made_by(self, model: str) -> tuple[str, ...]:
        """The options that judge results made by ``model`` current: these, with that model."""
        from pipeline.servers.config import LOCAL_MODEL

        local = model == LOCAL_MODEL
        same = dataclasses.replace(
            self.made, local=local, model=None if local or model == self.job_model else model
        )
        return same.words_of_making()


@app.command()
def status(
    job: JobArgument,
    as_json: JsonOption = False,
    local: LocalOption = False,
    model: ModelOption = None,
    prompt_file: PromptFileOption = None,
    database: DatabaseOption = None,
    variant: VariantOption = None,
) -> None:
    """Done / failed / pending / blank / stale, and the rate and ETA of the last run.

    A variant other than main given none of --model, --prompt-file and --local is judged with those its last run was given."""  # noqa: E501  (Typer keeps a docstring's line breaks: one paragraph, one line)
    import orjson

    from pipeline.job.commands import Asked
    from pipeline.reports.status import job_status
    from pipeline.run.options import VariantOptions, options_of_variant

    spec = load_job_or_exit(job, database, variant)
    made = read_or_exit(lambda: options_of_variant(spec, VariantOptions(None, model, prompt_file, local)))
    say_kept_options(made, spec.variant, "is judged")
    judged = run_or_exit(lambda: made.applied(spec))
    report = read_or_exit(lambda: job_status(judged, local=made.local))
    say_read_copy(report.read_copy)
    if as_json:
        judged_with = {"judged_with": list(made.words_of_making())}  # the options the results are judged by
        typer.echo(orjson.dumps(_status_dict(report) | judged_with, default=str).decode())
        return
    typer.echo(_status_text(report, _Asked(Asked(job, database, variant), spec.model, made)))


#: What only the source can tell: left out of the JSON when it cannot be read, rather than nulls.
_NEEDS_SOURCE = (
    "source_records",
    "done",
    "pending",
    "blank",
    "blank_ids",
    "pending_new",
    "pending_retried",
    "content_changed",
    "redo_failed",
    "not_taken",
    "stale",
    "models",
    "stale_models",
    "orphaned",
    "eta_s",
)


def _status_dict(report: JobStatus) -> dict[str, Any]:
    data = {
        "database": report.database,
        "variant": report.variant,
        "source_problem": report.source_problem,
        "source_records": report.source_records,
        "results": report.results,
        "done": report.done,
        "failed": report.failed,
        "pending": report.pending,
        "blank": report.blank.count,
        "blank_ids": list(report.blank.ids),
        "pending_new": report.pending_new,
        "pending_retried": report.pending_retried,
        "content_changed": report.content_changed,
        "redo_failed": report.redo_failed,
        "not_taken": report.not_taken,
        "stale": report.stale,
        "models": list(report.models),
        "stale_models": report.stale_models,
        "orphaned": report.orphaned,
        "tokens_per_done": report.tokens_per_done,
        "grounding": report.grounding,
        "chunking": report.chunking.to_json() if report.chunking else None,
        "answers_from_reasoning": report.answers_from_reasoning,
        "last_run": report.last_run,
        "quiet_run": report.quiet_run,
        "rate_per_min": report.rate_per_min,
        "eta_s": report.eta_s,
        "live": report.live,
        "read_copy": report.read_copy.to_json() if report.read_copy else None,
        **_server_cache_dict(report),
    }
    if report.source_problem is not None:
        return {key: value for key, value in data.items() if key not in _NEEDS_SOURCE}
    return data


def _server_cache_dict(report: JobStatus) -> dict[str, Any]:
    """The servers' prefix cache and preemptions in the run going on, else the last one (null: unknown)."""
    cache = report.server_cache
    return {
        "prefix_cache_hit_rate": cache.prefix_cache_hit_rate,
        "preemptions": cache.preemptions,
        "prefix_cache_warnings": list(cache.warnings),
    }


def _server_cache_lines(report: JobStatus) -> list[str]:
    """``server:`` with the hit rate and preemptions, and a low hit rate's warning; none when unknown."""
    cache = report.server_cache
    said = []
    if cache.prefix_cache_hit_rate is not None:
        said.append(f"prefix-cache hit rate {cache.prefix_cache_hit_rate:.0%}")
    if cache.preemptions is not None:
        said.append(f"{cache.preemptions:,} preemptions")
    lines = [f"server:   {', '.join(said)}"] if said else []
    return lines + [f"warning:  {warning}" for warning in cache.warnings]


def _endpoint_lines(endpoints: object) -> str:
    """One line per endpoint of a live run (with several, or an adaptive one)."""
    if not isinstance(endpoints, dict) or not endpoints:
        return ""
    lines = []
    for name, numbers in endpoints.items():
        state = "up" if numbers.get("up") else "held (gone or stalled)"
        lines.append(
            f"\n  {name}: {state}, limit {_figure(numbers.get('limit'))}, "
            f"in flight {_figure(numbers.get('in_flight'))}, {_counted(numbers.get('answers'), 'answer')}, "
            f"{_counted(numbers.get('outages'), 'outage')}"
        )
    return "".join(lines)


def _stale_lines(report: JobStatus, asked: _Asked) -> list[str]:
    lines = []
    if report.stale.get("total"):
        causes = ", ".join(
            f"{cause} {number(count)}" for cause, count in report.stale.items() if count and cause != "total"
        )
        redo = asked.command("run", "--redo-stale", *asked.making)
        also = f" and takes the {report.pending:,} pending too" if report.pending else ""  # it is a run too
        kept = f"{number(report.stale['total'])} ({causes}; a plain run keeps them"
        lines.append(f"stale:    {kept}, `{redo}` redoes them{also})")
    lines += _model_lines(report, asked)
    if report.orphaned:
        lines.append(
            f"orphaned: {counted(report.orphaned, 'result')} whose record is no longer in the source"
        )
    for path, share in report.grounding.items():
        lines.append(
            f"grounded: {path}: {share['found']:,.0f} of {share['values']:,.0f} values found in the text "
            f"({share['share']:.0%})"
        )
    if report.chunking is not None:
        lines.append(f"chunked:  {report.chunking.describe()}")
    tokens = report.tokens_per_done
    if tokens:
        lines.append(
            f"tokens:   {tokens['prompt']:,.0f} prompt + {tokens['completion']:,.0f} output "
            f"({tokens['reasoning']:,.0f} reasoning) per done record, every attempt counted"
        )
    return lines


def _model_lines(report: JobStatus, asked: _Asked) -> list[str]:
    """Which model made the results stale for the model, against which the status judged them, and
    the two ways on: judge them as the run that made them, or redo them."""
    from pipeline.servers.config import LOCAL_MODEL

    judged = " or ".join(report.models)
    made = asked.made
    judging = ["--local"] if made.local else ["--model", made.model] if made.model is not None else []
    against = f"what {shlex.join(judging)} runs" if judging else "the job's model"
    lines = []
    for model, count in report.stale_models.items():
        bundled = " (the bundled model of --local)" if model == LOCAL_MODEL else ""
        same = asked.judging_as_made_by(model)
        lines += [
            f"model:    {counted(count, 'result')} made by {model}{bundled}, not by {judged} ({against})",
            f"          `{asked.command('status', *same)}` counts them as current; "
            f"`{asked.command('run', '--redo-stale', 'model', *asked.making)}` redoes them with {judged}",
        ]
    return lines


def _live_text(report: JobStatus) -> str:
    """The run's progress snapshot alone: it holds the database and has written no read copy yet."""
    live = report.live or {}
    return (
        f"{report.database} is held by a running `pipeline run` "
        f"(pid {live.get('pid')}, run {live.get('run_id')}){_as_of(live)}:\n"
        f"  done {_figure(live.get('done'))}, failed {_figure(live.get('failed'))}, "
        f"in flight {_figure(live.get('in_flight'))}, remaining {_figure(live.get('remaining'))}\n  "
        + _live_rates(live)
    ) + "".join(f"\n{line}" for line in _server_cache_lines(report))


def _live_beside_copy(report: JobStatus) -> str:
    """What the run's snapshot adds to its copy's counts: no count of its own (taken at another
    moment, it would not add up with them)."""
    live = report.live or {}
    return (
        f"held by a running `pipeline run` (pid {live.get('pid')}, run {live.get('run_id')}){_as_of(live)}: "
        f"in flight {_figure(live.get('in_flight'))}, " + _live_rates(live)
    )


def _live_rates(live: dict[str, Any]) -> str:
    """The rates the snapshot's numbers gave (:meth:`RunNumbers.to_json`), said as the summary says them."""
    from pipeline.run.progress import format_duration

    minutes, tokens = live.get("records_per_min"), live.get("output_tokens_per_s")
    return (
        f"{_figure(minutes, '.1f')} records/min, {_figure(tokens, '.0f')} output tok/s, "
        f"ETA {format_duration(live.get('eta_s'))}" + _endpoint_lines(live.get("endpoints"))
    )


def _figure(value: object, digits: str = "") -> str:
    """A number that may be missing (an older run's snapshot, a source not read): a count as every
    count is said, a rate to ``digits``, else as it is."""
    if isinstance(value, int):
        return number(value)
    return f"{value:,{digits}}" if isinstance(value, float) else str(value)


def _counted(value: object, noun: str) -> str:
    """A count of the snapshot with its noun (missing: the noun's plural after the value as read)."""
    return counted(value, noun) if isinstance(value, int | float) else f"{value} {noun}s"


def _as_of(live: dict[str, Any]) -> str:
    stamp = live.get("as_of")
    if not isinstance(stamp, str):
        return ""
    return ", as of " + dt.datetime.fromisoformat(stamp).astimezone().strftime("%H:%M:%S")


def _source_lines(report: JobStatus, asked: _Asked) -> list[str]:
    if report.source_problem is None:
        failures = asked.command("failures")
        kept = f" ({number(report.redo_failed)} of them kept after a redo failed: `{failures}` says why)"
        kept = kept if report.redo_failed else ""
        return [f"records:  {_figure(report.source_records)}", f"done:     {_figure(report.done)}{kept}"]
    return [
        f"source:   {report.source_problem}",
        f"results:  {number(report.results)} stored (which are done or stale, and what is pending, needs "
        "the source)",
    ]


def _pending_lines(report: JobStatus) -> list[str]:
    """What a plain run would take, and why, and what it would take but never sends (blank: every prompt
    field empty); with the done and failed, each record once."""
    if report.source_problem is not None:
        return []
    retried = ", ".join(f"{name} {number(count)}" for name, count in report.pending_retried.items())
    to_retry = sum(report.pending_retried.values())
    parts = [
        *(
            [f"{number(report.pending_new)} new"]
            if report.pending_new and report.pending_new != report.pending
            else []
        ),
        *([f"{counted(to_retry, 'failure')} to retry: {retried}"] if retried else []),
        *([f"{number(report.content_changed)} with changed content"] if report.content_changed else []),
    ]
    lines = [f"pending:  {_figure(report.pending)}" + (f" ({'; '.join(parts)})" if parts else "")]
    if report.blank:
        lines.append(f"blank:    {number(report.blank.count)} ({report.blank.what}; not sent)")
    if report.not_taken:
        lines.append(
            f"not taken: {counted(report.not_taken, 'record')} without a current result of the variant this "
            "re-runs"
        )
    return lines


def _status_text(report: JobStatus, asked: _Asked) -> str:
    if report.read_copy is None and report.live is not None:  # no copy yet: the live numbers only
        return _live_text(report)

    failed_total = sum(report.failed.values())
    failed_detail = ", ".join(f"{name} {number(count)}" for name, count in report.failed.items())
    lines: list[str] = [
        f"database: {report.database}" + (f" (variant {report.variant})" if report.variant != "main" else ""),
        *(
            [f"copy:     {report.read_copy.describe()} (a run holds the database)"]
            if report.read_copy
            else []
        ),
        *_source_lines(report, asked),
        f"failed:   {number(failed_total)}" + (f" ({failed_detail})" if failed_detail else ""),
        *_recovered_lines(report),
        *_pending_lines(report),
        *_stale_lines(report, asked),
    ]
    lines += _last_run_lines(report)
    if report.read_copy is not None and report.live is not None:
        lines.append("now:      " + _live_beside_copy(report))
    lines += _server_cache_lines(report)
    return "\n".join(lines)


def _recovered_lines(report: JobStatus) -> list[str]:
    """Answers taken from the reasoning field: done, but the server's parser put them there."""
    count = report.answers_from_reasoning
    if not count:
        return []
    return [
        f"note:     {counted(count, 'answer')} recovered from reasoning (the server put the "
        "JSON in the reasoning field, content null: gpt-oss under structured output, vLLM issue 23694; "
        "the results' answer_from_reasoning column marks them)"
    ]


def _last_run_lines(report: JobStatus) -> list[str]:
    from pipeline.run.progress import format_duration

    run, numbers, rate = report.last_run, report.last_numbers, report.rate_per_min
    if not run or numbers is None:
        return _quiet_lines(report)
    speed = f", {rate:,.1f} records/min" if rate else ""
    if report.live is None and report.eta_s is not None:  # a live run says its own, on its line
        speed += f", ETA for pending {format_duration(report.eta_s)}"
    why = run.get("message") or (ABANDONED if run["status"] == "abandoned" else None)
    return [
        f"last run: #{run['run_id']} {run['status']}, started {run['started_at']:%Y-%m-%d %H:%M:%S %Z}, "
        f"{number(numbers.done)} done, {number(numbers.failed)} failed, "
        f"{counted(numbers.attempts, 'request')} sent{speed}"
        + (f", {counted(n, 'answer')} from reasoning" if (n := numbers.answers_from_reasoning) else ""),
        *([f"why:      {why}"] if why else []),
        *_quiet_lines(report),
    ]


def _quiet_lines(report: JobStatus) -> list[str]:
    """The newest run, when it had nothing to do: the nightly run ran, after the last one that did."""
    from pipeline.quality.drift import RunDate, describe_runs

    quiet = report.quiet_run
    if quiet is None:
        return []
    return [f"quiet:    {describe_runs([RunDate(quiet['run_id'], quiet['started_at'])])} had nothing to do"]


#: Why a run row still says running when no process holds the database.
ABANDONED = (
    "it ended without a word (killed, or the machine stopped); what it committed is kept, a plain run "
    "goes on from there"
)
