"""A simulator on this machine, found by the port it listens on, and the CPU it and the machine spend:
read from the real /proc, against sockets this test holds and a real `pipeline sim` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
import pytest

from pipeline.bench.server_cpu import (
    CpuWatch,
    LocalSimulator,
    listening_process,
    local_simulator,
    machine_cpu,
)
from tests.support.processes import sim_server

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


@contextmanager
def listening(family: socket.AddressFamily = socket.AF_INET) -> Iterator[int]:
    """A socket of this process listening on a free port of 127.0.0.1 (or ::1): the port."""
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1" if family == socket.AF_INET else "::1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_the_process_listening_on_a_port_is_found() -> None:
    with listening() as port:
        assert listening_process(port) == os.getpid()
    with listening(socket.AF_INET6) as port:
        assert listening_process(port) == os.getpid()


def test_a_server_that_is_not_the_simulator_elsewhere_or_gone_is_not_watched() -> None:
    with listening() as port:
        assert local_simulator(f"http://127.0.0.1:{port}/v1") is None  # pytest listens, not `pipeline sim`
    assert local_simulator(f"http://127.0.0.1:{port}/v1") is None  # nothing listens there now
    assert local_simulator("http://gpu-box:8000/v1") is None


@pytest.mark.process  # the child that ended above
def test_a_process_gone_has_no_cpu_time() -> None:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    assert LocalSimulator(int(finished.stdout)).cpu_s() is None


def test_the_machines_cpu_time_grows_and_its_busy_part_is_within_it() -> None:
    before = machine_cpu()
    sum(range(2_000_000))  # a few milliseconds of this core
    after = machine_cpu()
    assert before is not None and after is not None
    assert after[1] >= before[1] and 0 <= after[0] - before[0] <= after[1] - before[1]


@pytest.mark.process
def test_a_simulator_on_this_machine_is_found_by_its_port_and_its_cpu_read() -> None:
    with sim_server("--model", "m", "--latency", "0") as url:
        simulator = local_simulator(url)
        assert simulator is not None and simulator.pid != os.getpid()
        watch = CpuWatch(simulator)
        served = 0
        with httpx2.Client() as client:
            # Until its CPU time moves a clock tick (10 ms): each request is some of its CPU.
            while (watch.shares(wall_s=1.0)[0] or 0) <= 0 and served < 10_000:
                client.get(url.removesuffix("/v1") + "/metrics").raise_for_status()
                served += 1
        server, machine = watch.shares(wall_s=1.0)
        assert server is not None and server > 0
        assert machine is not None and 0 <= machine <= 1
