"""When a running job refreshes its read copy, on a fake clock: the timer, a reader's request, and never
more often than the copies' cost allows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.extraction.context import RunContext
from pipeline.run.read_copies import COST_SHARE, MIN_GAP_S, ReadCopies
from pipeline.store.opening import prepare_database
from pipeline.store.read_copy import copy_path, request_copy, write_copy
from tests.support.jobs import make_job

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_copies_come_on_the_timer_or_when_asked_and_not_sooner_than_they_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_job(tmp_path, records=5, operations={"snapshot_interval_s": 60})
    connection = prepare_database(spec)
    clock = Clock()

    def quick_copy(*args: Any) -> float:
        # The copy is really written, but costs what the fake clock says (nothing): its wall time on a
        # loaded machine would space the next copies out past the smallest gap this test steps over.
        write_copy(*args)
        return 0.0

    monkeypatch.setattr("pipeline.run.read_copies.write_copy", quick_copy)
    copies = ReadCopies(connection.cursor(), RunContext.of(spec), 1, clock=clock)
    assert not copies.due()  # nobody asked, and the interval has not passed
    request_copy(spec.database)
    assert copies.due()  # a reader asked: at once
    await copies.write()
    assert copy_path(spec.database).exists() and copies.written == 1
    assert not copies.due()  # the request was answered
    clock.now += 59
    assert not copies.due()
    clock.now += 1
    assert copies.due()  # the timer
    await copies.write()
    request_copy(spec.database)
    clock.now += MIN_GAP_S / 2
    assert not copies.due()  # asked again at once: not before the smallest gap
    clock.now += MIN_GAP_S
    assert copies.due()
    connection.close()


async def test_an_expensive_copy_spaces_the_next_ones_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_job(tmp_path, records=5, operations={"snapshot_interval_s": 10})
    connection = prepare_database(spec)
    clock = Clock()
    copies = ReadCopies(connection.cursor(), RunContext.of(spec), 1, clock=clock)

    def slow_copy(*args: object) -> float:
        clock.now += 3.0  # the copy took 3 s
        return 3.0

    monkeypatch.setattr("pipeline.run.read_copies.write_copy", slow_copy)
    request_copy(spec.database)
    await copies.write()
    clock.now += 10
    assert not copies.due()  # the interval passed, but 3 s of copying allows one per 60 s
    clock.now += 3.0 / COST_SHARE - 10
    assert copies.due()
    connection.close()
