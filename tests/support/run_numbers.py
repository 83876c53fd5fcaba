"""What a finished run's numbers are, read where a person or a scraper reads them: its row in the runs
table, the Prometheus textfile it wrote, and the chat requests the simulator counted.

:func:`assert_said_alike` holds every other place to the newest run's row: its summary line (for a run an
error ended, its last log line), ``status`` and ``status --json``, ``report`` and ``report --json``, the
series' last point and the Prometheus textfile. Each number is compared as its row has it: the counts,
records/min, tokens per done record (one run's, and the job's over its runs), the servers' prefix-cache
hit rate and preemptions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import orjson

from pipeline.store.numbers import TOKEN_KINDS, RunNumbers
from pipeline.store.run_profiles import BENCH, NOTHING_TO_DO
from tests.support.jobs import table_rows
from tests.support.logged_run import json_log_lines
from tests.support.processes import run_pipeline, sim_metric

SUMMARY = re.compile(
    r"run (\d+) (\w+): ([\d,]+) done, ([\d,]+) failed of ([\d,]+) in [\d:]+ "
    r"\(([\d,.]+) records/min, [\d,]+ output tok/s\)"
)
LAST_RUN = re.compile(
    r"last run: #(\d+) (\w+), started [^,]+, ([\d,]+) done, ([\d,]+) failed, ([\d,]+) requests? sent"
    r"(?:, ([\d,.]+) records/min)?"
)


def prometheus(textfile: Path) -> dict[str, float]:
    """Each series of the textfile summed over its labels other than ``job``, and each labelled one too."""
    values: dict[str, float] = {}
    for line in textfile.read_text().splitlines():
        match = re.fullmatch(r"(\w+)\{([^}]*)\} (\S+)", line)
        if match is None:
            continue
        name, labels, value = match.groups()
        other = ",".join(label for label in labels.split(",") if not label.startswith("job="))
        values[name] = values.get(name, 0.0) + float(value)
        if other:
            values[f"{name}{{{other}}}"] = float(value)
    return values


def stored(database: Path) -> tuple[str, RunNumbers]:
    """The newest run's status and numbers, as its row has them (a knee `bench` kept is no run)."""
    with_names = table_rows(
        database, f"SELECT to_json(runs) FROM runs WHERE status <> '{BENCH}' ORDER BY run_id DESC LIMIT 1"
    )
    row: dict[str, Any] = orjson.loads(with_names[0][0])
    return str(row["status"]), RunNumbers.of(row)


def sim_requests(url: str) -> int:
    """The chat requests the simulator received (/tokenize aside)."""
    return int(sim_metric(url, "pipeline_sim:chat_requests_total"))


def count(text: str) -> int:
    return int(text.replace(",", ""))


class Printed(Protocol):
    """What a command printed: a finished process, or the command run in this process."""

    @property
    def returncode(self) -> int: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...


#: How ``status`` and ``report`` are asked: a child process by default, or in this process.
Reader = Callable[..., Printed]


def assert_said_alike(
    job: Path,
    database: Path,
    textfile: Path,
    done: Printed,
    *,
    read: Reader = run_pipeline,
    variant: str = "main",
) -> None:
    """The newest run's numbers, as its row in ``database`` has them, are what ``done`` (the finished
    ``pipeline run JOB --metrics-textfile TEXTFILE``) printed or logged last, what ``status`` and
    ``report`` say of ``job`` (text and JSON, asked through ``read``, of the run's ``variant``), its
    series' last point and the textfile. A job with a runs table."""
    status, numbers = stored(database)
    assert_summary_or_last_line(done, status, numbers)
    if variant != "main":
        base = read

        def read(*args: str) -> Printed:  # status and report of the variant the run made
            return base(*args, "--variant", variant)

    if status == NOTHING_TO_DO:  # no last run of status's nor a column of report's: status's quiet run
        (run_id,) = table_rows(database, "SELECT max(run_id) FROM runs")[0]
        assert orjson.loads(read("status", str(job), "--json").stdout)["quiet_run"]["run_id"] == run_id
    else:
        assert_status(job, database, status, numbers, read, variant)
        assert_report(job, database, status, numbers, read)
    assert_prometheus(prometheus(textfile), numbers)


def assert_summary_or_last_line(done: Printed, status: str, n: RunNumbers) -> None:
    if status == NOTHING_TO_DO:  # a quiet night: its line says so, and its numbers are all nothing
        assert done.returncode == 0 and "nothing to do" in done.stdout, done.stdout
        assert (n.finished, n.attempts, n.pending_at_start) == (0, 0, 0), n
        return
    if done.returncode in (0, 1):
        said = SUMMARY.search(done.stdout)
        assert said is not None, done.stdout
        assert said.group(2) == status
        assert [count(said.group(i)) for i in (3, 4, 5)] == [n.done, n.failed, n.pending_at_start]
        assert said.group(6) == f"{n.records_per_min:,.1f}"
        return
    ended = next(line for line in json_log_lines(done.stderr) if line.get("event") == "run ended")
    assert ended["status"] == status
    assert (ended["done"], ended["failed"], ended["attempts"]) == (n.done, n.failed, n.attempts)
    assert ended["records_per_min"] == round(n.records_per_min, 1)


def assert_status(
    job: Path, database: Path, status: str, n: RunNumbers, read: Reader, variant: str = "main"
) -> None:
    text = read("status", str(job)).stdout
    said = LAST_RUN.search(text)
    assert said is not None, text
    assert said.group(2) == status
    assert [count(said.group(i)) for i in (3, 4, 5)] == [n.done, n.failed, n.attempts]
    assert said.group(6) == f"{n.records_per_min:,.1f}"
    if n.prefix_cache_hit_rate is not None:
        assert f"prefix-cache hit rate {n.prefix_cache_hit_rate:.0%}" in text
    job_tokens = job_numbers(database, variant).tokens_per_done
    if job_tokens is not None:
        assert (
            f"tokens:   {job_tokens['prompt']:,.0f} prompt + {job_tokens['completion']:,.0f} output "
            f"({job_tokens['reasoning']:,.0f} reasoning) per done record, every attempt counted"
        ) in text
    as_json = orjson.loads(read("status", str(job), "--json").stdout)
    assert RunNumbers.of(as_json["last_run"]) == n
    assert as_json["rate_per_min"] == n.records_per_min
    assert (as_json["prefix_cache_hit_rate"], as_json["preemptions"]) == (
        n.prefix_cache_hit_rate,
        n.preemptions,
    )
    assert as_json["tokens_per_done"] == job_tokens
    assert as_json["pending"] == n.backlog  # a plain run after it takes what it left


def assert_report(job: Path, database: Path, status: str, n: RunNumbers, read: Reader) -> None:
    """``report --json``'s entry of the newest run, its series' last point and the text table's column
    of it (none when that run kept no profile: it finished no record)."""
    (run_id,) = table_rows(database, f"SELECT max(run_id) FROM runs WHERE status <> '{BENCH}'")[0]
    report = orjson.loads(read("report", str(job), "--json").stdout)
    run = next((entry for entry in report["runs"] if entry["run_id"] == run_id), None)
    if run is None:
        return
    assert (run["status"], run["records_per_min"]) == (status, n.records_per_min)
    assert RunNumbers.of(run["numbers"]) == n
    assert run["tokens_per_record"] == (n.tokens_per_done or {}) == (run["numbers"]["tokens_per_done"] or {})
    assert (run["prefix_cache_hit_rate"], run["preemptions"]) == (n.prefix_cache_hit_rate, n.preemptions)
    series = report["series"]
    last = series["points"][-1]
    assert series["run_id"] == run_id and last["records_per_min"] == n.records_per_min
    assert last.get("prefix_cache_hit_rate") == n.prefix_cache_hit_rate  # absent: no server counts them
    column = report_column(read("report", str(job)).stdout, run_id)
    for name, tokens in (n.tokens_per_done or {}).items():
        assert column[f"{name} tok/record"] == (f"{tokens:,.2f}" if tokens < 1000 else f"{tokens:,.0f}")


def report_column(text: str, run_id: int) -> dict[str, str]:
    """The cells of run ``run_id``'s column of ``report``'s table, by row label."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]
    header = next(row for row in rows if row[0] == "run")
    index = header.index(str(run_id))
    return {row[0]: row[index] for row in rows if len(row) > index}


def job_numbers(database: Path, variant: str = "main") -> RunNumbers:
    """The variant's runs' counts summed, as status reads the job's tokens per done record."""
    counts = ("done", *(f"{name}_tokens" for name in TOKEN_KINDS))
    sums = ", ".join(f"sum({name})" for name in counts)
    (row,) = table_rows(database, f"SELECT {sums} FROM runs WHERE variant = '{variant}'")
    return RunNumbers.of(dict(zip(counts, row, strict=True)))


def assert_prometheus(metrics: dict[str, float], n: RunNumbers) -> None:
    assert metrics["pipeline_records_done_total"] == n.done
    assert metrics["pipeline_records_failed_total"] == n.failed
    for failure_class, failed in n.failures.items():
        assert metrics[f'pipeline_records_failed_total{{class="{failure_class}"}}'] == failed
    assert metrics["pipeline_requests_total"] == n.attempts
    assert metrics["pipeline_retries_total"] == sum(n.retries.values())
    assert metrics["pipeline_request_timeouts_total"] == n.timeouts
    assert metrics["pipeline_prompt_tokens_total"] == n.prompt_tokens
    assert metrics["pipeline_output_tokens_total"] == n.completion_tokens
    assert metrics["pipeline_reasoning_tokens_total"] == n.reasoning_tokens
    assert metrics["pipeline_records_at_start"] == n.pending_at_start
    assert metrics["pipeline_records_remaining"] == n.remaining
    assert metrics["pipeline_records_pending"] == n.backlog
    assert metrics["pipeline_records_blank"] == n.blank
    assert metrics["pipeline_records_too_long_unsent_total"] == n.too_long_unsent
    assert metrics.get("pipeline_prefix_cache_hit_rate") == n.prefix_cache_hit_rate
    assert metrics["pipeline_run_active"] == 0
