"""The `process` marker kept true: a test that starts a process without it fails.

`make check` (the inner loop) runs the tests that start no process, by `-m "not process"`; a test that
starts one (the simulator, a `pipeline` subprocess, Chromium, a process holding a DuckDB file) is marked
`process` (`integration` and `local_vllm` imply it, and so does using a fixture decorated
`starts_a_process`). So that the mark cannot be forgotten, every way a test can start a process
(subprocess and asyncio's subprocesses, multiprocessing) is watched for the whole session, and a process
started during a test's setup, call or teardown (its fixtures included, whatever their scope) is counted
against that test: unmarked, it fails with the command it started.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import platform
import subprocess
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import pytest

PROCESS_MARKERS = ("process", "integration", "local_vllm")
_STARTS_A_PROCESS = "_starts_a_process"
F = TypeVar("F", bound=Callable[..., Any])

# The test running now (empty between tests) and the commands its phases started.
_running: list[pytest.Item] = []
_started: dict[str, list[str]] = {}


def _is_marked(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in PROCESS_MARKERS)


def _note(command: object) -> None:
    if _running:
        _started.setdefault(_running[-1].nodeid, []).append(_describe(command))


def _describe(command: object) -> str:
    words = command if isinstance(command, list | tuple) else [command]
    text = " ".join(os.fsdecode(word) if isinstance(word, bytes | str) else str(word) for word in words)
    return text[:160]


def _watched(start: Callable[..., Any], describe: Callable[[tuple[Any, ...]], object]) -> Callable[..., Any]:
    def watched(*args: Any, **kwargs: Any) -> Any:
        _note(describe(args))
        return start(*args, **kwargs)

    return watched


def pytest_configure(config: pytest.Config) -> None:
    """Watch the ways CPython starts a process, once for the session (every test pays nothing)."""
    # `platform` runs `uname -p` once and caches it: asked now, it is not counted against whichever
    # test happens to ask first (the OpenAI client does, for its request headers).
    platform.processor()
    # matplotlib (the bench extra's PNG) builds its font cache on first use by running `fc-list`: with
    # an empty cache folder (a new machine, a new CI runner) that would be counted against whichever
    # test first draws a chart. Built now, once, it is not.
    with contextlib.suppress(ImportError):
        import matplotlib.font_manager  # noqa: F401  (importing it builds the font cache)
    # subprocess holds its own reference to fork_exec; multiprocessing looks it up on the module.
    subprocess._fork_exec = _watched(subprocess._fork_exec, lambda args: args[0])  # type: ignore[attr-defined]  # private: typeshed leaves it out
    _posixsubprocess.fork_exec = _watched(_posixsubprocess.fork_exec, lambda args: args[0])
    os.posix_spawn = _watched(os.posix_spawn, lambda args: args[1])
    os.posix_spawnp = _watched(os.posix_spawnp, lambda args: args[1])
    os.fork = _watched(os.fork, lambda args: "os.fork()")


def starts_a_process(fixture: F) -> F:
    """Under ``@pytest.fixture``: every test using this fixture is marked `process`. A module-scoped
    simulator or browser page starts during the setup of whichever of its tests runs first, so marking
    only that one would leave the next in `make check`, starting it there."""
    setattr(fixture, _STARTS_A_PROCESS, True)
    return fixture


def _uses_a_process_fixture(item: pytest.Item) -> bool:
    if not isinstance(item, pytest.Function):
        return False
    used = item._fixtureinfo.name2fixturedefs  # every fixture it needs, directly or through another
    return any(getattr(definitions[-1].func, _STARTS_A_PROCESS, False) for definitions in used.values())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One marker for `make check`: `integration` and `local_vllm` tests start processes by definition,
    and so does every user of a fixture that starts one."""
    for item in items:
        if not item.get_closest_marker("process") and (_is_marked(item) or _uses_a_process_fixture(item)):
            item.add_marker(pytest.mark.process)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.remove(item)
        _started.pop(item.nodeid, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    started = _started.get(item.nodeid)
    if call.when == "teardown" and started and not _is_marked(item) and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started {len(started)} process(es) without the `process` marker "
            f"(`make check` would run it); first: {started[0]}. "
            "Mark it (pytestmark = pytest.mark.process, or @pytest.mark.process on the test), or put "
            "@starts_a_process under the @pytest.fixture that starts it."
        )
    return report
