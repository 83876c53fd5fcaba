"""The judging page in a real browser (Debian's Chromium through Playwright), driven by keyboard against
``pipeline judge`` as a real process over a database a real run made."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Dialog, Page, sync_playwright

from pipeline.job.spec import JobSpec
from tests.support.browser import require_browser
from tests.support.judging import (
    HOSTILE_ID,
    IMG,
    SCRIPT,
    JudgeProcess,
    blind_judgment_rows,
    judge_process,
    judging_job,
    judgment_rows,
)
from tests.support.variants import two_variant_job

pytestmark = pytest.mark.integration
SCREENSHOT = Path("/tmp/judging_page.png")


@dataclass
class Judging:
    spec: JobSpec
    judge: JudgeProcess
    page: Page


@pytest.fixture(scope="module")
def blind_spec(tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """A job with two variants, main and big, to judge blind."""
    return two_variant_job(tmp_path_factory.mktemp("blind"))


@pytest.fixture(scope="module")
def judging(tmp_path_factory: pytest.TempPathFactory, blind_spec: JobSpec) -> Iterator[Judging]:
    """One job, one ``pipeline judge`` process, one browser for the module. Every job is made first:
    Playwright's sync API holds this thread's event loop while the browser is open, and a run needs it."""
    chromium = require_browser()
    spec = judging_job(tmp_path_factory.mktemp("page"))
    with judge_process(spec.source_file, "--judge", "ann") as judge, sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(10_000)
            yield Judging(spec, judge, page)
        finally:
            browser.close()


def press(page: Page, key: str, then: str) -> None:
    """Press ``key`` and wait until ``then`` (a CSS selector) is on the page: the server's answer shown."""
    page.keyboard.press(key)
    page.wait_for_selector(then)


def item(number: int, extra: str = "") -> str:
    return f'.item[data-item="{number}"]{extra}'


def counts(page: Page) -> dict[str, str]:
    """Each field's progress as the page shows it."""
    shown = page.eval_on_selector_all(
        "[data-progress-field]", "nodes => nodes.map(n => [n.dataset.progressField, n.textContent])"
    )
    return dict(shown)


def select_in_text(page: Page, text: str) -> None:
    """Select ``text`` in the record's description, as a mouse drag would."""
    page.evaluate(
        """(wanted) => {
            const node = document.querySelector('#source .text[data-field="description"]').firstChild;
            const start = node.textContent.indexOf(wanted);
            const range = document.createRange();
            range.setStart(node, start);
            range.setEnd(node, start + wanted.length);
            getSelection().removeAllRanges();
            getSelection().addRange(range);
        }""",
        text,
    )


def test_judging_by_keyboard_is_saved_at_once_and_goes_on_after_a_reload(judging: Judging) -> None:
    page = judging.page
    page.goto(judging.judge.url)
    page.wait_for_selector(item(0, ".focus"))  # ready to judge: the first value in focus
    assert page.text_content("#position") == "record 1 of 9 · id 1"
    started = time.monotonic()
    press(page, "a", item(0, ".verdict-correct"))  # title: correct
    assert "focus" in (page.get_attribute(item(1), "class") or "")
    assert page.is_visible("mark.focus")  # SQL, in focus, is highlighted in the text
    press(page, "x", item(1, ".verdict-wrong"))  # SQL: wrong
    press(page, "Space", item(3, ".focus"))  # Python skipped: years in focus
    press(page, "a", item(3, ".verdict-correct"))
    press(page, "Backspace", f"{item(3, '.focus')}:not(.verdict-correct)")  # undone, and in focus again
    press(page, "ArrowUp", item(2, ".focus"))  # back to Python's field, skills
    select_in_text(page, "Posting 1")
    press(page, "m", ".missing-item")  # a skill the model missed
    elapsed = time.monotonic() - started
    assert page.text_content("#status") == "saved"
    assert judgment_rows(judging.spec.database) == [
        ("1", "main", "title", "Title 1", "correct", "ann"),
        ("1", "main", "skills", "SQL", "wrong", "ann"),
        ("1", "main", "skills", "Posting 1", "missing", "ann"),
    ]
    page.reload()
    page.wait_for_selector(item(2, ".focus"))  # the first value not judged yet: Python
    assert counts(page) == {
        "title": "1 / 9",
        "skills": "1 / 18 · 1 missing",
        "years": "0 / 9",
        "low": "0 / 9",
        "high": "0 / 9",
    }
    assert page.text_content("#overall-text") == "2 of 54 values judged · 0 of 9 records done"
    assert page.text_content(".missing-item") == "missing: Posting 1"
    page.screenshot(path=str(SCREENSHOT))
    print(f"7 keys judged and shown in {elapsed:.2f} s")
    select_in_text(page, "needs")
    page.click("#btn-missing")  # the button does what m does, and keeps the selection it is about
    page.wait_for_selector(".missing-item >> nth=1")
    assert judgment_rows(judging.spec.database)[-1][2:5] == ("skills", "needs", "missing")


def test_markup_in_a_record_is_shown_as_text_and_runs_nothing(judging: Judging) -> None:
    page = judging.page
    dialogs: list[str] = []

    def dismissed(dialog: Dialog) -> None:  # an alert() would mean markup ran
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismissed)
    page.goto(judging.judge.url)
    page.wait_for_selector(".item.focus")
    press(page, "Enter", "#position:has-text('record 2 of 9')")
    press(page, "Enter", f"#position:has-text('id {HOSTILE_ID}')")
    description = page.text_content('#source .text[data-field="description"]') or ""
    assert SCRIPT in description and IMG in description
    values = page.eval_on_selector_all(".item .value", "nodes => nodes.map(n => n.textContent)")
    assert IMG in values and any(SCRIPT in value for value in values)
    assert page.query_selector_all("main img, main script") == []
    assert page.evaluate("typeof window.pwned") == "undefined" and not dialogs
    assert page.is_visible("mark.match-exact")  # the markup value is grounded, and marked as text


BLIND_SCREENSHOT = Path("/tmp/judging_page_blind.png")
#: What would tell the answers apart: the variants' names and their models'.
SECRETS = ("main", "big", "test-model", "big-model")
EVERY_ANSWER = """async () => {
    const get = async (path) => (await fetch(path, { cache: "no-store" })).json();
    const session = await get("/api/session");
    const records = [];
    for (let index = 0; index < session.records; index += 1) records.push(await get(`/api/records/${index}`));
    return { session, records };
}"""


def test_a_blind_page_after_judging_one_variant_shows_nothing_of_it_by_keyboard(
    judging: Judging, blind_spec: JobSpec
) -> None:
    page, spec = judging.page, blind_spec
    with judge_process(spec.source_file, "--judge", "ann") as seen:  # main on its own page
        page.goto(seen.url)
        page.wait_for_selector(item(0, ".focus"))
        press(page, "a", item(0, ".verdict-correct"))
        press(page, "x", item(1, ".verdict-wrong"))
        press(page, "a", item(2, ".verdict-correct"))
        assert (page.text_content("#overall-text") or "").startswith("3 of 54 values judged")
    with judge_process(spec.source_file, "--judge", "ann", "--variants", "main,big") as blind:
        page.goto(blind.url)
        page.wait_for_selector(item(0, ".focus"))
        assert page.text_content("#who") == "judge ann · 2 answers, blind"
        shown = page.eval_on_selector_all(".item", "nodes => nodes.map(n => n.className)")
        assert shown and not any("verdict-" in classes for classes in shown)  # no earlier mark
        assert page.query_selector_all(".missing-item") == []
        assert page.text_content("#overall-text") == "0 of 50 values judged · 0 of 8 records done"
        heads = page.eval_on_selector_all(".head[data-answer]", "nodes => nodes.map(n => n.textContent)")
        assert heads == ["answer 1", "answer 2"]
        api = page.evaluate(EVERY_ANSWER)  # what the page's own requests get
        assert api["session"]["progress"]["judged"] == 0 and api["session"]["variant"] is None
        assert all(i["verdict"] is None for r in api["records"] for i in r["items"])
        said = str(api) + (page.text_content("header") or "") + (page.text_content("#answers") or "")
        assert [secret for secret in SECRETS if secret in said] == []
        page.screenshot(path=str(BLIND_SCREENSHOT))
        press(page, "a", item(0, ".verdict-correct"))  # judged blind, by keyboard
        assert (page.text_content("#overall-text") or "").startswith("1 of 50 values judged")
        press(page, "Backspace", f"{item(0, '.focus')}:not(.verdict-correct)")
        press(page, "x", item(0, ".verdict-wrong"))
    rows = [row for row in blind_judgment_rows(spec.database) if row[:4] == ("1", "main", "title", "Title 1")]
    assert [(row[4], row[6]) for row in rows] == [("correct", ""), ("wrong", "big,main")]  # both kept
