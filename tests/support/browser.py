"""Headless Chromium for tests of HTML pages: the DOM after the page's scripts ran, or a screenshot.

Each call starts one fresh browser (its own temporary profile, no network services, no sandbox so it
runs as root in containers) and always stops it. ``parse_dom`` turns the dumped DOM into a small tree
that tests can query by tag, class and attribute, with the stdlib's ``html.parser``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
REQUIRE_ENV = "PIPELINE_REQUIRE_BROWSER"
VIRTUAL_TIME_BUDGET_MS = 5000
TIMEOUT_S = 60.0
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_path() -> str | None:
    """``/usr/bin/chromium``, else ``chromium`` on PATH, else None."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


def require_browser() -> str:
    """Chromium's path; without it the test is skipped, or fails when PIPELINE_REQUIRE_BROWSER=1 (CI)."""
    path = chromium_path()
    if path is None:
        message = "Chromium is not installed (apt-get install -y chromium)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{message}, and {REQUIRE_ENV}=1 requires it")
        pytest.skip(message)
    return path


def page_url(url_or_path: str | Path, fragment: str = "") -> str:
    """A file path as a ``file://`` URL (a URL stays as it is), with ``#fragment`` if given."""
    text = str(url_or_path)
    url = text if "://" in text else Path(text).resolve().as_uri()
    return f"{url}#{fragment}" if fragment else url


def dump_dom(url_or_path: str | Path, *, fragment: str = "", timeout_s: float = TIMEOUT_S) -> str:
    """The page's DOM, serialised, after its scripts ran (within a 5 s virtual-time budget)."""
    return _run_chromium(
        [f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}", "--dump-dom"], url_or_path, fragment, timeout_s
    )


def screenshot(
    url_or_path: str | Path, png: Path, width: int = 1280, height: int = 900, *, fragment: str = ""
) -> Path:
    """A PNG of the page's first ``width`` x ``height`` pixels, written to ``png``."""
    flags = [
        f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--screenshot={png}",
    ]
    _run_chromium(flags, url_or_path, fragment, TIMEOUT_S)
    if not png.is_file():
        raise RuntimeError(f"Chromium wrote no screenshot to {png}")
    return png


def _run_chromium(flags: list[str], url_or_path: str | Path, fragment: str, timeout_s: float) -> str:
    chromium = require_browser()
    with tempfile.TemporaryDirectory(prefix="pipeline-chromium-") as profile:
        command = [chromium, *_FLAGS, f"--user-data-dir={profile}", *flags, page_url(url_or_path, fragment)]
        # Its own process group: on a timeout the renderer and helper processes go too, not only the parent.
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise RuntimeError(f"Chromium did not finish within {timeout_s:g} s: {command}") from None
    if process.returncode != 0:
        raise RuntimeError(f"Chromium exited with {process.returncode}: {stderr[-2000:]}")
    return stdout


# ---- a small DOM tree of the dumped HTML

_VOID = frozenset(
    {
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "param",
        "source",
        "track",
        "wbr",
    }
)


@dataclass(slots=True)
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    @property
    def text(self) -> str:
        """All text inside, as the page shows it (entities decoded)."""
        return "".join(child if isinstance(child, str) else child.text for child in self.children)

    def iter(self) -> Iterator[Element]:
        """This element and every element inside it, in document order."""
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def find_all(self, tag: str | None = None, *, cls: str | None = None, **attrs: str) -> list[Element]:
        """Elements inside (self included) with this tag, class and attributes (``data_x``: ``data-x``)."""
        wanted = {name.replace("_", "-"): value for name, value in attrs.items()}
        return [
            element
            for element in self.iter()
            if (tag is None or element.tag == tag)
            and (cls is None or cls in element.classes)
            and all(element.attrs.get(name) == value for name, value in wanted.items())
        ]

    def find(self, tag: str | None = None, *, cls: str | None = None, **attrs: str) -> Element:
        """The one element that matches; anything else fails the test."""
        found = self.find_all(tag, cls=cls, **attrs)
        assert len(found) == 1, f"expected one <{tag or '*'} class={cls} {attrs}>, found {len(found)}"
        return found[0]


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self._open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        self._open[-1].children.append(element)
        if tag not in _VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open[-1].children.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        # Close up to the matching open element (Chromium's output is well formed: usually the last one).
        for depth in range(len(self._open) - 1, 0, -1):
            if self._open[depth].tag == tag:
                del self._open[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._open[-1].children.append(data)


def parse_dom(html: str) -> Element:
    """The document as a tree of :class:`Element` (the root is a ``#document`` element)."""
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root
