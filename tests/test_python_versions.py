"""The code holds on every Python the project claims (``requires-python >= 3.11``), not only on the one
CI runs. CPython before 3.11.4 (Debian 12's python3 is 3.11.2) wraps an exception raised inside an
``except*`` block in an ExceptionGroup (python/cpython#103590): a ModelNotServedError raised there
came out as a traceback and exit 1. Newer Pythons raise it bare, so only reading the code catches it."""

from __future__ import annotations

import ast
import sys
from typing import Any

import pytest

from tests.support.processes import REPO

CHECKED = ("pipeline", "benchmarks", "schemas", "tests")


def raises_inside_except_star(source: str) -> list[int]:
    """The lines of ``raise X`` statements inside an ``except*`` handler (a bare ``raise``, which
    re-raises the matched group as it is, is the same on every Python)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.TryStar):
            for handler in node.handlers:
                for inner in (found for statement in handler.body for found in ast.walk(statement)):
                    if isinstance(inner, ast.Raise) and inner.exc is not None:
                        lines.append(inner.lineno)
    return lines


# A raise inside except* beside one outside it and a bare re-raise, which the check leaves alone.
WRAPPED = """\
def wrapped():
    try:
        raise ExceptionGroup("", [ValueError("wrong model")])
    except* ValueError as group:
        raise group.exceptions[0] from None
    except* KeyError:
        raise


def plain():
    try:
        pass
    except ValueError as error:
        raise RuntimeError() from error
"""


def test_the_check_finds_a_raise_inside_except_star_and_only_there() -> None:
    assert raises_inside_except_star(WRAPPED) == [5]


def test_no_raise_inside_except_star_anywhere() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in CHECKED
        for path in sorted((REPO / folder).rglob("*.py"))
        for line in raises_inside_except_star(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        f"raise inside except* at {found}: keep the error in a variable and raise it after the block "
        "(before Python 3.11.4 it would leave the block wrapped in an ExceptionGroup)"
    )


@pytest.mark.skipif(sys.version_info >= (3, 11, 4), reason="the wrapping is CPython's before 3.11.4")
def test_this_python_wraps_what_except_star_raises() -> None:
    """Why the check matters: on this Python, the error raised inside except* leaves it as a group."""
    namespace: dict[str, Any] = {}
    exec(WRAPPED, namespace)  # text, so the check over the files does not find it here
    with pytest.raises(ExceptionGroup):
        namespace["wrapped"]()
