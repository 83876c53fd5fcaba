from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import pytest
import structlog
from rich.console import Console
from structlog.testing import capture_logs

from pipeline.cli.logs import configure_logging
from pipeline.run.progress import FIRST, LiveProgress, LogProgress, format_duration, progress_text
from pipeline.run.stats import RunStats
from pipeline.store.snapshot import read_snapshot, write_snapshot

pytestmark = pytest.mark.anyio


def busy_stats() -> RunStats:
    stats = RunStats(
        pending_at_start=1000, concurrency=256, clock=lambda: 1060.0, started=1000.0
    )  # a minute in
    numbers = stats.numbers
    numbers.done, numbers.failed, numbers.completion_tokens, numbers.timeouts = 290, 10, 60_000, 2
    for _ in range(256):
        stats.request_sent()
    return stats


def test_live_bar_shows_counts_rates_and_eta() -> None:
    out = io.StringIO()
    bar = LiveProgress(Console(file=out, force_terminal=True, width=200))
    bar.close(busy_stats())
    text = out.getvalue()
    for expected in (
        "done 290",
        "failed 10",
        "in flight 256",
        "300.0 rec/min",
        "1,000 tok/s",
        "ETA 2:20",
        "timeouts 2",
    ):
        assert expected in text


async def test_log_progress_emits_periodic_lines() -> None:
    stats = busy_stats()
    waits: list[float] = []
    scope = anyio.CancelScope()

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) > 3:  # the fourth wait ends the run: no real clock, so no race with a busy machine
            scope.cancel()
            await anyio.sleep_forever()

    with capture_logs() as logs:
        with scope:
            await LogProgress(interval_s=30, sleep=sleep).run(stats)
        LogProgress().close(stats)
    assert waits == [30, 30, 30, 30]
    lines = [entry for entry in logs if entry["event"] == "progress"]
    assert len(lines) == 4
    assert lines[-1]["done"] == 290 and lines[-1]["in_flight"] == 256 and lines[-1]["eta_s"] == 140


def test_snapshot_round_trip(tmp_path: Path) -> None:
    database = tmp_path / "x.duckdb"
    assert read_snapshot(database) is None
    write_snapshot(database, 4, busy_stats().snapshot(), "running")
    snapshot = read_snapshot(database)
    assert snapshot is not None
    assert (snapshot["run_id"], snapshot["status"], snapshot["done"]) == (4, "running", 290)
    assert not list(tmp_path.glob("*.tmp"))


def test_format_duration() -> None:
    assert format_duration(None) == "--:--"
    assert format_duration(65) == "1:05"
    assert format_duration(3 * 3600 + 61) == "3:01:01"


def test_json_log_lines() -> None:
    stream = io.StringIO()
    configure_logging(json_lines=True, level="info", stream=stream)
    structlog.get_logger("t").info("hello", record_id=3)
    structlog.get_logger("t").debug("hidden")
    event = json.loads(stream.getvalue())
    assert event["event"] == "hello" and event["record_id"] == 3 and event["level"] == "info"
    assert "timestamp" in event
    assert len(stream.getvalue().splitlines()) == 1
    structlog.reset_defaults()


def failing_stats(failures_in_a_row: dict[str, int]) -> RunStats:
    """A run whose endpoints have had that many records in a row fail on the server side."""
    stats = busy_stats()
    stats.abort_after_failures = 50
    stats.last_failure = "HTTP 503 from http://gpu-box:8000/v1: Service Unavailable"
    stats.endpoint_numbers = lambda: {
        name: {"limit": 16, "failures_in_a_row": count} for name, count in failures_in_a_row.items()
    }
    return stats


def test_a_failing_server_is_said_with_how_far_the_run_is_from_stopping() -> None:
    """At 100% 5xx the run waits minutes (a restart is plausible) before it stops: the progress line
    says how close it is, and why."""
    expected = (
        "server failing: 31 of 50 records in a row failed on the server side before the run stops; "
        "last: HTTP 503 from http://gpu-box:8000/v1: Service Unavailable"
    )
    stats = failing_stats({"gpu-box:8000": 31})
    assert stats.server_failing() == expected
    with capture_logs() as logs:
        LogProgress().close(stats)
    assert logs[-1]["server_failing"] == expected
    out = io.StringIO()
    LiveProgress(Console(file=out, force_terminal=True, width=400)).close(stats)
    assert "server failing: 31 of 50 records in a row" in out.getvalue()


def test_with_several_endpoints_each_failing_one_is_named() -> None:
    stats = failing_stats({"a:8000": 0, "b:8000": 12})
    assert stats.server_failing() == (
        "server failing: b:8000: 12 of 50 records in a row failed on the server side before it leaves "
        "the rotation (the run stops when no endpoint is left); last: HTTP 503 from "
        "http://gpu-box:8000/v1: Service Unavailable"
    )


def test_a_healthy_run_says_nothing_of_failures() -> None:
    stats = failing_stats({"gpu-box:8000": 0})
    assert stats.server_failing() is None
    with capture_logs() as logs:
        LogProgress().close(stats)
    assert "server_failing" not in logs[-1]
    out = io.StringIO()
    LiveProgress(Console(file=out, force_terminal=True, width=400)).close(stats)
    assert "server failing" not in out.getvalue()


def crowded_stats() -> RunStats:
    """A busy run with what made a log line ~900 characters: three endpoints' numbers, one of them out,
    a low prefix-cache warning said, timeouts."""
    stats = busy_stats()
    endpoint = {
        "base_url": "http://gpu-box:8000/v1",
        "up": True,
        "limit": 256,
        "in_flight": 85,
        "requests": 900,
    }
    endpoint |= {"answers": 880, "output_tokens": 190_000, "timeouts": 2, "outages": 0, "preemptions": 0}
    endpoint |= {"prefix_cache_hits": 10, "prefix_cache_queries": 1000, "failures_in_a_row": 0}
    names = ("gpu-a:8000", "gpu-b:8000", "gpu-c:8000")
    stats.endpoint_numbers = lambda: {name: {**endpoint, "up": name != "gpu-c:8000"} for name in names}
    stats.cache_warnings.said.append(
        "gpu-a:8000: prefix-cache hit rate 1% where the job's shared prefix allows 90%: is caching on?"
    )
    return stats


def test_the_progress_line_says_first_what_a_person_looks_for_and_is_short() -> None:
    line = progress_text(crowded_stats())
    assert line.startswith("done 290 · failed 10 · in flight 256 · 300.0 rec/min · ETA 2:20 · ")
    assert "timeouts 2" in line and "servers up 2 of 3" in line
    assert len(line) < 160, line


def test_a_terminals_log_line_is_the_progress_line_alone() -> None:
    stream = io.StringIO()
    configure_logging(json_lines=False, level="info", stream=stream)
    try:
        LogProgress().close(crowded_stats())
    finally:
        structlog.reset_defaults()
    [shown] = stream.getvalue().splitlines()
    assert "progress: done 290 · failed 10 · in flight 256 · 300.0 rec/min · ETA 2:20" in shown
    assert "endpoints" not in shown and "base_url" not in shown and "prefix_cache_warnings" not in shown
    assert len(shown) < 220, shown


def test_the_json_log_keeps_every_field_with_what_a_person_looks_for_first() -> None:
    stats = crowded_stats()
    stream = io.StringIO()
    configure_logging(json_lines=True, level="info", stream=stream)
    try:
        LogProgress().close(stats)
    finally:
        structlog.reset_defaults()
    record = json.loads(stream.getvalue())
    assert (
        list(record)[: len(FIRST)]
        == list(FIRST)
        == ["done", "failed", "in_flight", "records_per_min", "eta_s"]
    )
    assert set(stats.snapshot()) <= set(record) and "said" not in record
    assert record["endpoints"]["gpu-c:8000"]["up"] is False and record["prefix_cache_warnings"]
