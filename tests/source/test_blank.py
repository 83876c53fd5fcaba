"""Records with nothing to extract from: which rows are blank (every prompt field NULL, empty or
whitespace, as the prompt would carry it), and how they are said."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.source.blank import BlankRecords, blank_condition, blank_records
from pipeline.source.db import open_database

# Whitespace of every kind Python's str.strip() removes, and Unicode spaces (no-break, ideographic).
WHITESPACE = " \t\n\r\x0b\x0c\x85\u00a0\u3000"


def blank_ids(tmp_path: Path, rows: list[tuple[int, str | None, str | None]]) -> BlankRecords:
    connection = open_database(tmp_path / "blank.duckdb")
    try:
        connection.execute("CREATE TABLE t (id INTEGER, subject VARCHAR, body VARCHAR)")
        for row in rows:
            connection.execute("INSERT INTO t VALUES (?, ?, ?)", list(row))
        return blank_records(connection, "t", "id", ("subject", "body"))
    finally:
        connection.close()


def test_a_record_is_blank_only_when_every_prompt_field_is_empty(tmp_path: Path) -> None:
    found = blank_ids(
        tmp_path,
        [
            (1, None, None),
            (2, "", ""),
            (3, WHITESPACE, None),
            (4, "", "text"),  # one field with text: sent as today
            (5, "Subject", None),
            (6, "\u200b", ""),  # a zero-width space is a character, not whitespace: sent
            (7, " ", " x "),
        ],
    )
    assert (found.count, found.ids) == (3, (1, 2, 3))
    assert WHITESPACE.strip() == ""  # what the test calls whitespace is Python's too


def test_the_first_ids_in_order_are_kept_and_the_rest_counted(tmp_path: Path) -> None:
    found = blank_ids(tmp_path, [(id_, None, " ") for id_ in (9, 4, 7, 1, 12)] + [(2, "a", "b")])
    assert (found.count, found.ids) == (5, (1, 4, 7))
    assert found.describe("they will not be sent") == (
        "5 records have empty subject and body: ids 1, 4, 7 and 2 more; they will not be sent"
    )


def test_one_blank_record_is_said_as_one(tmp_path: Path) -> None:
    """Found by the property tests: one record was said as 'they will not be sent'."""
    found = blank_ids(tmp_path, [(1, "", " "), (2, "a", "b")])
    assert found.not_sent() == "1 record has empty subject and body: id 1; it will not be sent"
    assert found.not_sent(now=True).endswith("; it is not sent")


def test_nothing_blank_is_said_as_nothing(tmp_path: Path) -> None:
    found = blank_ids(tmp_path, [(1, "a", None)])
    assert (found.count, found.ids, bool(found)) == (0, (), False)


@pytest.mark.parametrize(
    ("fields", "count", "ids", "said"),
    [
        (("body",), 1, (17,), "1 record has empty body: id 17"),
        (("subject", "body"), 3, (17, 42, 99), "3 records have empty subject and body: ids 17, 42, 99"),
        (("a", "b", "c"), 2, ("x", "y"), "2 records have empty a, b and c: ids 'x', 'y'"),
    ],
)
def test_how_blank_records_are_said(
    fields: tuple[str, ...], count: int, ids: tuple[int | str, ...], said: str
) -> None:
    assert BlankRecords(fields, count, ids).describe() == said


def test_two_counts_add_and_keep_the_first_ids() -> None:
    first = BlankRecords(("body",), 2, (5, 9))
    later = BlankRecords(("body",), 3, (1, 6, 20))
    assert first.plus(later) == BlankRecords(("body",), 5, (1, 5, 6))


def test_a_prompt_that_reads_no_field_has_no_blank_record() -> None:
    assert blank_condition((), "s") == "false"
