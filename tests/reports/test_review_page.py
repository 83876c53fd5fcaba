"""The review page: its embedded data without a browser, and what it shows in a real headless Chromium."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import json
import re
import struct
from pathlib import Path
from typing import Any, cast

import pytest

import tests.support.browser as browser_module
from pipeline.errors import ConfigError
from pipeline.quality.grounding import GroundedValue, MatchKind
from pipeline.reports.html_page import embed_json
from pipeline.reports.review_page import (
    ReviewPage,
    ReviewRecord,
    ScoreRow,
    VariantView,
    page_data,
    render_review,
    write_review,
)
from tests.support.browser import Element, dump_dom, parse_dom, require_browser, screenshot
from tests.support.process_guard import starts_a_process

# By its import path: ``pipeline.reports.review_page`` as an attribute is the page function of pages.py.
review_module = importlib.import_module("pipeline.reports.review_page")
TITLE = "Senior Python Developer"
DESCRIPTION = "We need Python, Docker and SQL.\nRemote in Berlin."
TEXTS = {"title": TITLE, "description": DESCRIPTION}
FIELDS = ["title", "explicit_skills", "seniority", "location", "requirements"]
GENERATED_AT = "2026-05-09T10:00:00+00:00"
EVIL = 'Fin & "Ops" </script><script>alert(1)</script> <!-- x \u2028 line'
DATA_SCRIPT = re.compile(r'<script type="application/json" id="review-data">(.*?)</script>', re.DOTALL)


def found(
    path: str, value: str, field: str, match: str = "exact", *, text: str | None = None, score: float = 100.0
) -> GroundedValue:
    """A span located where ``text`` (default: ``value``) first occurs in TEXTS[field]."""
    start = TEXTS[field].index(text or value)
    return GroundedValue(path, value, field, start, start + len(text or value), MatchKind(match), score)


def missing(path: str, value: str) -> GroundedValue:
    return GroundedValue(path, value, None, None, None, MatchKind.NONE, 0.0)


FULL_EXTRACTION: dict[str, Any] = {
    "title": TITLE,
    "explicit_skills": ["Python", "docker", "Kubernetes"],
    "seniority": None,
    "location": {"city": "Berlin", "remote": True},
    "requirements": [{"text": "SQL", "years": 3}],
}
FULL_GROUNDING = (
    found("title", TITLE, "title"),
    found("explicit_skills", "Python", "description"),
    found("explicit_skills", "docker", "description", "normalised", text="Docker"),
    missing("explicit_skills", "Kubernetes"),
    found("location.city", "Berlin", "description", "fuzzy", score=92.456),
    found("requirements[].text", "SQL", "description"),
)


def view(
    extraction: dict[str, Any] | None, *grounding: GroundedValue, failure: str | None = None
) -> VariantView:
    return VariantView(extraction, failure, grounding, "gpt-oss-120b")


def one_variant_page() -> ReviewPage:
    """r1: one ungrounded skill; r2: all grounded; r3: an ungrounded title."""
    grounded = view({"title": TITLE, "explicit_skills": ["Python"]}, found("title", TITLE, "title"))
    bad_title = view({"title": "Chief Llama"}, missing("title", "Chief Llama"))
    records = [
        ReviewRecord("r1", TEXTS, {"base": view(FULL_EXTRACTION, *FULL_GROUNDING)}, None, ()),
        ReviewRecord("r2", TEXTS, {"base": grounded}, None, ()),
        ReviewRecord("r3", TEXTS, {"base": bad_title}, None, ()),
    ]
    notes = ["sample of 3 of 1,234 records, seed 0"]
    return ReviewPage(
        "linkedin", ["base"], FIELDS, ["title", "explicit_skills"], records, GENERATED_AT, notes
    )


def two_variant_page() -> ReviewPage:
    """Disagreements a1 0.75 > a3 0.5 > a10 0.25 > a2 0; in a3 the second variant failed."""
    base = view(FULL_EXTRACTION, *FULL_GROUNDING)
    new = view({**FULL_EXTRACTION, "explicit_skills": ["Python"], "seniority": "senior"}, *FULL_GROUNDING[:2])
    failed = view(None, failure="schema_invalid: salary min 90000 > max 50000")
    records = [
        ReviewRecord("a1", TEXTS, {"base": base, "new": new}, 0.75, ["explicit_skills", "seniority"]),
        ReviewRecord("a2", TEXTS, {"base": base, "new": base}, 0.0, []),
        ReviewRecord("a3", TEXTS, {"base": base, "new": failed}, 0.5, ["seniority"]),
        ReviewRecord("a10", TEXTS, {"base": base, "new": new}, 0.25, ["explicit_skills"]),
    ]
    return ReviewPage("linkedin", ["base", "new"], FIELDS, ["title"], records, GENERATED_AT)


def comparison(*, rerun: bool) -> dict[str, Any]:
    """What `compare` gives the page (the numbers of its --json, the captions of its text): new against
    base; with ``rerun``, base's re-run as the noise floor, beyond which only seniority is."""
    noise_fields = {
        "explicit_skills": {
            "noise_agreement": 0.95,
            "noise_agreement_ci": [0.9, 1.0],
            "noise_gap": {"metric": "f1", "value": 0.0468, "ci": [-0.02, 0.11], "level": 0.9833},
            "beyond_noise": False,
        },
        "seniority": {
            "noise_agreement": 1.0,
            "noise_agreement_ci": [1.0, 1.0],
            "noise_gap": {"metric": "accuracy", "value": 0.25, "ci": [0.125, 0.5], "level": 0.9833},
            "beyond_noise": True,
        },
    }
    fields = {
        "explicit_skills": {
            "kind": "list",
            "scored": 8,
            "agreement": 0.9032,
            "agreement_ci": [0.8, 0.9697],
            "precision": 0.9333,
            "recall": 0.875,
        },
        "seniority": {"kind": "choice", "scored": 8, "agreement": 0.75, "agreement_ci": [0.5, 1.0]},
    }
    if rerun:
        fields = {path: data | noise_fields[path] for path, data in fields.items()}

    def variant(tokens: list[float], latency: float, failures: dict[str, int], found: int) -> dict[str, Any]:
        return {
            "records": 8,
            "tokens_per_record": dict(zip(("prompt", "completion", "reasoning"), tokens, strict=True)),
            "latency_s_per_record": latency,
            "failures": failures,
            "grounding": {"title": {"found": found, "values": 8, "share": found / 8}},
        }

    return {
        "title": "new compared with base (the reference) over the 8 records both extracted",
        "reference": "base",
        "candidate": "new",
        "records": 8,
        "fields": fields,
        "micro": {"f1": 0.9474, "f1_ci": [0.8817, 0.9897]},
        "macro": {"score": 0.8266, "score_ci": None, "score_ci_note": "sample too small"},
        "intervals": "95% intervals: percentile bootstrap over records, 1,000 resamples, seed 0",
        "noise": {"rerun": "base~rerun", "records": 7, "beyond_noise": ["seniority"]} if rerun else None,
        "noise_hint": "noise floor: not measured (base~rerun has no results). Run `pipeline run job.yaml "
        "--variant base --rerun`",
        "means_over": "means per record over the 8 records both extracted",
        "variants": {
            "base": variant([1234.5, 40.0, 10.0], 12.3456, {"schema_invalid": 1}, 8),
            "new": variant([1312.5, 45.0, float("nan")], 9.5, {"truncated": 2, "invalid_json": 1}, 7),
        },
        "failures_over": {"records": 10, "rule": "over the 10 records both variants attempted"},
    }


def open_page(tmp_path: Path, page: ReviewPage, fragment: str = "") -> Element:
    """The page's DOM after its scripts ran in Chromium."""
    return parse_dom(dump_dom(write_review(page, tmp_path / "review.html"), fragment=fragment))


def card_ids(dom: Element) -> list[str]:
    return [card.attrs["data-record-id"] for card in dom.find_all("article", cls="card")]


def marks(block: Element) -> list[tuple[str, set[str]]]:
    return [(mark.text, mark.classes) for mark in block.find_all("mark")]


def embedded(document: str) -> Any:
    match = DATA_SCRIPT.search(document)
    assert match is not None
    return json.loads(match.group(1))


@pytest.fixture
@starts_a_process
def browser() -> str:
    return require_browser()


# One Chromium start per page, shared by the tests that only read its DOM.
@pytest.fixture(scope="module")
@starts_a_process
def one_variant_dom(tmp_path_factory: pytest.TempPathFactory) -> Element:
    require_browser()
    return open_page(tmp_path_factory.mktemp("one"), one_variant_page())


@pytest.fixture(scope="module")
@starts_a_process
def two_variant_dom(tmp_path_factory: pytest.TempPathFactory) -> Element:
    require_browser()
    return open_page(tmp_path_factory.mktemp("two"), two_variant_page())


# ---- without a browser


def test_embedded_json_round_trips_to_the_page_data() -> None:
    record = ReviewRecord(
        "7", {"title": "Data Engineer"}, {"base": view({"title": "Data Engineer"})}, None, []
    )
    page = ReviewPage("job", ["base"], ["title"], ["title"], [record], GENERATED_AT, ["a note"])
    data = embedded(render_review(page))
    assert data == page_data(page)
    assert data == {
        "job": "job",
        "variants": ["base"],
        "fields": ["title"],
        "groundedPaths": ["title"],
        "generatedAt": GENERATED_AT,
        "notes": ["a note"],
        "scores": [],
        "comparison": None,
        "records": [
            {
                "id": "7",
                "texts": [["title", "Data Engineer"]],
                "variants": [
                    {
                        "extraction": {"title": "Data Engineer"},
                        "failure": None,
                        "model": "gpt-oss-120b",
                        "chunks": None,
                        "grounding": [],
                    }
                ],
                "disagreement": None,
                "differing": [],
            }
        ],
    }


def test_spans_and_missing_variants_are_embedded_with_utf16_offsets() -> None:
    text = "🚀 Senior Python Developer"  # the rocket is one code point but two UTF-16 units
    start = text.index("Python")
    spans = (
        GroundedValue("skills", "Python", "title", start, start + 6, MatchKind.FUZZY, 0.875),
        missing("x", "y"),
    )
    record = ReviewRecord("1", {"title": text}, {"new": view({}, *spans)}, float("nan"), ["skills"])
    data = page_data(ReviewPage("job", ["base", "new"], ["skills"], [], [record], GENERATED_AT))
    (embedded_record,) = data["records"]
    assert embedded_record["variants"][0] is None and embedded_record["disagreement"] is None
    assert embedded_record["variants"][1]["grounding"] == [
        {
            "path": "skills",
            "value": "Python",
            "field": "title",
            "start": 10,
            "end": 16,
            "match": "fuzzy",
            "score": 0.875,
            "chunk": None,
        },
        {
            "path": "x",
            "value": "y",
            "field": None,
            "start": None,
            "end": None,
            "match": "none",
            "score": 0.0,
            "chunk": None,
        },
    ]
    assert start == 9 and text.encode("utf-16-le")[20:32].decode("utf-16-le") == "Python"


def test_embedding_keeps_record_text_from_ending_the_script_element() -> None:
    value = {"text": EVIL, "list": ["<!--", "</SCRIPT >", "a\u2029b"]}
    text = embed_json(value)
    assert not any(character in text for character in "<>&\u2028\u2029")
    assert json.loads(text) == value
    document = render_review(page_with_text(EVIL))
    assert document.count("</script>") == 2 and "<!--" not in document
    assert embedded(document)["records"][0]["texts"] == [["description", EVIL]]


def page_with_text(text: str) -> ReviewPage:
    """One record whose id, text, value, job name and note are all hostile."""
    start = text.index("alert(1)")
    span = GroundedValue("company", "alert(1)", "description", start, start + 8, MatchKind.EXACT, 1.0)
    record = ReviewRecord(text, {"description": text}, {"base": view({"company": text}, span)}, None, [])
    return ReviewPage(f"job {text}", ["base"], ["company"], ["company"], [record], GENERATED_AT, [text])


@pytest.mark.parametrize(
    ("span", "message"),
    [
        (
            GroundedValue("p", "v", "title", 0, 1, cast(MatchKind, "close"), 0.5),
            r"record 1: p has match 'close'; use one of exact",
        ),
        (
            GroundedValue("p", "v", "body", 0, 1, MatchKind.EXACT, 1.0),
            r"record 1: p = 'v': the record has no text field 'body'",
        ),
        (
            GroundedValue("p", "v", "title", 3, 99, MatchKind.EXACT, 1.0),
            r"span 3\.\.99 is outside 'title' \(5 characters\)",
        ),
        (
            GroundedValue("p", "v", None, None, None, MatchKind.FUZZY, 0.9),
            r"record 1: p = 'v' is a fuzzy match without a location",
        ),
    ],
)
def test_inconsistent_spans_are_refused(span: GroundedValue, message: str) -> None:
    record = ReviewRecord("1", {"title": "Chef!"}, {"base": view({}, span)}, None, [])
    with pytest.raises(ValueError, match=message):
        render_review(ReviewPage("job", ["base"], [], [], [record], GENERATED_AT))


def test_a_page_shows_one_or_two_variants_and_only_its_own() -> None:
    record = ReviewRecord("1", {}, {"other": view({})}, None, [])
    with pytest.raises(ValueError, match="one or two variants, not 3"):
        page_data(ReviewPage("job", ["a", "b", "c"], [], [], [], GENERATED_AT))
    with pytest.raises(ValueError, match="record 1: variant 'other' is not one of the page's variants"):
        page_data(ReviewPage("job", ["a"], [], [], [record], GENERATED_AT))


def test_document_loads_nothing_and_allows_only_its_own_script_and_style() -> None:
    document = render_review(two_variant_page())
    assert re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", document, re.IGNORECASE) is None
    assert "<link" not in document.lower() and "@import" not in document and "url(" not in document
    (script,) = re.findall(r"<script>(.*?)</script>", document, re.DOTALL)
    (style,) = re.findall(r"<style>(.*?)</style>", document, re.DOTALL)
    digest = {
        name: base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        for name, text in [("script", script), ("style", style)]
    }
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', document)
    assert policy is not None and policy.group(1) == (
        f"default-src 'none'; script-src 'sha256-{digest['script']}'; style-src 'sha256-{digest['style']}'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script


def test_write_review_replaces_the_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "review.html"
    path.write_text("the old page")
    assert write_review(one_variant_page(), path) == path
    assert path.read_text(encoding="utf-8") == render_review(one_variant_page())
    assert [entry.name for entry in tmp_path.iterdir()] == ["review.html"]


def test_a_failed_write_names_the_review_page(tmp_path: Path) -> None:
    """The writer is reports/html_page.py's (tested there); its errors name this page."""
    with pytest.raises(ConfigError, match=r"cannot write the review page \(No such file"):
        write_review(one_variant_page(), tmp_path / "nope" / "review.html")


# ---- in Chromium


def test_one_variant_header_counts_and_notes(one_variant_dom: Element) -> None:
    dom = one_variant_dom
    assert dom.find("h1").text == "Review: linkedin"
    facts = {row.attrs["data-fact"]: row.find("dd").text for row in dom.find(id="summary").find_all("div")}
    assert facts == {
        "job": "linkedin",
        "variants": "base",
        "generated": GENERATED_AT,
        "records": "3",
        "ungrounded": "2 values in 2 records",
        "grounded paths": "title, explicit_skills",
    }
    assert [note.text for note in dom.find(id="notes").find_all("li")] == [
        "sample of 3 of 1,234 records, seed 0"
    ]
    assert dom.find(id="shown-count").text == "3 of 3 records shown"
    assert card_ids(dom) == ["r1", "r2", "r3"]
    assert dom.find(id="field-label").text == "Ungrounded in" and "hidden" in dom.find(id="min-control").attrs


def page_grounding_nothing(variants: list[str]) -> ReviewPage:
    """A job whose schema marks no field grounded: its records carry no grounded value at all."""
    plain = view({"title": TITLE, "seniority": "senior"})
    records = [
        ReviewRecord(f"n{i}", TEXTS, dict.fromkeys(variants, plain), 0.0 if len(variants) == 2 else None, ())
        for i in (1, 2)
    ]
    return ReviewPage("tickets", variants, ["title", "seniority"], [], records, GENERATED_AT)


@pytest.mark.parametrize("variants", [["base"], ["base", "new"]])
def test_a_job_that_grounds_no_field_claims_no_grounding(
    browser: str, tmp_path: Path, variants: list[str]
) -> None:
    """Every card of such a job said "all values grounded", and the summary "ungrounded: 0 values"."""
    one = len(variants) == 1
    # One variant filters by ungrounded fields: a filter left in its link would hide every record.
    dom = open_page(tmp_path, page_grounding_nothing(variants), fragment="field=title" if one else "")
    assert card_ids(dom) == ["n1", "n2"]
    facts = {row.attrs["data-fact"]: row.find("dd").text for row in dom.find(id="summary").find_all("div")}
    assert facts["grounding"] == "no field is grounded in this job"
    assert not {"ungrounded", "grounded paths"} & set(facts)
    for card in dom.find_all("article", cls="card"):
        assert "grounded" not in card.find("header").text and not card.find_all(cls="ungrounded-count")
    assert "hidden" in dom.find(id="legend").attrs  # its highlights are those of grounded values
    label = next(
        element for element in dom.iter() if element.tag == "label" and element.find_all(id="field-filter")
    )
    assert ("hidden" in label.attrs) is one


def test_eval_scores_show_above_the_records_with_their_intervals(browser: str, tmp_path: Path) -> None:
    scores = [
        ScoreRow("explicit_skills", "f1", 0.6412, (0.6012, 0.6803), 200),
        ScoreRow("seniority", "accuracy", 0.9, None, 200),
        ScoreRow("overall", "micro f1", None, None, 0),
    ]
    page = dataclasses.replace(one_variant_page(), scores=scores)
    table = open_page(tmp_path, page).find(id="scores")
    assert "hidden" not in table.attrs
    rows = [[cell.text for cell in row.find_all("td")] for row in table.find("tbody").find_all("tr")]
    assert rows == [
        ["explicit_skills", "f1", "0.641", "0.601 \u2013 0.680", "200"],
        ["seniority", "accuracy", "0.900", "-", "200"],
        ["overall", "micro f1", "-", "-", "0"],
    ]


def test_a_page_without_scores_hides_the_score_table(one_variant_dom: Element) -> None:
    assert "hidden" in one_variant_dom.find(id="scores").attrs


def table_cells(table: Element) -> list[list[str]]:
    return [[cell.text for cell in row.find_all("td")] for row in table.find("tbody").find_all("tr")]


def test_compare_page_shows_the_numbers_compare_prints_then_the_records(browser: str, tmp_path: Path) -> None:
    dom = open_page(tmp_path, dataclasses.replace(two_variant_page(), comparison=comparison(rerun=True)))
    assert dom.find("h1").text == "Compare: linkedin"
    section = dom.find("section", id="comparison")
    assert "hidden" not in section.attrs
    assert (
        section.find("h2").text == "new compared with base (the reference) over the 8 records both extracted"
    )
    agreement = section.find("table", id="agreement")
    assert [cell.text for cell in agreement.find("thead").find_all("th")] == [
        "field",
        "kind",
        "records",
        "agreement",
        "95% interval",
        "precision",
        "recall",
        "base vs base~rerun",
        "gap (rerun - B)",
        "beyond noise",
    ]
    interval = "{} \u2013 {}".format
    skills_noise = [f"0.950 [{interval('0.900', '1.000')}]", f"+0.047 [{interval('-0.020', '+0.110')}]", "no"]
    seniority_noise = [f"1.000 [{interval('1.000', '1.000')}]", f"+0.250 [{interval('+0.125', '+0.500')}]"]
    assert table_cells(agreement) == [
        [
            "explicit_skills",
            "list",
            "8",
            "0.903",
            interval("0.800", "0.970"),
            "0.933",
            "0.875",
            *skills_noise,
        ],
        ["seniority", "choice", "8", "0.750", interval("0.500", "1.000"), "", "", *seniority_noise, "yes"],
        ["micro f1", "", "8", "0.947", interval("0.882", "0.990"), "", "", "", "", ""],
        ["macro", "", "8", "0.827", "sample too small", "", "", "", "", ""],  # an interval of no width
    ]
    assert "beyond" in agreement.find("tr", data_path="seniority").classes
    assert [note.text for note in section.find_all("p", cls="noise-note")] == [
        "noise floor: base against its re-run base~rerun, over the 7 records A, B and the re-run all "
        "extracted; gap intervals simultaneous over the 2 fields (98.3% each)",
        "beyond the noise (the gap's interval is above 0): seniority",
    ]
    variants = section.find("table", id="variant-numbers")
    assert variants.find("caption").text == (
        "means per record over the 8 records both extracted; failures over the 10 records both variants "
        "attempted"
    )
    assert table_cells(variants) == [
        ["base", "1,234.5", "40.0", "10.0", "12.35", "1 (schema_invalid 1)", "title 8 of 8 (100%)"],
        ["new", "1,312.5", "45.0", "-", "9.50", "3 (truncated 2, invalid_json 1)", "title 7 of 8 (88%)"],
    ]
    # then the records, side by side, as on every two-variant page
    order = [
        element.attrs.get("id")
        for element in dom.iter()
        if element.attrs.get("id") in {"comparison", "cards"}
    ]
    assert order == ["comparison", "cards"] and card_ids(dom) == ["a1", "a3", "a10", "a2"]


def test_compare_page_without_a_rerun_says_how_to_measure_the_noise_floor(
    browser: str, tmp_path: Path
) -> None:
    dom = open_page(tmp_path, dataclasses.replace(two_variant_page(), comparison=comparison(rerun=False)))
    agreement = dom.find("table", id="agreement")
    assert [cell.text for cell in agreement.find("thead").find_all("th")][-1] == "recall"
    assert table_cells(agreement)[0] == [
        "explicit_skills",
        "list",
        "8",
        "0.903",
        "0.800 \u2013 0.970",
        "0.933",
        "0.875",
    ]
    assert [note.text for note in dom.find_all("p", cls="noise-note")] == [
        "noise floor: not measured (base~rerun has no results). Run `pipeline run job.yaml --variant base "
        "--rerun`"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"title": None}, r"comparison: 'title' must be a str, not None"),
        ({"fields": []}, r"comparison: 'fields' must be a Mapping, not \[\]"),
    ],
)
def test_a_comparison_without_what_the_page_needs_is_refused(change: dict[str, Any], message: str) -> None:
    page = dataclasses.replace(two_variant_page(), comparison=comparison(rerun=False) | change)
    with pytest.raises(ValueError, match=message):
        render_review(page)


def test_a_page_without_a_comparison_hides_the_section(two_variant_dom: Element) -> None:
    section = two_variant_dom.find("section", id="comparison")
    assert "hidden" in section.attrs and section.find_all("table") == []


def test_one_variant_highlights_grounded_values_in_the_text(one_variant_dom: Element) -> None:
    title, description = one_variant_dom.find("article", data_record_id="r1").find_all(cls="text")
    assert title.text == TITLE and description.text == DESCRIPTION  # highlighting keeps the text as it is
    assert marks(title) == [(TITLE, {"match-exact"})]
    assert marks(description) == [
        ("Python", {"match-exact"}),
        ("Docker", {"match-normalised"}),
        ("SQL", {"match-exact"}),
        ("Berlin", {"match-fuzzy"}),
    ]
    docker = description.find("mark", cls="match-normalised")
    assert docker.attrs["title"] == "explicit_skills: docker (normalised)"
    assert docker.attrs["data-paths"] == "explicit_skills"


def test_one_variant_flags_ungrounded_values_with_a_count_per_card(one_variant_dom: Element) -> None:
    card = one_variant_dom.find("article", data_record_id="r1")
    assert "has-ungrounded" in card.classes
    assert card.find(cls="ungrounded-count").text == "⚠ 1 ungrounded value"
    flagged = card.find("span", cls="ungrounded")
    assert flagged.text == "⚠ Kubernetes" and flagged.find(cls="flag").text == "⚠"
    assert flagged.attrs["title"] == "explicit_skills: not found in the record text"
    clean = one_variant_dom.find("article", data_record_id="r2")
    assert (
        clean.find(cls="ungrounded-count").text == "all values grounded"
        and "has-ungrounded" not in clean.classes
    )
    cards = one_variant_dom.find(id="cards")
    assert [value.text for value in cards.find_all("span", cls="ungrounded")] == [
        "⚠ Kubernetes",
        "⚠ Chief Llama",
    ]


def test_one_variant_shows_the_extraction_as_a_form(one_variant_dom: Element) -> None:
    form = one_variant_dom.find("article", data_record_id="r1").find("dl", cls="form")
    rows = {row.attrs["data-field"]: row for row in form.children if isinstance(row, Element)}
    assert list(rows) == FIELDS  # schema order
    assert rows["title"].find("dd").text == TITLE
    assert [chip.text for chip in rows["explicit_skills"].find_all("li", cls="chip")] == [
        "Python",
        "docker",
        "⚠ Kubernetes",
    ]
    assert (
        rows["seniority"].find("dd").text == "—"
        and "null" in rows["seniority"].find("dd").find("span").classes
    )
    location = rows["location"].find("dl", cls="nested")
    assert [(row.find("dt").text, row.find("dd").text) for row in location.find_all(cls="row")] == [
        ("city", "Berlin"),
        ("remote", "true"),
    ]
    city = location.find(cls="value", title="location.city: fuzzy match in description, score 92.46")
    assert city.classes == {"value", "grounded", "match-fuzzy"}
    (requirement,) = rows["requirements"].find("ol", cls="items").find_all("li")
    assert [(row.find("dt").text, row.find("dd").text) for row in requirement.find_all(cls="row")] == [
        ("text", "SQL"),
        ("years", "3"),
    ]
    assert (
        "match-exact"
        in requirement.find(
            cls="value", title="requirements[].text: exact match in description, score 100"
        ).classes
    )


def test_overlapping_spans_and_astral_characters_highlight_the_right_text(
    browser: str, tmp_path: Path
) -> None:
    text = "🚀 Senior Python Developer"
    whole = GroundedValue("title", TITLE, "title", 2, 2 + len(TITLE), MatchKind.EXACT, 1.0)
    skill = GroundedValue("explicit_skills", "Python", "title", 9, 15, MatchKind.FUZZY, 0.9)
    record = ReviewRecord("1", {"title": text}, {"base": view({"title": TITLE}, whole, skill)}, None, [])
    dom = open_page(tmp_path, ReviewPage("job", ["base"], ["title"], ["title"], [record], GENERATED_AT))
    block = dom.find(cls="text")
    assert block.text == text
    assert marks(block) == [
        ("Senior ", {"match-exact"}),
        ("Python", {"match-exact", "overlap"}),
        (" Developer", {"match-exact"}),
    ]
    assert block.find("mark", cls="overlap").attrs["title"] == (
        f"title: {TITLE} (exact)\nexplicit_skills: Python (fuzzy)"
    )


def test_a_merged_long_record_shows_which_chunk_found_each_value(browser: str, tmp_path: Path) -> None:
    """A result merged from three chunks: the card says so, each value says its chunk, and so do the
    highlights in the whole description (offsets in the whole field, not the chunk)."""
    long_text = "Intro. " * 40 + "We need Python. " + "Middle. " * 40 + "And Docker."
    python, docker = long_text.index("Python"), long_text.index("Docker")
    spans = (
        GroundedValue(
            "explicit_skills", "Python", "description", python, python + 6, MatchKind.EXACT, 100.0, 2
        ),
        GroundedValue(
            "explicit_skills", "Docker", "description", docker, docker + 6, MatchKind.EXACT, 100.0, 3
        ),
        GroundedValue("explicit_skills", "Rust", None, None, None, MatchKind.NONE, 0.0, 1),
    )
    merged = VariantView({"explicit_skills": ["Python", "Docker", "Rust"]}, None, spans, "smollm2", chunks=3)
    record = ReviewRecord("d1", {"description": long_text}, {"base": merged}, None, [])
    page = ReviewPage("job", ["base"], ["explicit_skills"], ["explicit_skills"], [record], GENERATED_AT)
    dom = open_page(tmp_path, page)
    card = dom.find("article", data_record_id="d1")
    assert card.find("h3", cls="variant-name").find(cls="chunk").text == "merged from 3 chunks"
    chips = card.find("dl", cls="form").find_all("li", cls="chip")
    assert [chip.text for chip in chips] == ["Pythonchunk 2", "Dockerchunk 3", "⚠ Rustchunk 1"]
    assert chips[0].find(cls="value").attrs["title"] == (
        "explicit_skills: exact match in description, score 100, chunk 2"
    )
    description = card.find(cls="text")
    assert description.text == long_text
    assert [(mark.text, mark.attrs["data-chunks"]) for mark in description.find_all("mark")] == [
        ("Python", "2"),
        ("Docker", "3"),
    ]
    assert description.find_all("mark")[1].attrs["title"] == "explicit_skills: Docker (exact, chunk 3)"


def test_two_variants_header_and_default_order(two_variant_dom: Element) -> None:
    dom = two_variant_dom
    facts = {row.attrs["data-fact"]: row.find("dd").text for row in dom.find(id="summary").find_all("div")}
    assert facts["variants"] == "base (reference) vs new" and facts["disagree"] == "3 of 4"
    assert (
        dom.find(id="field-label").text == "Differs in" and "hidden" not in dom.find(id="min-control").attrs
    )
    assert dom.find(id="shown-count").text == "4 of 4 records shown"
    assert card_ids(dom) == ["a1", "a3", "a10", "a2"]  # by disagreement, largest first


def test_two_variants_side_by_side_mark_differing_fields_and_the_disagreement(
    two_variant_dom: Element,
) -> None:
    card = two_variant_dom.find("article", data_record_id="a1")
    disagreement = card.find(cls="disagreement")
    assert disagreement.text == "disagreement 0.75" and "high" in disagreement.classes
    assert card.find(cls="differing").text == "differs: explicit_skills, seniority"
    columns = card.find("section", cls="pair").find_all(cls="variant")
    assert [column.attrs["data-variant"] for column in columns] == ["base", "new"]
    for column in columns:
        assert [row.attrs["data-field"] for row in column.find_all(cls="differs")] == [
            "explicit_skills",
            "seniority",
        ]
    assert [chip.text for chip in columns[1].find_all(cls="chip")] == ["Python"]
    assert columns[1].find("div", data_field="seniority").find("dd").text == "senior"
    # Both variants found the title: marked as found by each, not as an overlap.
    assert marks(card.find_all(cls="text")[0]) == [(TITLE, {"match-exact", "in-a", "in-b"})]
    calm = two_variant_dom.find("article", data_record_id="a2")
    assert calm.find(cls="disagreement").text == "disagreement 0.00" and calm.find_all(cls="differs") == []


def test_two_variants_show_a_failed_variant_s_failure(two_variant_dom: Element) -> None:
    failed = two_variant_dom.find("article", data_record_id="a3").find("div", data_variant="new")
    assert failed.find(cls="failure").text == "schema_invalid: salary min 90000 > max 50000"
    assert failed.find_all("dl") == []


@pytest.mark.parametrize(
    ("variants", "fragment", "shown", "ids"),
    [
        (2, "field=seniority", "2 of 4", ["a1", "a3"]),
        (2, "min=0.25&sort=id", "3 of 4", ["a1", "a3", "a10"]),
        (2, "field=explicit_skills&q=10", "1 of 4", ["a10"]),
        (2, "min=0.9", "0 of 4", []),
        (1, "field=explicit_skills", "1 of 3", ["r1"]),
        (1, "field=title", "1 of 3", ["r3"]),
    ],
)
def test_the_url_fragment_filters_and_sorts_the_records(
    browser: str, tmp_path: Path, variants: int, fragment: str, shown: str, ids: list[str]
) -> None:
    page = two_variant_page() if variants == 2 else one_variant_page()
    dom = open_page(tmp_path, page, fragment)
    assert dom.find(id="shown-count").text == f"{shown} records shown"
    assert card_ids(dom) == ids


# Appended to the page's own script (so the policy's hash covers it): a person using the controls, then
# following a link with another fragment.
INTERACTION = """
  const pick = (id, value, event) => { $(id).value = value; $(id).dispatchEvent(new Event(event)); };
  pick("field-filter", "explicit_skills", "change");
  pick("min-disagreement", "0.5", "input");
  pick("sort", "id", "change");
  document.body.dataset.hashAfterControls = location.hash;
  document.body.dataset.shownAfterControls = $("shown-count").textContent;
  location.hash = "q=A2";
"""


def test_controls_write_the_fragment_and_a_new_fragment_refilters(
    browser: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = review_module.TEMPLATE.read_text(encoding="utf-8")
    scripted = template.replace("\n})();\n</script>", f"\n{INTERACTION}}})();\n</script>")
    assert scripted != template
    monkeypatch.setattr(review_module, "_template", lambda: scripted)
    dom = open_page(tmp_path, two_variant_page())
    body = dom.find("body")
    assert body.attrs["data-hash-after-controls"] == "#field=explicit_skills&min=0.5&sort=id"
    assert body.attrs["data-shown-after-controls"] == "1 of 4 records shown"  # a1 only: a10 is at 0.25
    assert dom.find(id="shown-count").text == "1 of 4 records shown" and card_ids(dom) == ["a2"]


def test_hostile_record_text_renders_as_text_and_injects_nothing(browser: str, tmp_path: Path) -> None:
    dom = open_page(tmp_path, page_with_text(EVIL))
    assert dom.find(id="shown-count").text == "1 of 1 records shown"  # the data parsed and the script ran
    scripts = dom.find_all("script")
    assert [script.attrs for script in scripts] == [{"type": "application/json", "id": "review-data"}, {}]
    card = dom.find("article", cls="card")
    assert card.attrs["data-record-id"] == EVIL and card.find("h2").text == EVIL
    assert card.find(cls="text").text == EVIL
    assert card.find("mark").text == "alert(1)"
    assert card.find("div", data_field="company").find("dd").text == EVIL
    assert dom.find("h1").text == f"Review: job {EVIL}"
    assert [note.text for note in dom.find(id="notes").find_all("li")] == [EVIL]
    assert dom.find_all("img") == [] and dom.find_all("b") == [] and dom.find_all("link") == []


def test_the_rendered_page_refers_to_no_other_resource(two_variant_dom: Element) -> None:
    dom = two_variant_dom
    assert [
        element.tag for element in dom.iter() if {"src", "href", "srcset", "action"} & set(element.attrs)
    ] == []
    assert (
        dom.find("meta", http_equiv="Content-Security-Policy")
        .attrs["content"]
        .startswith("default-src 'none';")
    )


def test_a_thousand_records_render_in_chunks(browser: str, tmp_path: Path) -> None:
    records = [
        ReviewRecord(str(number), TEXTS, {"base": view(FULL_EXTRACTION, *FULL_GROUNDING)}, None, [])
        for number in range(1000, 0, -1)
    ]
    page = ReviewPage("big", ["base"], FIELDS, ["title"], records, GENERATED_AT)
    dom = open_page(tmp_path, page)
    assert dom.find(id="shown-count").text == "1000 of 1000 records shown"
    assert card_ids(dom) == [str(number) for number in range(1, 101)]  # by id, numerically
    assert dom.find(id="more").text == "Show 100 more (900 not rendered yet)"
    searched = parse_dom(dump_dom(tmp_path / "review.html", fragment="q=999"))
    assert searched.find(id="shown-count").text == "1 of 1000 records shown" and card_ids(searched) == ["999"]


def test_screenshot_has_the_size_asked_for(browser: str, tmp_path: Path) -> None:
    path = write_review(one_variant_page(), tmp_path / "review.html")
    png = screenshot(path, tmp_path / "review.png", 800, 600).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (800, 600)


@pytest.mark.parametrize(("required", "outcome"), [("", pytest.skip.Exception), ("1", pytest.fail.Exception)])
def test_a_missing_browser_skips_unless_required(
    monkeypatch: pytest.MonkeyPatch, required: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(browser_module, "chromium_path", lambda: None)
    monkeypatch.setenv("PIPELINE_REQUIRE_BROWSER", required)
    with pytest.raises(outcome, match="Chromium is not installed"):
        require_browser()
