"""Whether the client itself is the bottleneck: its event loop's lag and its CPU share, on fake clocks."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.servers.client_load import CPU_SHARE, LAG_S, ClientLoad, ClientMeter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("load", "bound"),
    [
        pytest.param(ClientLoad(0.002, 0.3), False, id="a healthy loop with CPU to spare"),
        pytest.param(ClientLoad(LAG_S, 0.3), True, id="timers late: the loop is behind"),
        pytest.param(ClientLoad(0.002, CPU_SHARE), True, id="a core busy all the time"),
        pytest.param(ClientLoad(0.2, 0.4), True, id="starved by other processes: late, not busy"),
    ],
)
def test_the_client_is_the_bottleneck_when_its_loop_lags_or_its_core_is_busy(
    load: ClientLoad, bound: bool
) -> None:
    assert load.bound is bound


def test_it_says_both_readings() -> None:
    assert ClientLoad(0.12, 0.97).words == "event-loop lag 120 ms, its thread's CPU 97% of a core"


def test_the_meter_reads_the_mean_lag_and_the_cpu_share_since_its_last_reading() -> None:
    wall, cpu = Clock(), Clock()
    meter = ClientMeter(wall, cpu)
    for late in (0.01, 0.03, -0.001):  # a timer never fires early: noise is no lag
        meter.lagged(late)
    wall.now, cpu.now = 2.0, 1.5
    first = meter.read()
    assert first.lag_s == pytest.approx(0.04 / 3) and first.cpu_share == pytest.approx(0.75)
    wall.now, cpu.now = 3.0, 1.6
    second = meter.read()
    assert second.lag_s == 0.0 and second.cpu_share == pytest.approx(0.1)


def test_a_window_is_client_bound_by_its_mean_reading_not_by_one_pause() -> None:
    mean = ClientLoad.mean([ClientLoad(0.12, 0.5), ClientLoad(0.0, 0.5), ClientLoad(0.0, 0.5)])
    assert mean is not None and mean.lag_s == pytest.approx(0.04) and not mean.bound
    assert ClientLoad.mean([]) is None


def test_the_meter_counts_the_event_loops_thread_not_the_processs_other_threads() -> None:
    """DuckDB's threads and the checkpoint writers work on other cores: a busy one does not make the loop
    (idle here) a bottleneck. Real CPU time, about a fifth of a second."""
    meter = ClientMeter()

    def busy() -> None:
        until = time.thread_time() + 0.2
        while time.thread_time() < until:
            pass

    worker = threading.Thread(target=busy)
    worker.start()
    worker.join()
    assert meter.read().cpu_share < 0.5
