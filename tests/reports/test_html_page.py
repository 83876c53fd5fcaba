"""The self-contained pages' shared writer: atomic, the old file kept on failure, errors naming the path
(the review page and the runs report page both write through it)."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.reports.html_page import write_page

PAGE = "<!doctype html><title>a page</title>"


def test_write_replaces_the_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    path.write_text("the old page")
    assert write_page(PAGE, path, "the page") == path
    assert path.read_text(encoding="utf-8") == PAGE
    assert [entry.name for entry in tmp_path.iterdir()] == ["page.html"]  # no temporary file left


def test_write_keeps_the_old_file_when_the_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "page.html"
    path.write_text("the old page")

    def fail_replace(source: object, target: object) -> None:
        raise OSError(errno.EIO, "disk gone")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: cannot write the page \\(disk gone\\)$"):
        write_page(PAGE, path, "the page")
    assert path.read_text() == "the old page"
    assert [entry.name for entry in tmp_path.iterdir()] == ["page.html"]


def test_write_into_a_missing_folder_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "page.html"
    with pytest.raises(ConfigError, match=r"nope/page\.html: cannot write the page \(No such file"):
        write_page(PAGE, path, "the page")
