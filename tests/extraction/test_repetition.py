from __future__ import annotations

import json

import pytest

from pipeline.extraction.repetition import MIN_LOOP_CHARS, find_loop

HEAD = '{"title":"Chef","explicit_skills":["cooking","menus"],"requirements":['
ITEM = '{"text":"Food hygiene certificate level 2","kind":"certification","mandatory":true},'


@pytest.mark.parametrize("cut", [0, 1, 7, len(ITEM) - 1])
def test_an_item_repeated_to_the_end_is_a_loop_wherever_it_was_cut(cut: int) -> None:
    text = (HEAD + ITEM * 40)[: len(HEAD + ITEM * 40) - cut]
    loop = find_loop(text)
    assert loop is not None
    assert (loop.start, loop.field, len(loop.unit)) == (len(HEAD), "requirements", len(ITEM))
    assert loop.unit == ITEM
    assert loop.repeats == 40 - (cut > 0)


def test_padding_numbered_items_and_short_units_are_loops() -> None:
    padding = find_loop('{"title":"' + " " * 300)
    assert padding is not None and padding.unit == " " and padding.field == "title"
    numbered = find_loop('{"skills":[' + ",".join(f'"Python {i}"' for i in range(200)))
    assert numbered is not None and numbered.repeats >= 50  # from "Python 100" on, digits aside
    assert find_loop("ab" * 40) is not None


def test_a_long_answer_that_does_not_repeat_is_no_loop() -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    items = [{"text": f"requirement on {word}", "kind": "skill", "mandatory": True} for word in words]
    answer = json.dumps({"title": "Chef", "requirements": items * 1}, separators=(",", ":"))
    assert find_loop(answer[:-25]) is None
    assert find_loop('{"skills":["SQL","SQL","SQL","SQL"') is None  # shorter than MIN_LOOP_CHARS
    assert find_loop("x" * (MIN_LOOP_CHARS - 2)) is None
    assert find_loop("") is None


def test_the_description_never_quotes_the_answer() -> None:
    loop = find_loop(HEAD + ITEM * 40)
    assert loop is not None
    described = loop.describe()
    assert described == f"the same {len(ITEM)}-character stretch repeated 40 times in 'requirements'"
    assert "hygiene" not in described
