"""The database side of the model judge: which results of a sample it judges, and writing its verdicts.

Both open the job's database for as long as they need it and close it: reading a sample opens it for
writing, so a run (or anything else) holding it is refused before a request is sent, and each batch of
verdicts is one transaction of its own. Both block: the judge calls them in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.errors import ConfigError
from pipeline.job.commands import Asked
from pipeline.job.spec import JobSpec
from pipeline.quality.fields import schema_fields
from pipeline.quality.judgments import Judgment, JudgmentVerdict, ValueToJudge, values_to_judge
from pipeline.reports.reading import JobOutput, Sample, StoredResult, sample_scope
from pipeline.source.db import open_database
from pipeline.store.judgments import current_result_keys, read_judgments, record_judgments
from pipeline.store.opening import prepare_database


@dataclass(frozen=True, slots=True)
class JudgingTask:
    """One record's result of one variant, to judge."""

    variant: str
    record_id: str
    result_key: str  # the result's key when it was read: verdicts about a redone one are not written
    texts: Mapping[str, str]  # the record's prompt fields, as the extraction sent them
    values: tuple[ValueToJudge, ...]


@dataclass(frozen=True, slots=True)
class JudgedRecord:
    task: JudgingTask
    verdicts: tuple[JudgmentVerdict, ...]  # one per value, in the values' order

    def judgments(self, judge: str) -> list[Judgment]:
        task = self.task
        return [
            Judgment(task.record_id, task.variant, value.field, value.value, verdict, judge, task.result_key)
            for value, verdict in zip(task.values, self.verdicts, strict=True)
        ]


@dataclass(slots=True)
class SampleToJudge:
    """The results of a sample, sorted: those to judge, and how many were not."""

    tasks: list[JudgingTask] = field(default_factory=list)
    records: int = 0  # records of the sample with a result, once per variant
    skipped: int = 0  # already judged by this judge, for their current result
    empty: int = 0  # no value to judge


def read_sample_to_judge(
    spec: JobSpec, variants: Sequence[str], sample: Sample | None, judge: str
) -> SampleToJudge:
    """The results of ``variants`` for the records of ``sample`` that ``judge`` has not judged yet.

    Raises :class:`ConfigError` (no database, a variant without results) or ``DatabaseLockedError``
    (a run, or anything else, holds the database)."""
    if not spec.database.exists():
        run = Asked.of(spec).command("run")
        raise ConfigError(f"{spec.database}: database does not exist yet (run `{run}` first)")
    connection = prepare_database(spec)  # for writing: refused at once while anything holds it
    try:
        output = JobOutput(connection, spec)
        for variant in variants:
            output.require_results(variant)
        scope = sample_scope(spec, sample)
        results = output.results(variants, scope)
        texts = output.texts(scope)
        done = {(j.variant, j.record_id) for j in read_judgments(connection, spec, variants, judges=[judge])}
        keys = {
            variant: current_result_keys(connection, spec, variant, results[variant]) for variant in variants
        }
    finally:
        connection.close()
    found = SampleToJudge()
    for variant in variants:
        _sort_results(spec, variant, results[variant], texts, keys[variant], done, found)
    return found


def _sort_results(
    spec: JobSpec,
    variant: str,
    results: Mapping[str, StoredResult],
    texts: Mapping[str, Mapping[str, str]],
    keys: Mapping[str, str],
    done: set[tuple[str, str]],
    found: SampleToJudge,
) -> None:
    fields = schema_fields(spec.for_variant(variant).schema_class)
    for record_id, result in sorted(results.items()):
        if record_id not in texts or record_id not in keys:
            continue  # no longer in the source
        found.records += 1
        values = tuple(values_to_judge(fields, result.extracted))
        if (variant, record_id) in done:
            found.skipped += 1
        elif not values:
            found.empty += 1
        else:
            found.tasks.append(JudgingTask(variant, record_id, keys[record_id], texts[record_id], values))


def write_judged(spec: JobSpec, judge: str, batch: Sequence[JudgedRecord]) -> list[JudgedRecord]:
    """Write the verdicts of ``batch`` in one transaction, except those about a record redone since it
    was read (about an answer it no longer has); return the records written."""
    connection = open_database(spec.database, memory_limit=spec.duckdb_memory_limit)
    try:
        kept: list[JudgedRecord] = []
        for variant in {item.task.variant for item in batch}:
            mine = [item for item in batch if item.task.variant == variant]
            current = current_result_keys(connection, spec, variant, [item.task.record_id for item in mine])
            kept += [item for item in mine if current.get(item.task.record_id) == item.task.result_key]
        record_judgments(connection, spec, [judgment for item in kept for judgment in item.judgments(judge)])
    finally:
        connection.close()
    return kept
