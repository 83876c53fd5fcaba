"""The answer breaker: a window of records (in the order they were sent) whose answers all failed, or
whose valid share collapsed against the records sent before them, stops the run; a normal run's few bad
answers never do, whatever order its records finish in."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import anyio
import httpx2
import orjson
import pytest

from pipeline.errors import EXIT_ABORTED, AnswersRejectedError, FailureClass, exit_code_for
from pipeline.extraction.outcomes import Extracted, Failed, Outcome, Usage
from pipeline.job.commands import command
from pipeline.run.answer_breaker import WINDOW, AnswerBreaker
from pipeline.run.options import RunStatus
from pipeline.servers.replies import Reply
from tests.support.fakes import completion, good_completion, respond
from tests.support.jobs import make_job, table_rows
from tests.support.outputs import record_number
from tests.support.runs import run_served

REPLY = Reply('{"a": 1}', None, "stop", 100, 40, None, 0.1)
GARBAGE = (
    "Sure! Here is the JSON you asked for:\n\n{title: Data Engineer, skills: [SQL, Python] ...  and more"
)


def valid(record_id: int) -> Extracted:
    return Extracted(record_id, '{"a": 1}', 1, REPLY, Usage(1), 256)


def failed(
    record_id: int, failure_class: FailureClass = FailureClass.INVALID_JSON, raw: str | None = GARBAGE
) -> Failed:
    message = "not valid JSON (unexpected character: line 1 column 1 (char 0))"
    return Failed(record_id, failure_class, message, 3, raw, Usage(3), 256)


def feed(breaker: AnswerBreaker, outcomes: list[Outcome]) -> list[AnswersRejectedError]:
    """Each record sent, then finished, one after the other."""
    return [error for outcome in outcomes if (error := breaker.observe(breaker.sent(), outcome)) is not None]


def finish_out_of_turn(breaker: AnswerBreaker, outcomes: list[Outcome]) -> list[AnswersRejectedError]:
    """Every record sent at once, then the valid ones finishing first and the failed ones (on their
    later attempts) last: the order a run mostly in flight at once finishes in."""
    turns = {outcome.record_id: breaker.sent() for outcome in outcomes}
    in_finishing_order = sorted(outcomes, key=lambda outcome: isinstance(outcome, Failed))
    observed = (breaker.observe(turns[outcome.record_id], outcome) for outcome in in_finishing_order)
    return [error for error in observed if error is not None]


def test_the_stop_names_the_plain_run_it_is_given() -> None:
    plain = "/venv/bin/pipeline run 'my job.yaml' --database trial.duckdb --variant quick"
    breaker = AnswerBreaker(plain_run=plain)
    (tripped,) = feed(breaker, [failed(i, FailureClass.INVALID_JSON) for i in range(WINDOW)])
    assert str(tripped).endswith(f"once the server is fixed a plain run (`{plain}`) does them")


def test_a_window_of_records_whose_answers_all_failed_trips_once_with_one_line() -> None:
    breaker = AnswerBreaker()
    classes = [FailureClass.INVALID_JSON, FailureClass.SCHEMA_INVALID]
    tripped = feed(breaker, [failed(i, classes[i % 2]) for i in range(WINDOW + 5)])
    assert len(tripped) == 1 and breaker.tripped is tripped[0]
    message = str(tripped[0])
    assert "\n" not in message
    assert f"the first {WINDOW} records to finish all failed after their re-asks, none valid" in message
    assert f"invalid_json {WINDOW // 2}, schema_invalid {WINDOW // 2}" in message
    assert "'Sure! Here is the JSON you asked for: {title: Data Engineer," in message  # shortened, one line
    assert "and more" not in message
    assert message.endswith("a plain run does them")  # no command it was not given to name
    assert exit_code_for(tripped[0]) == EXIT_ABORTED
    # every record failed in the window (and the ones after: they were in flight) stays retryable
    assert breaker.kept_retryable == list(range(WINDOW + 5))


def test_a_window_not_yet_full_does_not_trip() -> None:
    breaker = AnswerBreaker()
    assert feed(breaker, [failed(i) for i in range(WINDOW - 1)]) == []
    assert breaker.kept_retryable == []


def test_an_empty_answer_is_named_as_such() -> None:
    breaker = AnswerBreaker()
    tripped = feed(breaker, [failed(i, FailureClass.EMPTY, raw=None) for i in range(WINDOW)])
    assert f"empty {WINDOW}" in str(tripped[0]) and "(no content)" in str(tripped[0])


def test_failures_that_say_nothing_of_the_answers_do_not_count() -> None:
    """Transient and permanent failures are the server's (retry.abort_after_consecutive_failures stops
    those); a too_long record was never sent."""
    breaker = AnswerBreaker()
    neutral = [FailureClass.TRANSIENT, FailureClass.PERMANENT, FailureClass.TOO_LONG]
    outcomes: list[Outcome] = [failed(i, neutral[i % 3]) for i in range(10 * WINDOW)]
    outcomes += [failed(10 * WINDOW + i) for i in range(WINDOW - 1)]
    assert feed(breaker, outcomes) == []


@pytest.mark.parametrize("bad_share", [0.05, 0.10, 0.25])
def test_a_normal_run_with_some_bad_answers_never_trips(bad_share: float) -> None:
    rng = random.Random(22)
    breaker = AnswerBreaker()
    outcomes = [failed(i) if rng.random() < bad_share else valid(i) for i in range(200_000)]
    assert feed(breaker, outcomes) == []


def test_a_collapse_against_the_run_so_far_trips_within_a_window() -> None:
    rng = random.Random(7)
    breaker = AnswerBreaker()
    before = [failed(i) if rng.random() < 0.05 else valid(i) for i in range(400)]
    assert feed(breaker, before) == []
    after = [
        valid(i) if rng.random() < 0.1 else failed(i, FailureClass.SCHEMA_INVALID) for i in range(400, 800)
    ]
    tripped_at = next(o.record_id for o in after if breaker.observe(breaker.sent(), o) is not None)
    assert isinstance(tripped_at, int) and tripped_at < 400 + WINDOW  # within one window of the collapse
    message = str(breaker.tripped)
    assert (
        f"of records #{tripped_at - WINDOW + 2:,}-#{tripped_at + 1:,} in the order they were sent valid"
        in message
    )
    assert "against 9" in message and "judged records sent before them" in message
    assert "schema_invalid" in message
    kept = [int(record_id) for record_id in breaker.kept_retryable]  # the window's failures, most after it
    assert kept and all(tripped_at - WINDOW < record_id <= tripped_at for record_id in kept)
    assert sum(record_id >= 400 for record_id in kept) > WINDOW // 2


def test_a_run_that_was_always_poor_is_not_a_collapse() -> None:
    """Half the records failing from the start is a poor model, not a server that broke mid-run: the
    window is compared with the run's own share."""
    rng = random.Random(3)
    breaker = AnswerBreaker()
    assert feed(breaker, [failed(i) if rng.random() < 0.5 else valid(i) for i in range(100_000)]) == []


@pytest.mark.parametrize("records", [100, 200, 2_500])
@pytest.mark.parametrize("bad_share", [0.05, 0.13, 0.25])
def test_records_failing_on_later_attempts_finish_last_and_still_never_trip(
    records: int, bad_share: float
) -> None:
    """A run mostly in flight at once: its first-try successes finish first and its failures (after
    two re-asks) last, so in finishing order its tail is all failures. Judged as sent, it is not."""
    rng = random.Random(records)
    outcomes = [failed(i) if rng.random() < bad_share else valid(i) for i in range(records)]
    breaker = AnswerBreaker()
    assert finish_out_of_turn(breaker, outcomes) == []
    assert breaker.waiting == 0  # every record judged once all had finished


def test_a_record_finishing_before_those_sent_ahead_of_it_waits_for_them() -> None:
    breaker = AnswerBreaker()
    assert feed(breaker, [valid(i) for i in range(1, 41)]) == []  # a server that worked, then broke
    turns = [breaker.sent() for _ in range(WINDOW)]
    for turn in turns[1:]:  # all but the first sent fail, and finish before it
        assert breaker.observe(turn, failed(turn)) is None
    assert breaker.waiting == WINDOW - 1 and breaker.tripped is None
    tripped = breaker.observe(turns[0], failed(turns[0]))  # judged now, with the 31 that waited for it
    assert tripped is not None and breaker.waiting == 0
    assert "8 of records #33-#64 in the order they were sent valid after their re-asks" in str(tripped)


def test_records_not_judged_hold_their_turn_and_are_named_in_the_span() -> None:
    breaker = AnswerBreaker()
    outcomes: list[Outcome] = [valid(0)]
    for i in range(1, WINDOW + 6):  # every ninth record a server error: not judged, but sent
        outcomes.append(failed(i, FailureClass.TRANSIENT if i % 9 == 8 else FailureClass.INVALID_JSON))
    tripped = feed(breaker, outcomes)
    assert len(tripped) == 1
    assert f"records #2-#{WINDOW + 5} in the order they were sent ({WINDOW} of them judged)" in str(
        tripped[0]
    )


def test_a_run_with_nothing_valid_stops_once_any_window_of_records_has_finished() -> None:
    """A server that never answers validly is stopped when the first records to finish have all
    failed, whichever were sent first: at c=256 the first records sent finish with all the others."""
    breaker = AnswerBreaker()
    turns = [breaker.sent() for _ in range(8 * WINDOW)]
    late = turns[WINDOW:]  # sent after the first window, finishing first
    tripped = [error for turn in late[:WINDOW] if (error := breaker.observe(turn, failed(turn)))]
    assert len(tripped) == 1 and "none valid" in str(tripped[0])
    assert sorted(int(record_id) for record_id in breaker.kept_retryable) == late[:WINDOW]


def test_failures_finishing_first_are_no_alarm_once_a_record_was_valid() -> None:
    breaker = AnswerBreaker()
    turns = [breaker.sent() for _ in range(4 * WINDOW)]
    for turn in turns[1:WINDOW]:  # one short of a window of failures finish first
        assert breaker.observe(turn, failed(turn)) is None
    assert breaker.observe(turns[WINDOW], valid(turns[WINDOW])) is None
    for turn in turns[WINDOW + 1 :]:  # the rest: 7 in 8 valid
        assert breaker.observe(turn, failed(turn) if turn % 8 == 0 else valid(turn)) is None
    assert breaker.observe(turns[0], valid(turns[0])) is None  # the first window: 1 valid of 32
    assert breaker.tripped is None


def test_at_the_trip_the_failures_that_finished_out_of_turn_are_kept_retryable_too() -> None:
    breaker = AnswerBreaker()
    turns = [breaker.sent() for _ in range(WINDOW + 10)]
    for turn in turns[WINDOW:]:  # sent after the window, finished before it
        breaker.observe(turn, failed(turn))
    for turn in turns[:WINDOW]:
        breaker.observe(turn, failed(turn))
    assert breaker.tripped is not None
    assert sorted(int(record_id) for record_id in breaker.kept_retryable) == turns
    late = breaker.sent()
    breaker.observe(late, failed(late))  # still in flight when the run stopped
    breaker.observe(breaker.sent(), valid(late + 1))
    assert len(breaker.kept_retryable) == WINDOW + 11


# -- in a run ---------------------------------------------------------------------------------------


class GarbageServer:
    """Answers every completion with ``content`` (until ``fixed``), counting the requests."""

    def __init__(self, content: str) -> None:
        self.content = content
        self.fixed = False
        self.requests = 0

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        self.requests += 1
        return respond(good_completion() if self.fixed else completion(self.content))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "failure_class"),
    [
        ("analysis: the user wants JSON.assistantfinal {not json", "invalid_json"),
        ('{"title": "Data Engineer", "skills": "SQL"}', "schema_invalid"),
    ],
)
async def test_a_server_whose_answers_never_validate_stops_the_run_and_burns_no_record(
    tmp_path: Path, content: str, failure_class: str
) -> None:
    spec = make_job(tmp_path, records=400, concurrency=32)
    server = GarbageServer(content)
    with pytest.raises(
        AnswersRejectedError,
        match=f"all failed after their re-asks, none valid \\({failure_class} {WINDOW}\\)",
    ) as raised:
        await run_served(spec, server)
    assert server.requests <= 300  # 3 attempts per record: 1,200 without the breaker
    assert content[:20] in str(raised.value)
    plain = command("run", str(spec.source_file))  # the program by its path: pasted anywhere
    assert str(raised.value).endswith(f"once the server is fixed a plain run (`{plain}`) does them")
    runs = table_rows(spec.database, "SELECT status, message FROM runs")
    assert runs == [("aborted", str(raised.value))]
    # nothing was marked failed for good: what failed in the window is kept as transient
    permanent = table_rows(spec.database, "SELECT count(*) FROM failures WHERE failure_class <> 'transient'")
    assert permanent == [(0,)]
    kept = table_rows(spec.database, "SELECT failure_class, message FROM failures")
    assert all(message.startswith("the run stopped: the server's answers") for _, message in kept)
    # the window the message names is stored whole: its last record is not lost to the stop
    window = table_rows(spec.database, f"SELECT count(*) FROM failures WHERE record_id <= {WINDOW}")
    assert window == [(WINDOW,)] and len(kept) >= WINDOW

    server.fixed = True  # once the server is fixed, a plain run (no --retry-failed) does all of them
    summary = await run_served(spec, server)
    assert summary.status is RunStatus.COMPLETED and summary.done == 400
    assert table_rows(spec.database, "SELECT count(*), count(DISTINCT record_id) FROM results") == [
        (400, 400)
    ]
    assert table_rows(spec.database, "SELECT count(*) FROM failures") == [(0,)]


@pytest.mark.anyio
async def test_a_tenth_of_the_records_failing_does_not_stop_the_run(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=400, concurrency=32)

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        if record_number(request) % 10 == 7:
            return respond(completion("not JSON at all"))
        return respond(good_completion())

    summary = await run_served(spec, answer)
    assert summary.status is RunStatus.COMPLETED_WITH_FAILURES
    assert (summary.done, summary.failed) == (360, 40)
    assert table_rows(spec.database, "SELECT DISTINCT failure_class FROM failures") == [("invalid_json",)]


@pytest.mark.anyio
async def test_retrying_records_that_failed_before_is_not_a_server_that_broke(tmp_path: Path) -> None:
    """``--only-failed`` (or ``--retry-failed``) asks again for records known to fail: more than a window
    of them failing again says nothing of the server, and they stay failures of their own."""
    spec = make_job(tmp_path, records=400, concurrency=8)

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/models"):
            return respond({"data": [{"id": "test-model"}]})
        if record_number(request) % 10 == 0:  # these records never get a valid answer
            return respond(completion("not JSON at all"))
        return respond(good_completion())

    first = await run_served(spec, answer)
    assert (first.done, first.failed) == (360, 40)
    again = await run_served(spec, answer, only_failed=True)
    assert again.status is RunStatus.COMPLETED_WITH_FAILURES and again.failed == 40
    assert table_rows(spec.database, "SELECT failure_class, count(*) FROM failures GROUP BY 1") == [
        ("invalid_json", 40)
    ]


async def a_weak_model_on_a_hard_job(request: httpx2.Request) -> httpx2.Response:
    """Every eighth record is too hard: no answer of it is JSON, so it fails after its two re-asks and
    finishes last. A quarter of the others need one re-ask (which are is fixed by the record). Each
    answer takes a moment, as a server's do: the records sent together finish by their attempts."""
    if request.url.path.endswith("/models"):
        return respond({"data": [{"id": "test-model"}]})
    await anyio.sleep(ANSWER_S)
    number = record_number(request)
    first_attempt = len(orjson.loads(request.content)["messages"]) == 2  # a re-ask adds two messages
    if number % 8 == 3 or (first_attempt and hash_of(number) % 4 == 0):
        return respond(completion("Sure! {title: ..."))
    return respond(good_completion())


ANSWER_S = 0.25


def hash_of(number: int) -> int:
    return int.from_bytes(hashlib.blake2b(str(number).encode(), digest_size=4).digest(), "big")


@pytest.mark.anyio
@pytest.mark.parametrize(("records", "concurrency"), [(200, 256), (400, 32)])
async def test_an_eighth_of_the_records_failing_after_their_reasks_does_not_stop_the_run(
    tmp_path: Path, records: int, concurrency: int
) -> None:
    """The failing records finish last (on their third attempt): judged as they finished, the tail of
    the run, and the whole of one smaller than its concurrency, looked like a server that broke."""
    spec = make_job(tmp_path, records=records, concurrency=concurrency)
    summary = await run_served(spec, a_weak_model_on_a_hard_job)
    assert summary.status is RunStatus.COMPLETED_WITH_FAILURES
    assert (summary.done, summary.failed) == (records * 7 // 8, records // 8)
