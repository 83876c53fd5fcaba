"""A judging session: the records a judge reads, what there is to judge in each, what the judge has said
so far, and how far they are. The library API of ``pipeline judge``; no HTTP (the server serves it).

The records are the seeded sample (:func:`pipeline.source.pending.sample_sql`, ``--sample N --seed S``)
that every judged variant has a result for, in id order, read once when the session starts: their texts
as the prompt shows them, each variant's answer and where its grounded values are in the text (as the
review page locates them). What is judged in an answer is :func:`~pipeline.quality.judgments.values_to_judge`.

With two variants the session is blind: each record's two answers are shown as "1" and "2", in an order
drawn per record with a key the session draws when it starts and never shows (so neither the seed nor
the record's id tells the order), and only the session knows which variant each one is. A value both
answers gave is one item on the page, judged once for both (a value's truth does not depend on who gave
it); a value marked missing is missing for each answer that does not give it.

What the judge said comes from the judgments table (and the journal of those not yet written there):
reopening the page, or starting again, goes on where they stopped. A blind session shows, counts and
goes on from only the judgments made blind between the same two variants: a verdict given seeing a
variant's name (its own page, an import, a blind page of another pair) would mark that variant's
values, so there it is neither shown nor counted, and the value is asked again. Both judgments are
kept; the later one is the one ``eval`` counts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.errors import ConfigError
from pipeline.job.spec import JobSpec
from pipeline.judging.gold_records import typed_missing
from pipeline.judging.state import Action, JudgeState, without
from pipeline.quality.agreement import id_order
from pipeline.quality.fields import grounded_paths, schema_fields
from pipeline.quality.judgments import (
    Judgment,
    JudgmentVerdict,
    ValueToJudge,
    blind_pair,
    judged_fields,
    judged_paths,
    values_to_judge,
)
from pipeline.quality.normalize import normalize_text
from pipeline.reports.reading import JobOutput, Sample, Scope, StoredResult, open_output, sample_scope
from pipeline.reports.review import ViewBuilder, prompt_fields
from pipeline.reports.review_page import VariantView
from pipeline.store.judgments import current_result_keys, read_judgments
from pipeline.store.read_copy import ReadCopy
from pipeline.wording import counted

ANSWER_IDS = ("1", "2")
MAX_MISSING_CHARS = 2000


@dataclass(frozen=True, slots=True)
class SessionOptions:
    variants: tuple[str, ...]  # one, or two judged blind
    sample: Sample
    judge: str
    # The sample was asked for: larger than a variant's results is a mistake. The default sample is
    # as many of its records as have results.
    sample_given: bool = True
    # What the blind order is drawn with: secret, so nothing the page shows tells it (answer_order).
    order_key: bytes = dataclasses.field(default_factory=lambda: secrets.token_bytes(16), repr=False)

    @property
    def blind(self) -> bool:
        return len(self.variants) == 2

    @property
    def blind_between(self) -> str:
        """The pair a blind session's judgments are made between ("" for one variant, seen)."""
        return blind_pair(self.variants) if self.blind else ""

    def shows(self, judgment: Judgment) -> bool:
        """Whether a judgment of the judge counts in this session (see the module)."""
        return judgment.variant in self.variants and (
            judgment.blind_between == self.blind_between if self.blind else True
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """One variant's answer to a record, as the page knows it: by ``answer_id`` alone when blind."""

    answer_id: str  # "1" or "2": its place on the page
    variant: str  # never sent to a blind page
    result_key: str  # the result shown (a judgment of it stays tied to it)
    values: tuple[ValueToJudge, ...]
    view: VariantView  # its grounding spans


@dataclass(frozen=True, slots=True)
class Item:
    """One value to judge on the page: a field's value, given by one answer or by both."""

    field: str
    value: str
    answers: tuple[str, ...]  # the ids of the answers that give it


@dataclass(frozen=True, slots=True)
class SessionRecord:
    record_id: str
    texts: Mapping[str, str]  # prompt field -> text as sent
    answers: tuple[Answer, ...]  # in page order
    items: tuple[Item, ...]  # field by field in schema order, each answer's values in page order

    def answer(self, answer_id: str) -> Answer:
        for answer in self.answers:
            if answer.answer_id == answer_id:
                return answer
        raise KeyError(answer_id)

    def raw_value(self, item: Item) -> object:
        """The value as the answer has it (a number stays a number)."""
        answer = self.answer(item.answers[0])
        return next(v.raw for v in answer.values if v.field == item.field and v.value == item.value)


@dataclass(frozen=True, slots=True)
class FieldProgress:
    field: str
    values: int  # items to judge
    judged: int  # items every answer of which has a verdict
    correct: int
    wrong: int
    missing: int  # values marked missing (once per record, whatever the answers)


@dataclass(frozen=True, slots=True)
class Progress:
    records: int
    records_done: int  # every item judged
    fields: tuple[FieldProgress, ...]

    @property
    def values(self) -> int:
        return sum(field.values for field in self.fields)

    @property
    def judged(self) -> int:
        return sum(field.judged for field in self.fields)


class JudgingSession:
    """The records of a session and one judge's state over them."""

    def __init__(
        self,
        spec: JobSpec,
        options: SessionOptions,
        records: Sequence[SessionRecord],
        state: JudgeState,
        read_copy: ReadCopy | None = None,
    ) -> None:
        self.spec = spec
        self.options = options
        self.records = tuple(records)
        self.state = state
        self.read_copy = read_copy
        self._specs = judged_fields(schema_fields(spec.schema_class))
        self.fields = tuple(self._specs)
        self._index = {record.record_id: index for index, record in enumerate(self.records)}

    # --- what was said

    def item_verdicts(self, record: SessionRecord, item: Item) -> list[JudgmentVerdict | None]:
        return [
            self.state.verdict((record.answer(a).variant, record.record_id, item.field, item.value))
            for a in item.answers
        ]

    def item_verdict(self, record: SessionRecord, item: Item) -> JudgmentVerdict | None:
        """The verdict that counts for ``item``: the one all its answers have (None until each has one)."""
        verdicts = self.item_verdicts(record, item)
        return verdicts[0] if verdicts[0] is not None and len(set(verdicts)) == 1 else None

    def unjudged(self, index: int) -> list[int]:
        record = self.records[index]
        return [n for n, item in enumerate(record.items) if self.item_verdict(record, item) is None]

    def start(self) -> int:
        """The first record with a value left to judge (the first record when all are judged)."""
        return next((index for index in range(len(self.records)) if self.unjudged(index)), 0)

    def missing(self, index: int) -> list[tuple[str, str, tuple[str, ...]]]:
        """(field, text, answer ids) of each value marked missing in record ``index``."""
        record = self.records[index]
        by_value: dict[tuple[str, str], list[str]] = {}
        variants = {answer.variant: answer.answer_id for answer in record.answers}
        for judgment in self.state.missing(record.record_id):
            if judgment.variant in variants:
                by_value.setdefault((judgment.field, judgment.value), []).append(variants[judgment.variant])
        return [(field, text, tuple(sorted(ids))) for (field, text), ids in by_value.items()]

    def progress(self) -> Progress:
        counts = {path: [0, 0, 0, 0, 0] for path in self.fields}  # values, judged, correct, wrong, missing
        done = 0
        for index, record in enumerate(self.records):
            left = 0
            for item in record.items:
                verdict = self.item_verdict(record, item)
                count = counts[item.field]
                count[0] += 1
                count[1] += verdict is not None
                count[2] += verdict is JudgmentVerdict.CORRECT
                count[3] += verdict is JudgmentVerdict.WRONG
                left += verdict is None
            for field, _, _ in self.missing(index):
                counts[field][4] += 1
            done += left == 0
        fields = tuple(FieldProgress(path, *count) for path, count in counts.items())
        return Progress(len(self.records), done, fields)

    # --- saying something: the judgments of one action, applied once saved

    def judge(self, index: int, item_number: int, verdict: JudgmentVerdict) -> Action:
        """Item ``item_number`` of record ``index`` is correct or wrong, for every answer that gives it."""
        if verdict is JudgmentVerdict.MISSING:
            raise ValueError("a value an answer gives is correct or wrong; missing is for values it lacks")
        record = self._record(index)
        if not 0 <= item_number < len(record.items):
            raise ValueError(f"record {record.record_id} has no value number {item_number}")
        item = record.items[item_number]
        answers = [record.answer(answer_id) for answer_id in item.answers]
        return self._action(record, [(a, item.field, item.value) for a in answers], verdict)

    def mark_missing(self, index: int, field: str, text: str) -> Action:
        """``text`` (selected in the record's text) is a value of ``field`` that the answers lacking it
        should have given."""
        record = self._record(index)
        if field not in self.fields:
            raise ValueError(f"{field!r} is not a judged field")
        text = text.strip()
        if not text or len(text) > MAX_MISSING_CHARS:
            raise ValueError(f"select the missing value in the text (1 to {MAX_MISSING_CHARS} characters)")
        try:
            typed_missing(self._specs[field], text)  # a gold value must be one the field takes
        except ValueError as error:
            raise ValueError(f"{field}: {error}") from None
        wanted = normalize_text(text)
        lacking = [
            answer
            for answer in record.answers
            if not any(v.field == field and normalize_text(v.value) == wanted for v in answer.values)
        ]
        if not lacking:
            raise ValueError(f"the answer gives {text!r} for {field}: judge it instead")
        return self._action(record, [(answer, field, text) for answer in lacking], JudgmentVerdict.MISSING)

    def saved(self, action: Action) -> None:
        self.state.apply(action)

    def last_action(self) -> Action | None:
        return self.state.last()

    def taken_back(self, action: Action) -> None:
        self.state.take_back(action)

    def where(self, action: Action) -> tuple[int, int | None]:
        """The record of ``action`` and its item (None for a missing value): where undo puts the focus."""
        index = self._index[action.record_id]
        record = self.records[index]
        item = next(
            (n for n, it in enumerate(record.items) if (it.field, it.value) == (action.field, action.value)),
            None,
        )
        return index, item

    def _record(self, index: int) -> SessionRecord:
        if not 0 <= index < len(self.records):
            raise ValueError(f"no record number {index} (the session has {len(self.records)})")
        return self.records[index]

    def _action(
        self, record: SessionRecord, values: Sequence[tuple[Answer, str, str]], verdict: JudgmentVerdict
    ) -> Action:
        now = dt.datetime.now(dt.UTC)
        return Action(
            tuple(
                Judgment(
                    record_id=record.record_id,
                    variant=answer.variant,
                    field=field,
                    value=value,
                    verdict=verdict,
                    judge=self.options.judge,
                    result_key=answer.result_key,
                    judged_at=now,
                    judgment_id=uuid.uuid4().hex,
                    blind_between=self.options.blind_between,
                )
                for answer, field, value in values
            )
        )


# --- reading a session ------------------------------------------------------------------------------


def load_session(
    spec: JobSpec, options: SessionOptions, pending: Sequence[Judgment] = (), undone: Sequence[str] = ()
) -> JudgingSession:
    """The session's records and what ``options.judge`` said of them (in the table, then ``pending``
    judgments not yet written there, less those ``undone``). Raises :class:`ConfigError`: a variant
    without results, a sample larger than its results, no sampled record with a result of each."""
    with open_output(spec) as output:
        scope = _sample(output, options)
        texts = output.texts(scope, prompt_fields(spec, options.variants))
        results = output.results(options.variants, scope)
        keys = {v: current_result_keys(output.connection, spec, v, texts) for v in options.variants}
        said = read_judgments(
            output.connection, spec, options.variants, latest_only=False, judges=[options.judge]
        )
        read_copy = output.read_copy
    if not texts:
        raise _nothing_sampled(options)
    records = _records(spec, options, texts, results, keys)
    # The journal may hold other judges' judgments, and other variants' (another session's).
    mine = [
        j for j in [*said, *pending] if j.judge == options.judge and j.record_id in texts and options.shows(j)
    ]
    state = JudgeState(without(mine, undone))
    return JudgingSession(spec, options, records, state, read_copy)


def _records(
    spec: JobSpec,
    options: SessionOptions,
    texts: Mapping[str, Mapping[str, str]],
    results: Mapping[str, Mapping[str, StoredResult]],
    keys: Mapping[str, Mapping[str, str]],
) -> list[SessionRecord]:
    """Each record with its answers in page order, their values to judge and grounding spans."""
    builder = ViewBuilder(grounded_paths(spec.schema_class))
    views = {name: builder.views(results[name], {}, texts) for name in options.variants}
    specs = schema_fields(spec.schema_class)
    paths = [path.path for path in judged_paths(specs)]
    records = []
    for record_id in sorted(texts, key=id_order):
        order = answer_order(options.variants, options.order_key, record_id)
        answers = tuple(
            Answer(
                answer_id=answer_id,
                variant=variant,
                result_key=keys[variant][record_id],
                values=tuple(values_to_judge(specs, results[variant][record_id].extracted)),
                view=views[variant][record_id],
            )
            for answer_id, variant in zip(ANSWER_IDS, order, strict=False)
        )
        records.append(SessionRecord(record_id, texts[record_id], answers, items_of(paths, answers)))
    return records


def _sample(output: JobOutput, options: SessionOptions) -> Scope:
    """The sampled records every variant has a result for; checks the sample against the results."""
    sample = options.sample
    for variant in options.variants:
        output.require_results(variant)
        count = output.connection.scalar(
            f"SELECT count(*) FROM {output.results_table} WHERE variant = $variant", {"variant": variant}
        )
        if options.sample_given and sample.size > count:
            raise ConfigError(f"--sample {sample.size}: variant {variant} has {counted(count, 'result')}")
    return Scope.all_of(sample_scope(output.spec, sample), output.extracted_by_all(options.variants))


def _nothing_sampled(options: SessionOptions) -> ConfigError:
    sample = options.sample
    each = " and of ".join(options.variants)
    return ConfigError(
        f"--sample {sample.size} --seed {sample.seed}: none of the sampled records has a result of "
        f"{each} (were the results made with another --seed?)"
    )


def answer_order(variants: Sequence[str], key: bytes, record_id: str) -> tuple[str, ...]:
    """The variants in page order for ``record_id``: two are shuffled per record by a keyed hash of its
    id, so a session shows them the same way every time, and without ``key`` (the session's secret)
    the order cannot be worked out from the record's id or the seed. The order of ``variants`` given
    does not matter."""
    ordered = tuple(sorted(variants))
    if len(ordered) < 2:
        return ordered
    digest = hmac.new(key, record_id.encode(), hashlib.sha256).digest()
    return ordered if digest[0] % 2 == 0 else ordered[::-1]


def items_of(paths: Sequence[str], answers: Sequence[Answer]) -> tuple[Item, ...]:
    """The values to judge, field by field in ``paths`` order; a value several answers give is one item."""
    items: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        for answer in answers:
            for value in answer.values:
                if value.field == path:
                    items.setdefault((path, value.value), []).append(answer.answer_id)
    return tuple(Item(field, value, tuple(ids)) for (field, value), ids in items.items())
