"""What one measurement window of `concurrency: auto` measures: beside other jobs, the server's level and
throughput as well as this job's."""

from __future__ import annotations

import pytest

from pipeline.servers.window import ServerLoad, Window


def scrape(running: float, waiting: float = 0.0) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=0.5, preemptions_total=0.0)


def measured(limit: int, scrapes: list[ServerLoad]) -> Window:
    window = Window(limit, 0.0, grew=False, precision=0.05)
    window.reply(10.0, 5.0, 100, ok=True)  # the first reply settles the transient
    for load in scrapes:
        window.scrape(load)
    for at in range(11, 30):
        window.reply(float(at), 5.0, 100, ok=True)
    return window


def test_beside_other_jobs_the_server_delivers_for_all_its_requests_at_this_jobs_rate() -> None:
    """50 of this job's and 100 of others' on the server: three times this job's rate."""
    window = measured(50, [scrape(140, 10), scrape(150, 0)])
    assert window.throughput == pytest.approx(50 * 100 / 5)
    others, server = window.server_view()
    assert others == pytest.approx(100) and server == pytest.approx(3 * window.throughput)


def test_alone_or_without_metrics_the_server_view_is_this_jobs() -> None:
    for window in (measured(50, [scrape(48)]), measured(50, [ServerLoad(None, None, None, None)])):
        assert window.server_view() == (0.0, window.throughput)


def test_a_window_shorter_than_the_scrapes_interval_takes_the_latest_scrape_for_the_server() -> None:
    """A fast server's window may end before a scrape comes: without one it would read this job's rate as
    the server's (half of it beside an equal job) and take that for a collapse."""
    window = measured(70, [])
    assert window.server_view() == (0.0, window.throughput)
    others, server = window.server_view(latest=scrape(140))
    assert others == 70 and server == pytest.approx(2 * window.throughput)
