"""Judgments in and gold out: ``pipeline judge JOB --import FILE`` and ``--export-gold FILE``.

Import reads judgments made elsewhere, JSON lines, one judgment a line (or a ``.json`` list of them:
:mod:`pipeline.quality.json_files` reads either)::

    {"record_id": 42, "variant": "main", "field": "salary.minimum", "value": 35000, "verdict": "correct",
     "judge": "ann"}

``variant`` defaults to the job's (``main``), ``judge`` to the login name; ``value`` is any JSON value (as
:func:`~pipeline.quality.judgments.value_text` shows it: ``35000``, ``true``, an object's JSON). A value
judged correct or wrong must be one the record's current answer gives; a value marked ``missing`` one it
does not. Every line is checked before anything is written, and the file goes in one transaction: a bad
line is one error naming the file and the line, and nothing of the file is imported.

An import counts once: per (record, variant, field, value, judge) of the record's current result, a
judgment the table already holds with the same verdict is left as it is, one with another verdict is
replaced (the imported one becomes the latest, the one that counts), and only the rest is added, so
importing a file twice writes nothing the second time. A value given twice in one file with the same
verdict counts once; with two verdicts it is an error naming both lines.

Export writes a gold file that ``pipeline eval JOB --gold FILE`` reads: one JSON line per judged record,
its id and what the judges established in it (:mod:`pipeline.judging.gold_records`: the right values of
its settled fields, and the wrong ones where nothing right is known), from the judgments that count
(the latest of each value over the chosen judges, default every person; stale ones left out).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.judging.gold_records import GoldRecord, gold_record, latest_verdicts, typed_missing
from pipeline.quality.agreement import id_order, record_key
from pipeline.quality.fields import FieldSpec, did_you_mean, schema_fields
from pipeline.quality.json_files import read_json_objects
from pipeline.quality.judgments import (
    Judgment,
    JudgmentVerdict,
    ValueToJudge,
    judged_fields,
    value_text,
    values_to_judge,
)
from pipeline.reports.html_page import write_page
from pipeline.reports.reading import JobOutput, StoredResult, keys_scope, open_output
from pipeline.store.judgments import Merged, merge_judgments, read_judgments
from pipeline.store.opening import prepare_database

KEYS = ("record_id", "variant", "field", "value", "verdict", "judge")
GOLD_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True, slots=True)
class Imported:
    path: Path
    judges: Mapping[str, int]  # judge -> judgments in the file (each value once)
    merged: Merged  # how many were added, replaced (another verdict) and left as they were

    @property
    def count(self) -> int:
        return sum(self.judges.values())


@dataclass(frozen=True, slots=True)
class GoldExport:
    path: Path
    records: int  # gold records written
    judged_records: int  # records with a judgment that counts (some may have no settled field)
    judges: tuple[str, ...]
    unreadable: int = 0  # values marked missing that do not read as their field's kind: left out


@dataclass(frozen=True, slots=True)
class _Line:
    where: str  # "judgments.jsonl: line 7"
    judgment: Judgment
    at: str = ""  # "line 7"


# --- import ---------------------------------------------------------------------------------------------


def import_judgments(spec: JobSpec, path: Path, *, judge: str, variant: str | None = None) -> Imported:
    """Import ``path``'s judgments into the job's database (``judge``, ``variant``: what a line without
    one means). Raises :class:`ConfigError` for the first bad line, and imports nothing then."""
    lines = _once_each(list(_parsed_lines(spec, path, judge, variant or spec.variant)))
    if not lines:
        raise ConfigError(f"{path}: no judgments")
    connection = prepare_database(spec)
    try:
        output = JobOutput(connection, spec)
        variants = sorted({line.judgment.variant for line in lines})
        records = {line.judgment.record_id for line in lines}
        results = output.results(variants, keys_scope(records))
        specs = schema_fields(spec.schema_class)
        for line in lines:
            _check_against_answer(line, results, specs)
        merged = merge_judgments(connection, spec, [line.judgment for line in lines])
    finally:
        connection.close()
    return Imported(path, dict(Counter(line.judgment.judge for line in lines)), merged)


def _once_each(lines: Sequence[_Line]) -> list[_Line]:
    """Each (record, variant, field, value, judge) once: a line that repeats an earlier one is left
    out; one that gives it another verdict is a :class:`ConfigError` naming both lines (which of the
    two the judge meant, the file does not say)."""
    first: dict[tuple[str, str, str, str, str], _Line] = {}
    for line in lines:
        earlier = first.setdefault(line.judgment.key, line)
        if earlier.judgment.verdict != line.judgment.verdict:
            judgment = line.judgment
            raise ConfigError(
                f"{line.where}: {judgment.verdict} for {judgment.value!r} of {judgment.field} in record "
                f"{judgment.record_id!r} by {judgment.judge}, which {earlier.at} judged "
                f"{earlier.judgment.verdict}: give each value one verdict"
            )
    return list(first.values())


def _parsed_lines(spec: JobSpec, path: Path, judge: str, variant: str) -> Iterator[_Line]:
    fields = judged_fields(schema_fields(spec.schema_class))
    for found in read_json_objects(path, "the judgments"):
        where = f"{path}: {found.where}"
        yield _Line(where, _judgment(where, found.value, fields, judge, variant), found.where)


def _judgment(
    where: str, item: Mapping[str, Any], fields: Mapping[str, FieldSpec], judge: str, variant: str
) -> Judgment:
    unknown = [key for key in item if key not in KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], KEYS)}")
    field = _text(where, item, "field")
    if field not in fields:
        raise ConfigError(f"{where}: unknown field {field!r}{did_you_mean(field, fields)}")
    verdict = _text(where, item, "verdict")
    if verdict not in set(JudgmentVerdict):
        hint = did_you_mean(verdict, list(JudgmentVerdict)) or f" (one of {', '.join(JudgmentVerdict)})"
        raise ConfigError(f"{where}: unknown verdict {verdict!r}{hint}")
    if item.get("value") is None or value_text(item["value"]) == "":
        raise ConfigError(f"{where}: no value (the value judged, or for missing the value the answer lacks)")
    if verdict == JudgmentVerdict.MISSING:
        try:
            typed_missing(fields[field], value_text(item["value"]))  # a gold value the field takes
        except ValueError as error:
            raise ConfigError(f"{where}: missing {field}: {error}") from None
    return Judgment(
        record_id=_record_id(where, item.get("record_id")),
        variant=_text(where, item, "variant", variant),
        field=field,
        value=value_text(item["value"]),
        verdict=JudgmentVerdict(verdict),
        judge=_text(where, item, "judge", judge),
    )


def _text(where: str, item: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key!r} must be a non-empty string, got {orjson.dumps(value).decode()}")
    return value.strip()


def _record_id(where: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value).strip():
        raise ConfigError(f"{where}: 'record_id' must be the record's id (a string or a number)")
    return record_key(value)


def _check_against_answer(
    line: _Line, results: Mapping[str, Mapping[str, StoredResult]], specs: Sequence[FieldSpec]
) -> None:
    judgment = line.judgment
    result = results.get(judgment.variant, {}).get(judgment.record_id)
    if result is None:
        raise ConfigError(
            f"{line.where}: record {judgment.record_id!r} has no result of variant {judgment.variant!r} "
            "(not extracted, failed, or no longer in the source)"
        )
    given = [v.value for v in values_to_judge(specs, result.extracted) if v.field == judgment.field]
    if judgment.verdict is JudgmentVerdict.MISSING and judgment.value in given:
        raise ConfigError(
            f"{line.where}: the answer gives {judgment.value!r} for {judgment.field}: it is not missing "
            "(judge it correct or wrong)"
        )
    if judgment.verdict is not JudgmentVerdict.MISSING and judgment.value not in given:
        shown = ", ".join(repr(value) for value in given[:5]) or "none"
        raise ConfigError(
            f"{line.where}: {judgment.value!r} is not a value of {judgment.field} in record "
            f"{judgment.record_id!r} of variant {judgment.variant} (its values: {shown})"
        )


# --- export ---------------------------------------------------------------------------------------------


def export_gold(
    spec: JobSpec, path: Path, *, judges: Sequence[str] | None = None, variants: Sequence[str] | None = None
) -> GoldExport:
    """Write the gold file of the judged records to ``path`` (atomically). ``judges``: whose judgments
    (default every person, no model); ``variants``: whose answers (default every judged one). Raises
    :class:`ConfigError` when there is nothing to export or ``path`` is not a JSON lines file."""
    if path.suffix.lower() not in GOLD_SUFFIXES:
        raise ConfigError(f"--export-gold {path}: a gold file is JSON lines: name it .jsonl")
    with open_output(spec) as output:
        counted = [
            judgment
            for judgment in read_judgments(output.connection, spec, variants)
            if (judgment.judge in judges if judges else not judgment.by_model)
        ]
        if not counted:
            raise ConfigError(f"{spec.database}: no judgments {_of_whom(judges)} to export")
        judged = sorted({judgment.variant for judgment in counted})
        results = output.results(judged, keys_scope({judgment.record_id for judgment in counted}))
    by_record: dict[str, list[Judgment]] = {}
    for judgment in counted:  # oldest first, as read: the latest of a value counts
        by_record.setdefault(judgment.record_id, []).append(judgment)
    records = [(record_id, _gold_record(spec, by_record[record_id], results)) for record_id in by_record]
    lines = [
        orjson.dumps(gold.to_json(spec.source.id_column, record_id)).decode()
        for record_id, gold in sorted(records, key=lambda pair: id_order(pair[0]))
        if gold
    ]
    if not lines:
        raise ConfigError(f"{spec.database}: no judged record has a field every value of which is judged")
    write_page("\n".join(lines) + "\n", path, "the gold file")
    unreadable = sum(gold.unreadable for _, gold in records)
    return GoldExport(path, len(lines), len(by_record), tuple(sorted({j.judge for j in counted})), unreadable)


def _gold_record(
    spec: JobSpec, judgments: Sequence[Judgment], results: Mapping[str, Mapping[str, StoredResult]]
) -> GoldRecord:
    """One record's gold from its ``judgments`` and the answers they judged."""
    specs = schema_fields(spec.schema_class)
    record_id = judgments[0].record_id
    answers: dict[str, list[ValueToJudge]] = {
        variant: values_to_judge(specs, results[variant][record_id].extracted)
        for variant in {judgment.variant for judgment in judgments}
        if record_id in results[variant]
    }
    return gold_record(judged_fields(specs), answers, latest_verdicts(judgments))


def _of_whom(judges: Sequence[str] | None) -> str:
    return f"by {', '.join(judges)}" if judges else "by a person"
