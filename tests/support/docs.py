"""The documentation's pages: the README and docs/*.md, each topic in one section of one page.

Tests that hold a page to the code (the exit codes, the commands) find the section by its heading, not
by the file it is in today, so a section that moves to another page is still found, and one that is
gone (or written twice) fails with the pages that were searched.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"


def pages() -> list[Path]:
    """Every page a reader meets: the README first, then docs/*.md by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


@dataclass(frozen=True)
class Section:
    """The text under one heading, up to the next heading of the same level or higher."""

    page: Path
    heading: str
    text: str


def section(heading: str) -> Section:
    """The one section, on any page, whose heading (of any level) reads ``heading``."""
    found = [
        Section(page, heading, text)
        for page in pages()
        for text in _sections_titled(page.read_text(), heading)
    ]
    names = ", ".join(str(page.relative_to(REPO)) for page in pages())
    assert found, f"no section {heading!r} in {names}"
    assert len(found) == 1, f"section {heading!r} is on more than one page: {[s.page.name for s in found]}"
    return found[0]


def _sections_titled(markdown: str, heading: str) -> list[str]:
    """The bodies of every section headed ``heading`` (headings inside code fences are not headings)."""
    lines = _outside_fences(markdown)
    found = []
    for at, (line, is_text) in enumerate(lines):
        match = re.match(r"^(#{1,6}) (.*)$", line) if is_text else None
        if match is None or match.group(2).strip() != heading:
            continue
        level = len(match.group(1))
        body = []
        for later, later_is_text in lines[at + 1 :]:
            ends = re.match(rf"^#{{1,{level}}} ", later)
            if later_is_text and ends:
                break
            body.append(later)
        found.append("\n".join(body))
    return found


def _outside_fences(markdown: str) -> list[tuple[str, bool]]:
    """Each line with whether it is prose (True) or inside a ``` block (False)."""
    marked = []
    inside = False
    for line in markdown.splitlines():
        fence = line.startswith("```")
        marked.append((line, not inside and not fence))
        if fence:
            inside = not inside
    return marked


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs makes it (Python-Markdown's toc): ASCII, lower case, punctuation gone,
    each run of spaces and hyphens one -."""
    ascii_text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", ascii_text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)
