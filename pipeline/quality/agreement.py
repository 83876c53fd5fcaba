"""Field-by-field agreement between a reference (a gold file, or variant A) and a candidate (an
extraction to judge, or variant B), over the records both sides have.

What is scored, per field path (see :func:`~pipeline.quality.fields.scored_paths`):

* text, choice, boolean, number and other scalars: ``exact`` (equal as given) and ``accuracy`` (equal
  after normalisation: text by :func:`~pipeline.quality.normalize.normalize_text`, or fuzzy; numbers
  within the tolerance; booleans, choices and others as values; null equals null);
* lists of scalars: precision, recall and F1 of one-to-one matching, micro (TP/FP/FN pooled over
  records) and macro (the mean of each record's P/R/F1);
* lists of objects (``requirements``): the same, an object matching when all its scalar sub-fields
  match (a sub-field a reference object leaves out is unknown, and matches whatever the candidate's
  holds); and each sub-field as a list of values (``requirements[].text``), to see which part differs;
* a nested object (``salary``): each sub-field as a field of its own (``salary.minimum``).

A field's headline ``agreement`` is its accuracy (scalars) or its micro F1 (lists): records with both
lists empty add nothing, so finding nothing scores 0 when the reference has items, however many records
have none (a list field with no item on either side in any record scores 1). Overall, over the fields
counted in it:

* ``micro``: P/R/F1 pooled over every scored value: a list field adds its TP/FP/FN; a scalar adds one
  value, a match a true positive and a mismatch one false positive and one false negative;
* ``macro``: the mean of each field's headline, every field counting once.

A reference record may also say, under :data:`~pipeline.quality.judgments.JUDGED_WRONG`, which values
are wrong at a path where it does not say what is right (a gold file exported from judgments): a
candidate giving one of them there has that many false positives (a scalar: a mismatch), and no false
negative, since the right value is not known; any other candidate value there is not scored.

The sub-field paths of object lists (``requirements[].text``) are reported but not counted: they would count
those lists twice. Each record also gets an *agreement*, the mean over its fields of 1/0 for a scalar
and its F1 for a list (1 when both lists are empty), which ranks the records that disagree most.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from pipeline.errors import ConfigError
from pipeline.quality.fields import FieldKind, FieldSpec, ScoredPath, raw_values_at, select_paths, top_field
from pipeline.quality.judgments import JUDGED_WRONG
from pipeline.quality.matching import (
    UNKNOWN,
    Matcher,
    MatchSettings,
    Scores,
    list_scores,
    object_key,
    value_key,
)
from pipeline.quality.scores import (
    COLUMNS,
    LIST_KINDS,
    AgreementReport,
    FieldDifference,
    FieldScore,
    RecordAgreement,
)


def record_key(value: object) -> str:
    """One key per record id, whatever its type in a file: ``42``, ``42.0``, ``"42"`` and ``" 42 "`` are
    all ``"42"`` (strings are stripped, floats with an integer value become ints)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return [item for item in value if item is not None]
    return [value]


def _lookup(record: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """(whether the record gives ``path``, its value); a null object gives null sub-fields."""
    current: Any = record
    for name in path.split("."):
        if current is None:
            return True, None
        if not isinstance(current, Mapping) or name not in current:
            return False, None
        current = current[name]
    return True, current


def _reference_value(record: Mapping[str, Any], path: ScoredPath) -> tuple[bool, Any]:
    if "[]" in path.path:  # an object list's sub-field: given when the list is
        given, _ = _lookup(record, path.path.split("[]", 1)[0])
        return given, raw_values_at(record, path.path) if given else None
    return _lookup(record, path.path)


def _known_wrong(record: Mapping[str, Any], path: ScoredPath) -> list[Any]:
    """The values ``record`` says are wrong at ``path`` (:data:`JUDGED_WRONG`), where it gives none right."""
    wrong = record.get(JUDGED_WRONG)
    return list(wrong.get(path.path, ())) if isinstance(wrong, Mapping) else []


def _fields_given(record: Mapping[str, Any]) -> dict[str, None]:
    """The top-level fields a reference record says something of: those it gives, and those of the paths
    it knows wrong values of."""
    wrong = record.get(JUDGED_WRONG)
    known_wrong = [top_field(path) for path in wrong] if isinstance(wrong, Mapping) else []
    return dict.fromkeys([*(name for name in record if name != JUDGED_WRONG), *known_wrong])


def _candidate_value(record: Mapping[str, Any], path: ScoredPath) -> Any:
    return raw_values_at(record, path.path) if "[]" in path.path else _lookup(record, path.path)[1]


class _Counts(TypedDict):
    true_positives: int
    false_positives: int
    false_negatives: int


@dataclass(slots=True)
class _Tally:
    """What one scored path has accumulated over the records so far."""

    path: ScoredPath
    scored: int = 0
    exact: int = 0
    true_positives: int = 0
    reference_items: int = 0  # for a scalar, one per record on each side
    candidate_items: int = 0
    score_sums: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # Each scored record's COLUMNS by its position among the records scored.
    rows: dict[int, tuple[float, ...]] = field(default_factory=dict)

    def add_scalar(self, record: int, exact: bool, matched: bool) -> float:
        self.exact += exact
        self.add_list(record, int(matched), 1, 1, exact=exact)
        return 1.0 if matched else 0.0

    def add_list(
        self, record: int, matched: int, reference_items: int, candidate_items: int, *, exact: bool = False
    ) -> float:
        self.scored += 1
        self.true_positives += matched
        self.reference_items += reference_items
        self.candidate_items += candidate_items
        scores = list_scores(matched, reference_items, candidate_items)
        precision, recall, f1 = self.score_sums
        self.score_sums = (precision + scores.precision, recall + scores.recall, f1 + scores.f1)
        self.rows[record] = (1, matched, reference_items, candidate_items, exact, *_as_tuple(scores))
        return scores.f1

    def columns(self, records: int) -> array[float]:
        """Every record's COLUMNS, row after row; a record not scored for this path is zeros."""
        width = len(COLUMNS)
        values = array("f", bytes(4 * width * records))
        for record, row in self.rows.items():
            values[record * width : (record + 1) * width] = array("f", row)
        return values

    def result(self) -> FieldScore:
        path, n, matched = self.path, self.scored, self.true_positives
        counts = _Counts(
            true_positives=matched,
            false_positives=self.candidate_items - matched,
            false_negatives=self.reference_items - matched,
        )
        if path.kind not in LIST_KINDS:
            accuracy = matched / n if n else None
            exact = self.exact / n if n else None
            return FieldScore(path.path, path.kind, n, accuracy, path.in_overall, accuracy, exact, **counts)
        macro = Scores(*(total / n for total in self.score_sums)) if n else None
        micro = list_scores(matched, self.reference_items, self.candidate_items) if n else None
        agreement = micro.f1 if micro else None
        return FieldScore(
            path.path, path.kind, n, agreement, path.in_overall, micro=micro, macro=macro, **counts
        )


def _as_tuple(scores: Scores) -> tuple[float, float, float]:
    return (scores.precision, scores.recall, scores.f1)


class _Scorer:
    def __init__(self, settings: MatchSettings) -> None:
        self.matcher = Matcher(settings)

    def score(self, path: ScoredPath, reference: Any, candidate: Any, tally: _Tally, record: int) -> float:
        """The pair's agreement (0..1), added to ``tally`` as record number ``record``'s."""
        matcher = self.matcher
        if path.kind not in LIST_KINDS:
            matched = matcher.matches(value_key(path.kind, reference), value_key(path.kind, candidate))
            return tally.add_scalar(record, reference == candidate, matched)
        if path.kind is FieldKind.OBJECT_LIST:
            reference_objects = [
                object_key(path.subfields, item, partial=True) for item in _as_list(reference)
            ]
            candidate_objects = [object_key(path.subfields, item) for item in _as_list(candidate)]
            partial = any(UNKNOWN in key for key in reference_objects)
            count = matcher.count_matches(
                reference_objects, candidate_objects, matcher.object_score, partial=partial
            )
            return tally.add_list(record, count, len(reference_objects), len(candidate_objects))
        reference_items = [value_key(path.item_kind, item) for item in _as_list(reference)]
        candidate_items = [value_key(path.item_kind, item) for item in _as_list(candidate)]
        count = matcher.count_matches(reference_items, candidate_items, matcher.score)
        return tally.add_list(record, count, len(reference_items), len(candidate_items))

    def score_wrong(
        self, path: ScoredPath, wrong: Sequence[Any], candidate: Any, tally: _Tally, record: int
    ) -> float | None:
        """A path the reference knows only wrong values of: each candidate value among them is a false
        positive (added to ``tally``, agreement 0); None when the candidate gives none of them."""
        matcher = self.matcher
        if path.kind is FieldKind.OBJECT_LIST:
            given = [object_key(path.subfields, item) for item in _as_list(candidate)]
            known = [object_key(path.subfields, item) for item in wrong]
            hits = sum(
                any(matcher.object_score(a, b) >= matcher.settings.threshold for b in known) for a in given
            )
        else:
            kind = path.item_kind if path.kind is FieldKind.LIST else path.kind
            keys = [value_key(kind, item) for item in wrong]
            hits = sum(
                any(matcher.matches(value_key(kind, item), key) for key in keys)
                for item in _as_list(candidate)
            )
        return tally.add_list(record, 0, 0, hits) if hits else None


def id_order(key: str) -> tuple[int, int, str]:
    """Sort key for record ids: numbers in numeric order, then the others alphabetically."""
    try:
        return (0, int(key), "")
    except ValueError:
        return (1, 0, key)


def _by_record_key(records: Mapping[Any, Mapping[str, Any]], side: str) -> dict[str, Mapping[str, Any]]:
    keyed: dict[str, Mapping[str, Any]] = {}
    originals: dict[str, Any] = {}
    for record_id, record in records.items():
        key = record_key(record_id)
        if key in keyed:
            raise ConfigError(f"{side} record ids {originals[key]!r} and {record_id!r} are the same record")
        keyed[key], originals[key] = record, record_id
    return keyed


def _score_record(
    index: int,
    record_id: str,
    reference: Mapping[str, Any],
    candidate: Mapping[str, Any],
    tallies: Mapping[str, _Tally],
    scorer: _Scorer,
) -> RecordAgreement | None:
    agreements: list[float] = []
    differences: list[FieldDifference] = []
    for tally in tallies.values():
        path = tally.path
        given, reference_value = _reference_value(reference, path)
        candidate_value = _candidate_value(candidate, path)
        if given:
            agreement: float | None = scorer.score(path, reference_value, candidate_value, tally, index)
        elif wrong := _known_wrong(reference, path):
            reference_value = {"judged wrong": wrong}
            agreement = scorer.score_wrong(path, wrong, candidate_value, tally, index)
        else:
            continue
        if agreement is None:
            continue
        if path.in_overall:
            agreements.append(agreement)
            if agreement < 1.0:
                differences.append(FieldDifference(path.path, reference_value, candidate_value, agreement))
    if not agreements:
        return None
    return RecordAgreement(record_id, len(agreements), sum(agreements) / len(agreements), tuple(differences))


def _pooled(counted: Sequence[FieldScore]) -> tuple[Scores | None, int, int, int]:
    """The overall micro scores (None when no field was scored) and the TP, FP and FN they pool."""
    true_positives = sum(score.true_positives for score in counted)
    false_positives = sum(score.false_positives for score in counted)
    false_negatives = sum(score.false_negatives for score in counted)
    # list_scores takes the reference's and the candidate's value counts: TP + FN and TP + FP.
    scores = list_scores(true_positives, true_positives + false_negatives, true_positives + false_positives)
    return scores if counted else None, true_positives, false_positives, false_negatives


def measure_agreement(
    reference: Mapping[Any, Mapping[str, Any]],
    candidate: Mapping[Any, Mapping[str, Any]],
    specs: Sequence[FieldSpec],
    *,
    fields: Sequence[str] | None = None,
    numeric_tolerance: float = 0.0,
    fuzzy_threshold: float | None = None,
) -> AgreementReport:
    """Agreement of ``candidate`` with ``reference`` (record id -> extraction), field by field
    (:func:`pipeline.quality.intervals.with_intervals` adds an interval beside every score).

    Ids are matched by :func:`record_key`; records on one side only are listed in the report."""
    settings = MatchSettings(numeric_tolerance, fuzzy_threshold)
    reference_by_key = _by_record_key(reference, "reference")
    candidate_by_key = _by_record_key(candidate, "candidate")
    paths = select_paths(specs, [_fields_given(record) for record in reference_by_key.values()], fields)
    tallies = {path.path: _Tally(path) for path in paths}
    scorer = _Scorer(settings)
    common = sorted(reference_by_key.keys() & candidate_by_key.keys(), key=id_order)
    records = [
        agreement
        for index, key in enumerate(common)
        if (
            agreement := _score_record(
                index, key, reference_by_key[key], candidate_by_key[key], tallies, scorer
            )
        )
    ]
    scores = tuple(tally.result() for tally in tallies.values())
    return AgreementReport(
        records_scored=len(common),
        fields=scores,
        **_overall(scores),
        only_in_reference=tuple(sorted(reference_by_key.keys() - candidate_by_key.keys(), key=id_order)),
        only_in_candidate=tuple(sorted(candidate_by_key.keys() - reference_by_key.keys(), key=id_order)),
        records=tuple(sorted(records, key=lambda record: (-record.disagreement, id_order(record.record_id)))),
        settings=settings,
        record_ids=tuple(common),
        columns={path: tally.columns(len(common)) for path, tally in tallies.items()},
    )


def _overall(scores: Sequence[FieldScore]) -> dict[str, Any]:
    """The report's overall scores over the fields counted in them: micro (pooled) and macro (mean)."""
    headlines = [score.agreement for score in scores if score.in_overall and score.agreement is not None]
    micro, true_positives, false_positives, false_negatives = _pooled(
        [score for score in scores if score.in_overall and score.scored]
    )
    return {
        "micro": micro,
        "true_positives": true_positives,
        "false_positives": false_positives,
        "false_negatives": false_negatives,
        "macro": sum(headlines) / len(headlines) if headlines else None,
        "macro_fields": len(headlines),
    }
