"""Grounding: extracted values located in the record text, with offsets into the original text."""

from __future__ import annotations

import json

import pytest

from pipeline.quality.fields import grounded_paths
from pipeline.quality.found_share import FoundShare
from pipeline.quality.grounding import GroundedValue, MatchKind, ground, grounding_from_json, grounding_json
from pipeline.quality.normalize import normalize_text, normalize_with_offsets
from tests.support.quality_schemas import Posting

FULL_WIDTH_PYTHON = "\uff30\uff59\uff54\uff48\uff4f\uff4e"  # "Python" in full-width letters
TEXTS = {
    "title": "Senior Data Engineer (Leeds)",
    "description": "Crème brûlée café 🍰 team.\nYou know SQL, Kubernetes and\n   stakeholder   management.\n"
    f"{FULL_WIDTH_PYTHON} a plus; Straße office, STRASSE parking.",
}


def one(extraction: dict[str, object], path: str = "skills", **options: float | None) -> GroundedValue:
    (value,) = ground(extraction, TEXTS, [path], **options).values
    return value


def matched(value: GroundedValue) -> str:
    assert value.source_field is not None and value.start is not None and value.end is not None
    return TEXTS[value.source_field][value.start : value.end]


def test_exact_substring_first() -> None:
    value = one({"title": "Data Engineer"}, "title")
    assert value == GroundedValue("title", "Data Engineer", "title", 7, 20, MatchKind.EXACT, 100.0)
    sql = one({"skills": ["SQL"]})
    assert (sql.source_field, sql.match, matched(sql)) == ("description", MatchKind.EXACT, "SQL")
    assert TEXTS["description"].index("SQL") == sql.start  # after the non-ASCII letters and the emoji


def test_case_insensitive_match_maps_back_to_the_original() -> None:
    value = one({"skills": ["kubernetes"]})
    assert (value.match, value.score, matched(value)) == (MatchKind.NORMALISED, 100.0, "Kubernetes")


def test_extra_whitespace_and_newlines_in_the_text() -> None:
    value = one({"skills": ["Stakeholder Management"]})
    assert value.match is MatchKind.NORMALISED
    assert matched(value) == "stakeholder   management"
    two_lines = one({"skills": ["Kubernetes and stakeholder"]})
    assert matched(two_lines) == "Kubernetes and\n   stakeholder"


def test_nfkc_full_width_letters() -> None:
    value = one({"skills": ["Python"]})
    assert (value.match, matched(value)) == (MatchKind.NORMALISED, FULL_WIDTH_PYTHON)


def test_offsets_round_trip_with_non_ascii_before_the_match() -> None:
    brulee = one({"skills": ["BRÛLÉE"]})
    assert matched(brulee) == "brûlée"
    strasse = one({"skills": ["strasse office"]})  # "ß" is two letters once casefolded
    assert matched(strasse) == "Straße office"
    parking = one({"skills": ["straße parking"]})
    assert matched(parking) == "STRASSE parking"
    decomposed = {"description": "x cafe\u0301 SQL"}
    (cafe, sql) = ground({"skills": ["Café", "sql"]}, decomposed, ["skills"]).values
    assert decomposed["description"][cafe.start : cafe.end] == "cafe\u0301"
    assert (sql.start, sql.end) == (8, 11)


def test_typos_are_found_only_with_fuzzy_matching() -> None:
    typo = one({"skills": ["Kubernets"]})
    assert (typo.match, matched(typo)) == (MatchKind.FUZZY, "Kubernetes")
    assert typo.score == pytest.approx(2 * 9 / 19 * 100)  # fuzz.ratio of the whole word
    assert one({"skills": ["Kubernets"]}, fuzzy_threshold=None).match is MatchKind.NONE
    assert one({"skills": ["Kubernets"]}, fuzzy_threshold=95).match is MatchKind.NONE
    phrase = one({"skills": ["stakeholder managment"]})
    assert (phrase.match, matched(phrase)) == (MatchKind.FUZZY, "stakeholder   management")


def test_nothing_found() -> None:
    assert one({"skills": ["Rust"]}) == GroundedValue("skills", "Rust", None, None, None, MatchKind.NONE, 0.0)
    # A value longer than a text is not "found" in that text because the text is part of it.
    assert (
        ground({"title": "Senior Data Engineer (Leeds) in Yorkshire"}, {"title": TEXTS["title"]}, ["title"])
        .values[0]
        .match
        is MatchKind.NONE
    )


def test_the_first_field_wins_and_exact_beats_normalised() -> None:
    texts = {"title": "sql lead", "description": "SQL daily", "notes": "SQL"}
    (value,) = ground({"skills": ["SQL"]}, texts, ["skills"]).values
    assert (value.source_field, value.match) == ("description", MatchKind.EXACT)
    (lower,) = ground({"skills": ["Sql"]}, texts, ["skills"]).values
    assert (lower.source_field, lower.match) == ("title", MatchKind.NORMALISED)


def test_values_in_a_list_of_objects_and_nested_objects() -> None:
    extraction = {
        "title": "Data Engineer",
        "parts": [{"name": "SQL", "kind": "tool"}, {"name": "Spark", "kind": "tool"}],
        "pay": {"note": "café"},
        "skills": ["", "  ", "SQL"],
    }
    grounding = ground(extraction, TEXTS, grounded_paths(Posting))
    assert [(value.path, value.value, value.match) for value in grounding.values] == [
        ("title", "Data Engineer", MatchKind.EXACT),
        ("skills", "SQL", MatchKind.EXACT),  # empty and blank values are skipped
        ("parts[].name", "SQL", MatchKind.EXACT),  # the same value under two paths
        ("parts[].name", "Spark", MatchKind.NONE),
        ("pay.note", "café", MatchKind.EXACT),
    ]
    assert grounding.share_by_path() == {
        "title": FoundShare(1, 1),
        "company": FoundShare(0, 0),
        "skills": FoundShare(1, 1),
        "parts[].name": FoundShare(1, 2),
        "pay.note": FoundShare(1, 1),
    }


def test_to_json() -> None:
    grounding = ground({"skills": ["kubernetes", "Rust"]}, TEXTS, ["skills"])
    start = TEXTS["description"].index("Kubernetes")
    assert grounding.to_json() == [
        {
            "path": "skills",
            "value": "kubernetes",
            "source_field": "description",
            "start": start,
            "end": start + 10,
            "match": "normalised",
            "score": 100.0,
        },
        {
            "path": "skills",
            "value": "Rust",
            "source_field": None,
            "start": None,
            "end": None,
            "match": "none",
            "score": 0.0,
        },
    ]


# Rows as the results' grounding column has held them since grounding was first stored: a value sent
# whole, and a merged long record's (with the chunk and pass that found it).
STORED_WHOLE = (
    '[{"path":"skills","value":"kubernetes","source_field":"description","start":17,"end":27,'
    '"match":"normalised","score":100.0},{"path":"skills","value":"Rust","source_field":null,'
    '"start":null,"end":null,"match":"none","score":0.0}]'
)
STORED_MERGED = (
    '[{"path":"skills","value":"Pyton","source_field":"description","start":4012,"end":4018,'
    '"match":"fuzzy","score":90.9090909090909,"chunk":3,"pass":2}]'
)


@pytest.mark.parametrize("stored", [STORED_WHOLE, STORED_MERGED, "[]"])
def test_stored_grounding_reads_and_writes_back_byte_for_byte(stored: str) -> None:
    values = grounding_from_json(stored)
    assert values is not None and grounding_json(values) == stored
    assert grounding_from_json(stored.encode()) == values == grounding_from_json(json.loads(stored))


def test_stored_grounding_is_one_type_with_what_grounding_finds() -> None:
    found = ground({"skills": ["kubernetes", "Rust"]}, TEXTS, ["skills"])
    assert grounding_from_json(grounding_json(found.values)) == found.values
    (merged,) = grounding_from_json(STORED_MERGED) or ()
    assert (merged.match, merged.chunk, merged.pass_, merged.found) == (MatchKind.FUZZY, 3, 2, True)
    assert merged.moved("description", 100).start == 4112 and merged.moved("title", 100) is merged


def test_stored_grounding_is_read_leniently() -> None:
    """A result stored without grounding is None; entries without a path and a value are passed over;
    a missing match is none and a missing score 0."""
    assert grounding_from_json(None) is None
    entries = [{"path": "a", "value": "x"}, {"path": "b"}, "junk", {"path": "c", "value": 3, "score": None}]
    assert grounding_from_json(json.dumps(entries)) == (
        GroundedValue("a", "x", None, None, None, MatchKind.NONE, 0.0),
        GroundedValue("c", "3", None, None, None, MatchKind.NONE, 0.0),
    )
    with pytest.raises(ValueError, match="'close'"):
        grounding_from_json('[{"path": "a", "value": "x", "match": "close"}]')


def test_normalised_offsets_of_every_character() -> None:
    original = "  \uff21\u00a0 b\u0301ß\n”"  # a full-width A, a no-break space, b + a combining accent
    normalised = normalize_with_offsets(original)
    assert normalised.text == normalize_text(original) == "a b\u0301ss"
    spans = [original[start:end] for start, end in zip(normalised.starts, normalised.ends, strict=True)]
    assert spans == ["\uff21", "\u00a0 ", "b\u0301", "b\u0301", "ß", "ß"]
    assert normalised.original_span(2, 5) == (5, 8)
    assert normalize_with_offsets(" .,; ").text == ""


def test_two_hundred_values_in_a_five_thousand_character_text() -> None:
    pieces = []
    values = []
    for number in range(200):
        term = f"term{number:03d}"
        if number % 4 == 0:  # in capitals in the text: a normalised match
            pieces.append(f"lorem {term.upper()} ipsum")
            values.append(term)
        elif number % 4 == 1:  # exactly as in the text
            pieces.append(f"dolor {term} amet")
            values.append(term)
        elif number % 4 == 2:  # across a line break
            pieces.append(f"sit skill\n{number:03d} elit")
            values.append(f"skill {number:03d}")
        else:  # not in the text
            pieces.append("consectetur adipiscing")
            values.append(f"absent{number:03d}")
    text = ", sed ".join(pieces)
    assert 4500 < len(text) < 5500
    grounding = ground({"skills": values}, {"description": text}, ["skills"])
    kinds = [value.match for value in grounding.values]
    assert (kinds.count(MatchKind.EXACT), kinds.count(MatchKind.NORMALISED), kinds.count(MatchKind.NONE)) == (
        50,
        100,
        50,
    )
    for value in grounding.values:
        if value.match is not MatchKind.NONE:
            assert value.start is not None and value.end is not None
            assert normalize_text(text[value.start : value.end]) == normalize_text(value.value)
    assert grounding.share_by_path() == {"skills": FoundShare(150, 200)}
