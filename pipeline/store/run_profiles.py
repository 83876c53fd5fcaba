"""A run's profile, read from what it wrote and kept in its row of the runs table (``profile``), and
the profiles of a job's runs for drift (:mod:`pipeline.quality.drift`) and ``pipeline report``.

The fields are profiled from the run's results (:func:`pipeline.quality.profile.profile_fields`); a
run of more than :data:`PROFILED_RESULTS` results is profiled on a seeded sample of that many, which
puts a share within about ±0.5 points. Tokens, latency and failures are counted in SQL over all of them,
and so is ``retried``: how many of the run's records had failed before it began (the ids
:func:`note_failures_before` kept as it began), which is how drift knows a retry from a nightly run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from pipeline.job.spec import JobSpec
from pipeline.quality.drift import NewestRun
from pipeline.quality.fields import schema_fields, top_field
from pipeline.quality.found_share import FoundShare, found_shares
from pipeline.quality.grounding import grounding_from_json
from pipeline.quality.profile import profile_fields
from pipeline.source.db import Database, quote
from pipeline.store.numbers import RUN_NUMBER_COLUMNS, TOKEN_KINDS, RunNumbers

#: The status of a run that had nothing to do (``pipeline.run``'s ``RunStatus.NOTHING_TO_DO``): a quiet
#: night, kept as a row with nothing done, no profile and no series.
NOTHING_TO_DO = "nothing_to_do"
#: The status of a row that is no run: a knee `pipeline bench --seed-knee` measured and kept
#: (:func:`pipeline.store.opening.seed_knee`) for the next `concurrency: auto` run to start from. Nothing
#: that reads a job's last or newest run takes it: it did no record and has no rate.
BENCH = "bench"
PROFILED_RESULTS = 50_000
PROFILE_VERSION = 1
_FAILED_BEFORE = "pipeline_failed_before_run"  # a temporary table of the writer's connection


def note_failures_before(connection: Database, spec: JobSpec) -> None:
    """Keep the ids of the variant's failures as a run begins, for its profile's ``retried``. Blocking."""
    connection.execute(
        f"CREATE OR REPLACE TEMP TABLE {_FAILED_BEFORE} AS SELECT record_id "
        f"FROM {quote(spec.output.failures_table)} WHERE variant = $variant",
        {"variant": spec.variant},
    )


def run_profile(connection: Database, spec: JobSpec, run_id: int) -> dict[str, Any]:
    """What run ``run_id`` of ``spec.variant`` produced. Blocking."""
    parameters = {"variant": spec.variant, "run_id": run_id}
    results = quote(spec.output.results_table)
    rows = connection.rows(
        f"SELECT extracted, grounding FROM (SELECT extracted, grounding FROM {results} "
        "WHERE variant = $variant AND run_id = $run_id) "
        f"USING SAMPLE reservoir({PROFILED_RESULTS} ROWS) REPEATABLE (0)",
        parameters,
    )
    extractions = [_object(extracted) for extracted, _ in rows]
    profile = _run_numbers(connection, spec, parameters)
    profile["fields"] = profile_fields(
        schema_fields(spec.schema_class), extractions, _grounded([grounding for _, grounding in rows])
    )
    profile["profiled"] = len(rows)
    return profile


def _object(text: Any) -> dict[str, Any]:
    value = orjson.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def _grounded(stored: Sequence[Any]) -> dict[str, FoundShare]:
    """Per top-level field, how many of its values were found in the text, from stored grounding."""
    values = (value for text in stored for value in grounding_from_json(text or None) or ())
    return found_shares(values, by=top_field)


def _run_numbers(connection: Database, spec: JobSpec, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Records, failures by class, tokens per done record (:func:`_tokens`), the prompt's length of the
    records answered on their first request (the input's size, re-asks aside), latency p50/p90 and
    records/min."""
    results, failures = quote(spec.output.results_table), quote(spec.output.failures_table)
    spreads = ", ".join(f"stddev_samp(coalesce(total_{name}_tokens, {name}_tokens))" for name in TOKEN_KINDS)
    first = "FILTER (WHERE attempts = 1)"  # answered on its first request: the prompt as the input made it
    row = (
        connection.row(
            f"SELECT count(*), {spreads}, quantile_cont(latency_s, 0.5), quantile_cont(latency_s, 0.9), "
            f"avg(prompt_tokens) {first}, stddev_samp(prompt_tokens) {first}, count(*) {first} "
            f"FROM {results} WHERE variant = $variant AND run_id = $run_id",
            parameters,
        )
        or (0,) * 9
    )
    numbers = run_numbers(connection, spec, parameters["run_id"])
    failed: dict[Any, Any] = dict(
        connection.rows(
            f"SELECT failure_class, count(*) FROM {failures} WHERE variant = $variant AND run_id = $run_id "
            "GROUP BY 1 ORDER BY 2 DESC, 1",
            parameters,
        )
    )
    records = int(row[0])
    return {
        "version": PROFILE_VERSION,
        "records": records,
        "failed": sum(failed.values()),
        "attempted": records + sum(failed.values()),
        "retried": _retried(connection, spec, parameters),
        "failures": {str(name): int(count) for name, count in failed.items()},
        "tokens": _tokens(numbers, dict(zip(TOKEN_KINDS, map(_float, row[1:4]), strict=True))),
        "prompt_length": {"mean": _float(row[6]), "sd": _float(row[7]), "records": int(row[8] or 0)},
        "latency_s": {"p50": _float(row[4]), "p90": _float(row[5])},
        **_speed(numbers),
    }


def _tokens(numbers: RunNumbers | None, spreads: Mapping[str, float | None]) -> dict[str, Any]:
    """Per kind of token, the ``mean`` a done record cost (its run's numbers say it:
    :attr:`RunNumbers.tokens_per_done`, every request counted) and ``sd``, how much what each result
    took over its own requests spreads, which drift judges the mean's sampling error by."""
    means = (numbers.tokens_per_done if numbers is not None else None) or {}
    return {name: {"mean": means.get(name), "sd": spreads.get(name)} for name in TOKEN_KINDS}


def _retried(connection: Database, spec: JobSpec, parameters: Mapping[str, Any]) -> int | None:
    """How many of the run's records (results and failures) had failed before it began; None when
    :func:`note_failures_before` was not called on this connection."""
    noted = connection.scalar(
        "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = $name",
        {"name": _FAILED_BEFORE},
    )
    if not noted:
        return None
    took = " UNION ALL ".join(
        f"SELECT record_id FROM {quote(table)} WHERE variant = $variant AND run_id = $run_id"
        for table in (spec.output.results_table, spec.output.failures_table)
    )
    return connection.scalar(
        f"SELECT count(*) FROM ({took}) WHERE record_id IN (SELECT record_id FROM {_FAILED_BEFORE})",
        parameters,
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _speed(numbers: RunNumbers | None) -> dict[str, float | None]:
    """Records per minute, and the run's duration (drift judges the speed of a short run loosely): its
    numbers' (:class:`RunNumbers`), as the summary line, status and report say them."""
    if numbers is None or numbers.elapsed_s <= 0:
        return {"records_per_min": None, "duration_s": None}
    return {"records_per_min": numbers.records_per_min, "duration_s": numbers.elapsed_s}


def run_numbers(connection: Database, spec: JobSpec, run_id: int) -> RunNumbers | None:
    """Run ``run_id``'s numbers, as its row has them (None: no such run). Blocking."""
    cursor = connection.execute(f"SELECT * FROM {quote(spec.output.runs_table)} WHERE run_id = ?", [run_id])
    row = cursor.fetchone()
    return None if row is None else RunNumbers.of(dict(zip(cursor.columns, row, strict=True)))


def save_profile(connection: Database, spec: JobSpec, run_id: int, profile: Mapping[str, Any]) -> None:
    connection.execute(
        f"UPDATE {quote(spec.output.runs_table)} SET profile = ? WHERE run_id = ?",
        [orjson.dumps(profile).decode(), run_id],
    )


def save_series(
    connection: Database, spec: JobSpec, run_id: int, points: Sequence[Mapping[str, Any]]
) -> None:
    connection.execute(
        f"UPDATE {quote(spec.output.runs_table)} SET series = ? WHERE run_id = ?",
        [orjson.dumps(list(points)).decode(), run_id],
    )


def stored_runs(connection: Database, spec: JobSpec, most: int) -> list[dict[str, Any]]:
    """The variant's last ``most`` runs with a profile, oldest first: their row (``run_id``,
    ``started_at``, ``ended_at``, ``status``, ``model``, ``base_url``, ``concurrency``, and the columns
    of its numbers, :class:`RunNumbers`), ``profile`` and ``series`` (None when the run kept none)."""
    cursor = connection.execute(
        f"SELECT * FROM {quote(spec.output.runs_table)} WHERE variant = $variant AND profile IS NOT NULL "
        "ORDER BY run_id DESC LIMIT $most",
        {"variant": spec.variant, "most": most},
    )
    rows = [dict(zip(cursor.columns, row, strict=True)) for row in cursor.fetchall()]
    return [_stored_run(row) for row in reversed(rows)]


def _stored_run(row: Mapping[str, Any]) -> dict[str, Any]:
    """A profiled run's row as report and drift read it. Its tokens per done record are its numbers'
    whichever version kept the profile (one before this one kept its results' own, re-asks of the
    records that failed left out), so every run is judged by the same figure."""
    started, ended = row["started_at"], row["ended_at"]
    numbers = {name: row[name] for name, _ in RUN_NUMBER_COLUMNS if name in row}  # an older row has fewer
    profile = orjson.loads(row["profile"])
    if RunNumbers.of(row).done:
        kept = profile.get("tokens") or {}
        spreads = {name: tokens.get("sd") for name, tokens in kept.items() if isinstance(tokens, dict)}
        profile["tokens"] = _tokens(RunNumbers.of(row), spreads)
    return {
        "run_id": int(row["run_id"]),
        "started_at": started.isoformat() if started else None,
        "ended_at": ended.isoformat() if ended else None,
        "status": row["status"],
        "model": row["model"],
        "base_url": row["base_url"],
        "concurrency": row["concurrency"],
        **numbers,
        "profile": profile,
        "series": orjson.loads(row["series"]) if row["series"] else None,
    }


def newest_run(connection: Database, spec: JobSpec, running_id: int | None = None) -> NewestRun | None:
    """The variant's newest run that ended, profiled or not (a quiet night, a run that ended before its
    first record); ``running_id``: the run that holds the database now (a read copy's), left out. Any
    other row still ``running`` was killed: it is ``abandoned``, as the next run marks it."""
    row = connection.row(
        "SELECT run_id, status, started_at, coalesce(done, 0) + coalesce(failed, 0) "
        f"FROM {quote(spec.output.runs_table)} "
        "WHERE variant = $variant AND status <> $bench AND run_id <> $running "
        "ORDER BY run_id DESC LIMIT 1",
        {"variant": spec.variant, "bench": BENCH, "running": running_id or 0},
    )
    if row is None:
        return None
    run_id, status, started, records = row
    status = "abandoned" if status == "running" else str(status)
    started_at = started.isoformat() if started else None
    return NewestRun(int(run_id), status, started_at, int(records), quiet=status == NOTHING_TO_DO)
