"""The shortest sequences of the state machine (test_nights.py) that broke an invariant, kept as tests:
what the random search found, and what was found from outside before the machine existed, replayed
step by step with every invariant checked after each step, as the machine checks them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.properties.test_nights import Nights
from tests.support.drawn_jobs import KINDS, DrawnSchema, FieldKind

pytestmark = pytest.mark.integration

TEXT = next(kind for kind in KINDS if kind.annotation == "str")
OPTIONAL_DATE = next(kind for kind in KINDS if kind.annotation == "datetime.date | None")
POSTINGS = [("Data Engineer", "SQL and Python, Leeds"), ("Nurse", "Band 5, nights"), ("Chef", "Kitchen")]


def replay(first: list[tuple[str, str]], *steps: Callable[[Nights], object], kind: FieldKind = TEXT) -> None:
    """A project of ``first`` on a one-field schema of ``kind``, then ``steps``, every invariant after
    each, as the machine runs a sequence."""
    state = Nights()
    try:
        state.start(DrawnSchema((("skills", kind),)), concurrency=8, first=first, file_format="csv")
        state.every_record_once_and_nothing_lost()
        for step in steps:
            step(state)
            state.every_record_once_and_nothing_lost()
    finally:
        state.teardown()


def test_a_source_of_one_blank_record_is_said_so_by_check() -> None:
    """Found by the machine: check said 'the source has no records to probe the server with' (and load
    '1 record ...; they will not be sent')."""
    replay([("", "")], Nights.check_then_run)


def test_blank_records_loaded_before_the_first_run_are_blank_in_status() -> None:
    """Found by the machine: load said "2 records have empty title and body ...; they will not be
    sent", and status --json before the first run counted them pending, blank 0."""
    replay(POSTINGS, lambda state: state.load([("Welder", "MIG")], [], 2, 0, "csv"), Nights.status)


def test_a_variants_run_is_said_alike_by_the_variants_status_and_report() -> None:
    """Found by the soak: a pasted `run --redo-stale --variant short` was compared with the main variant's
    status, whose last run is another run (the property's reading, not the pipeline's)."""

    def variant_run(state: Nights) -> None:
        assert state.project is not None
        state.night("run", str(state.project.job), "--variant", "short")

    replay(POSTINGS, lambda state: state.run(None, None, None), variant_run)


def test_a_new_jobs_status_json_has_every_stale_key() -> None:
    """Found by the machine: "stale": {} before the first run, every cause's key after it."""
    replay(POSTINGS, Nights.status, lambda state: state.run(None, None, None), Nights.status)


def test_a_blank_record_is_never_sent() -> None:
    """Found from outside: a record whose prompt fields were all empty came back with an invented
    extraction."""
    replay([("", " "), *POSTINGS], lambda state: state.run(None, None, None), Nights.check_then_run)


def test_a_4096_context_without_tokenize_sends_no_budget_below_the_floor() -> None:
    """Found from outside: before any count the first requests carried max_tokens of 26-175 for prompts
    of ~3,000 tokens with ~1,080 of room, and came back cut off."""
    replay(
        POSTINGS,
        lambda state: state.load([], [], 0, 3_000, "jsonl"),
        lambda state: state.server_context(4096, False),
        lambda state: state.run(None, None, 64),
    )


def test_records_too_long_for_the_context_are_refused_unsent_when_retried() -> None:
    """Found from outside: `--only-failed --class too_long` sent the too-long records again."""
    replay(
        POSTINGS,
        lambda state: state.load([], [], 0, 6_000, "parquet"),
        lambda state: state.server_context(4096, True),
        lambda state: state.run(None, None, None),
        lambda state: state.retry_failed("too_long", "--only-failed"),
        Nights.check_then_run,
    )


def test_a_quiet_night_with_a_wrong_model_or_endpoint_is_no_quiet_night() -> None:
    """Found from outside: with nothing to do, a wrong model and an endpoint without /v1 said 'nothing to
    do', exit 0, and kept a quiet night."""
    replay(
        POSTINGS,
        lambda state: state.run(None, None, None),
        lambda state: state.misconfigured_night("model"),
        lambda state: state.misconfigured_night("endpoint"),
    )


def test_export_flatten_types_an_optional_date_as_a_date() -> None:
    """Found from outside: a `date | None` field was written as JSON text."""
    replay(
        POSTINGS,
        lambda state: state.run(None, None, None),
        lambda state: state.export_flat("parquet"),
        kind=OPTIONAL_DATE,
    )


def test_a_server_fixed_after_answers_that_never_validated_leaves_nothing_undone() -> None:
    """A server whose every answer was invalid stops the run (its records kept as transient), and a
    plain run once it is fixed does them all."""
    many = [(f"Posting {number}", f"Text of posting {number}") for number in range(60)]
    replay(
        many,
        lambda state: state.server_faults("invalid_json", 1.0),
        lambda state: state.run(None, None, 8),
        Nights.server_fixed,
        lambda state: state.run(None, None, None),
    )
