"""``pipeline check JOB``: the server checked for this job (context, KV cache and how many of the job's
requests fit, prefix caching, where answers land, reasoning effort, response_format, the timeout at the
job's concurrency, the backlog's ETA) in ok / warn / fail / unknown lines, or ``--json``. Exit 0 all ok
(what could not be checked, unknown, counts for nothing), 1 a warning, 3 the server cannot serve the job
(2: the job, its source or an option is wrong)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from pipeline.cli.common import (
    DatabaseOption,
    JobArgument,
    LogFormat,
    LogFormatOption,
    app,
    fail,
    load_job_or_exit,
    run_or_exit,
    say_read_copy,
    seed_option,
    setup_logging,
)
from pipeline.defaults import DEFAULT_PROBE_TIMEOUT_S, DEFAULT_PROBES
from pipeline.errors import ConfigError

if TYPE_CHECKING:  # what the check needs loads when it runs (see pipeline.cli)
    from pipeline.job.spec import JobSpec
    from pipeline.run.check import CheckReport

CheckEndpointOption = Annotated[
    list[str] | None,
    typer.Option("--endpoint", help="Check this server instead of the job's (repeatable: several servers)."),
]
CheckModelOption = Annotated[str | None, typer.Option(help="Override the job's model.")]
JsonOption = Annotated[
    bool, typer.Option("--json", help="One JSON object on stdout, for scripts and alerts.")
]
ProbesOption = Annotated[
    int, typer.Option(min=1, max=50, help="Probe requests made from a seeded sample of the job's records.")
]
ProbeSeedOption = Annotated[int, seed_option("the probes' sample (as `run --sample --seed`)")]
ProbeTimeoutOption = Annotated[
    float, typer.Option(min=1, help="Seconds a probe may take alone (at most the job's request_timeout_s).")
]


@app.command()
def check(
    job: JobArgument,
    endpoint: CheckEndpointOption = None,
    model: CheckModelOption = None,
    database: DatabaseOption = None,
    json_output: JsonOption = False,
    probes: ProbesOption = DEFAULT_PROBES,
    seed: ProbeSeedOption = 0,
    probe_timeout: ProbeTimeoutOption = DEFAULT_PROBE_TIMEOUT_S,
    log_format: LogFormatOption = LogFormat.AUTO,
) -> None:
    """Check the server for this job in 30 seconds: what would go wrong over a night's backlog."""
    import anyio
    import orjson

    setup_logging(log_format, "warning")
    spec = _with_servers(load_job_or_exit(job, database), endpoint or [], model)
    report = run_or_exit(lambda: anyio.run(_check, spec, probes, seed, probe_timeout))
    say_read_copy(report.read_copy)
    if json_output:
        typer.echo(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        for line in report.lines():
            typer.echo(line)
    raise typer.Exit(report.exit_code)


async def _check(spec: JobSpec, probes: int, seed: int, probe_timeout: float) -> CheckReport:
    from pipeline.run.check import check_job

    return await check_job(spec, probes=probes, seed=seed, probe_timeout_s=probe_timeout)


def _with_servers(spec: JobSpec, urls: list[str], model: str | None) -> JobSpec:
    """The job on the servers ``--endpoint`` names (one replaces the job's, several become its
    ``endpoints``) and ``--model``; a bad URL is exit 2."""
    from pipeline.job.commands import command

    if spec.runs_locally and not urls:
        message = (
            f"the job's endpoint is local: start it with `{command('serve-local')}` and give its URL as "
            "--endpoint"
        )
        raise fail(ConfigError(f"{spec.source_file}: {message}"))
    return run_or_exit(lambda: _on_servers(spec, urls, model))


def _on_servers(spec: JobSpec, urls: list[str], model: str | None) -> JobSpec:
    from pipeline.servers.config import checked_url_option

    checked = [checked_url_option("--endpoint", url) for url in urls]
    changes: dict[str, Any] = {"model": model}
    if len(checked) == 1:
        changes["base_url"] = checked[0]
    elif checked:
        changes["endpoint"] = spec.endpoint.model_dump(exclude={"base_url"}, exclude_none=True)
        changes["endpoints"] = [{"base_url": url} for url in checked]
    return spec.with_overrides(**changes)
