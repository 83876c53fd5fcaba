"""How a number is said to a person: thousands separated, a count with its noun in the form it takes, a
wait in the unit a person reads, and a time against a simulator named as the model's with the wall's."""

from __future__ import annotations

import pytest

from pipeline.wording import counted, duration, model_time, number


@pytest.mark.parametrize(
    ("count", "said"),
    [(0, "0"), (2499, "2,499"), (1_234_567, "1,234,567"), (2499.0, "2,499"), (2.5, "2.5"), (-1200, "-1,200")],
)
def test_a_count_has_its_thousands_separated(count: float, said: str) -> None:
    assert number(count) == said


@pytest.mark.parametrize(
    ("count", "noun", "plural", "said"),
    [
        (1, "record", None, "1 record"),
        (0, "record", None, "0 records"),
        (2, "judged record", None, "2 judged records"),
        (1234, "value", None, "1,234 values"),
        (1.0, "value", None, "1 value"),
        (2.5, "value", None, "2.5 values"),
        (1, "person", "people", "1 person"),
        (3, "person", "people", "3 people"),
        (-1, "record", None, "-1 record"),
    ],
)
def test_a_count_takes_its_nouns_form(count: float, noun: str, plural: str | None, said: str) -> None:
    assert counted(count, noun, plural) == said


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(42, "42 s"), (89.4, "89 s"), (252, "4.2 min"), (5399, "90.0 min"), (9000, "2.5 h"), (115_200, "32 h")],
)
def test_a_wait_is_said_in_the_unit_a_person_reads(seconds: float, said: str) -> None:
    assert duration(seconds) == said


def test_a_time_against_a_simulator_is_the_models_with_the_wall_time_beside_it() -> None:
    """The simulator at --speed 50 finished in 20 s what the model would take 17 minutes for."""
    assert model_time(1020, 50) == "~17.0 min of model time (20 s wall time at --speed 50)"
    assert model_time(1020, 50, " here") == "~17.0 min of model time here (20 s wall time at --speed 50)"
    assert model_time(1020, 0.5) == "~17.0 min of model time (34.0 min wall time at --speed 0.5)"


def test_against_a_real_server_model_time_is_wall_time_and_said_once() -> None:
    assert model_time(1020, 1) == "~17.0 min"
    assert model_time(1020, 1, " here") == "~17.0 min here"
