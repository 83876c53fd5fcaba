"""``pipeline eval JOB --judged``: precision and recall of a whole run from judged values, no gold file.

People (and a model judge) judge the values of a random sample of a variant's records
(:mod:`pipeline.store.judgments`). This reads their judgments that still count (the latest of each
judge on each value of a result not redone since) and the number of the variant's results, the
population the sample was drawn from, and measures (:mod:`pipeline.quality.judged_scores`): per field
and overall, precision and, where misses were marked, recall, each with an interval over records that
holds for the whole run. With two variants judged on the same records, B - A of precision and a
verdict, as ``eval --variants A,B``. With a model judge beside people, the people's precision and the
combined one (:mod:`pipeline.quality.ppi`) side by side, and how often the model agrees with them.

Whose judgments count: every person's (a value several people judged counts once, split by their
verdicts), or only ``--judge NAME``'s; the model judge is the one with most judgments, or ``--judge
model:NAME``. With no person's judgment at all, the table is the model's, and says it is uncalibrated.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.errors import ConfigError
from pipeline.job.commands import Asked
from pipeline.job.spec import JobSpec
from pipeline.quality.bootstrap import Bootstrap
from pipeline.quality.fields import grounded_paths, schema_fields
from pipeline.quality.judged_scores import (
    Tally,
    judged_scores,
    paired_precision,
    tally_judgments,
)
from pipeline.quality.judgments import Judgment, is_model_judge, judged_paths
from pipeline.quality.ppi import combined_precision, judge_agreement, verdict_pairs
from pipeline.reports.judged_report import (
    JudgedEvalReport,
    Judges,
    ModelCalibration,
    PairedJudgedReport,
    judged_notes,
    judged_score_rows,
    paired_judged_score_rows,
)
from pipeline.reports.reading import JobOutput, StoredResult, keys_scope, open_output
from pipeline.reports.review import ViewBuilder, page, prompt_fields, review_records, variant_agreement
from pipeline.reports.review_page import ReviewPage, ScoreRow
from pipeline.store.judgments import read_judgments
from pipeline.store.read_copy import ReadCopy
from pipeline.wording import counted


@dataclass(frozen=True, slots=True)
class JudgedSettings:
    judge: str | None = None  # only this judge's judgments (a person), or this model judge
    bootstrap: Bootstrap = field(default_factory=Bootstrap)
    review: bool = False  # also build the page (the judged records, the scores above them)


def choose_judges(judgments: Sequence[Judgment], judge: str | None, variant: str) -> Judges:
    """Whose of ``judgments`` (of ``variant``, at least one) count (see the module). Raises
    :class:`ConfigError` when ``judge`` judged none of them."""
    counts = Counter(judgment.judge for judgment in judgments)
    if judge is not None and judge not in counts:
        raise ConfigError(
            f"--judge {judge!r}: no judgment of variant {variant} by that judge "
            f"(judges: {', '.join(sorted(counts))})"
        )
    models = sorted((name for name in counts if is_model_judge(name)), key=lambda m: (-counts[m], m))
    people = sorted(name for name in counts if name not in models)
    model = judge if judge in models else (models[0] if models else None)
    others = tuple(name for name in models if name != model)
    if judge in people:
        people = [judge]
    if not people:
        if model is None:
            raise ValueError("choose_judges needs at least one judgment")
        return Judges((model,), None, by_model_only=True, others=others)
    return Judges(tuple(people), model, others=others)


def count_results(output: JobOutput, variant: str) -> int:
    sql = f"SELECT count(*) FROM {output.results_table} WHERE variant = $variant"
    return output.connection.scalar(sql, {"variant": variant})


def _paths(spec: JobSpec) -> list[str]:
    return [path.path for path in judged_paths(schema_fields(spec.schema_class))]


@dataclass(frozen=True, slots=True)
class _Read:
    """What one variant's report reads from the database."""

    population: int
    judgments: list[Judgment]  # that count
    stale: int


def _read_variant(output: JobOutput, spec: JobSpec, variant: str) -> _Read:
    output.require_results(variant)
    every = read_judgments(output.connection, spec, [variant], include_stale=True)
    current = [judgment for judgment in every if not judgment.stale]
    return _Read(count_results(output, variant), current, len(every) - len(current))


def _no_judgments(spec: JobSpec, variant: str, read: _Read) -> ConfigError:
    stale = f" (only {counted(read.stale, 'judgment')} of results redone since)" if read.stale else ""
    judge = Asked.of(spec).of_variant(variant).command("judge")
    return ConfigError(f"no judgments for variant {variant} yet: run `{judge}` first{stale}")


def evaluate_judged(spec: JobSpec, settings: JudgedSettings = JudgedSettings()) -> JudgedEvalReport:
    """Precision and recall of ``spec.variant`` from its judgments. Raises :class:`ConfigError` for a
    variant without results or without judgments, or an unknown ``settings.judge``;
    ``DatabaseLockedError`` while a run holds the database without a read copy."""
    job = str(spec.source_file)
    with open_output(spec) as output:
        read = _read_variant(output, spec, spec.variant)
        if not read.judgments:
            raise _no_judgments(spec, spec.variant, read)
        judges = choose_judges(read.judgments, settings.judge, spec.variant)
        table = [judgment for judgment in read.judgments if judgment.judge in judges.table]
        tally = tally_judgments(table, _paths(spec))
        views = _views(output, spec, [spec.variant], tally.record_ids) if settings.review else None
        read_copy = output.read_copy
    scores = judged_scores(tally, settings.bootstrap)
    model = _calibration(read.judgments, table, tally, judges, settings.bootstrap)
    report = JudgedEvalReport(job, spec.variant, read.population, judges, scores, model, read.stale)
    report = dataclasses.replace(report, read_copy=read_copy)
    if views is None:
        return report
    rows = judged_score_rows(report)
    return dataclasses.replace(
        report, review=_page(spec, [spec.variant], views, judged_notes(report), rows, read_copy)
    )


def _calibration(
    judgments: Sequence[Judgment],
    table: Sequence[Judgment],
    tally: Tally,
    judges: Judges,
    bootstrap: Bootstrap,
) -> ModelCalibration | None:
    if judges.model is None or judges.by_model_only:
        return None
    by_model = [judgment for judgment in judgments if judgment.judge == judges.model]
    model_tally = tally_judgments(by_model, tally.paths)
    combined = combined_precision(tally, model_tally, bootstrap.confidence)
    agreement = judge_agreement(verdict_pairs(table, by_model))
    return ModelCalibration(judges.model, model_tally.records, agreement, combined)


def evaluate_judged_pair(
    spec: JobSpec, variants: Sequence[str], settings: JudgedSettings = JudgedSettings()
) -> PairedJudgedReport:
    """B - A of precision, both judged on the same records (``variants``: A, B). Raises
    :class:`ConfigError` as :func:`evaluate_judged` does, and when no record was judged in both."""
    name_a, name_b = variants
    with open_output(spec) as output:
        reads = [_read_variant(output, spec, name) for name in variants]
        for name, read in zip(variants, reads, strict=True):
            if not read.judgments:
                raise _no_judgments(spec, name, read)
        judges = choose_judges(
            [j for read in reads for j in read.judgments], settings.judge, f"{name_a} or {name_b}"
        )
        tallies = [
            tally_judgments([j for j in read.judgments if j.judge in judges.table], _paths(spec))
            for read in reads
        ]
        both = [record for record in tallies[0].record_ids if record in set(tallies[1].record_ids)]
        if not both:
            raise ConfigError(
                f"no record has judgments of both {name_a} and {name_b}: judge the same sample of both "
                "variants to compare them"
            )
        views = _views(output, spec, variants, both) if settings.review else None
        read_copy = output.read_copy
    comparison = paired_precision(tallies[0], tallies[1], settings.bootstrap)
    populations = (reads[0].population, reads[1].population)
    report = PairedJudgedReport((name_a, name_b), populations, judges, comparison, read_copy=read_copy)
    if views is None:
        return report
    notes = judged_notes(report)
    review = _page(spec, variants, views, notes, paired_judged_score_rows(report), read_copy, agree=True)
    return dataclasses.replace(report, review=review)


@dataclass(frozen=True, slots=True)
class _Views:
    texts: dict[str, dict[str, str]]
    results: list[dict[str, StoredResult]]  # per variant: record key -> its result


def _views(output: JobOutput, spec: JobSpec, variants: Sequence[str], records: Sequence[str]) -> _Views:
    """The texts and results of the judged records, for the page."""
    scope = keys_scope(records)
    wanted = set(records)
    texts = {
        key: value
        for key, value in output.texts(scope, prompt_fields(spec, variants)).items()
        if key in wanted
    }
    found = output.results(variants, scope)
    return _Views(
        texts, [{key: value for key, value in found[name].items() if key in wanted} for name in variants]
    )


def _page(
    spec: JobSpec,
    variants: Sequence[str],
    views: _Views,
    notes: Sequence[str],
    rows: Sequence[ScoreRow],
    read_copy: ReadCopy | None,
    *,
    agree: bool = False,
) -> ReviewPage:
    """The judged records, each variant's extraction beside its text, the scores above them."""
    builder = ViewBuilder(grounded_paths(spec.schema_class))
    by_variant = {
        name: builder.views(results, {}, views.texts)
        for name, results in zip(variants, views.results, strict=True)
    }
    agreement = variant_agreement(spec, views.results[0], views.results[1]) if agree else None
    records = review_records(views.texts, by_variant, agreement)
    return page(spec, variants, records, [*notes, *builder.note()], rows, read_copy)
