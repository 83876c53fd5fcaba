from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from pipeline.errors import ConfigError, FailureClass
from pipeline.extraction.retry import RetryKind
from pipeline.run.prometheus import RunCollector, publish_metrics, write_textfile_once
from pipeline.run.stats import LATENCY_BUCKETS_S, RunStats

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset({"job": "nightly", **labels}.items()))]


def busy_stats(clock: FakeClock) -> RunStats:
    """Two answers (0.3 s, 3 s), one timeout, one request still in flight since t=1005."""
    stats = RunStats(pending_at_start=20, concurrency=8, clock=clock, started=clock.now)
    first = stats.request_sent()
    clock.now += 0.3
    stats.request_ended(first, answered=True)
    second = stats.request_sent()
    clock.now += 3.0
    stats.request_ended(second, answered=True)
    clock.now = 1005.0
    stats.request_sent()  # still in flight
    timed_out = stats.request_sent()
    stats.request_ended(timed_out, answered=False)
    stats.numbers.timeouts += 1
    clock.now = 1010.0
    stats.numbers.done, stats.numbers.failed = 5, 2
    stats.numbers.failures.update({"invalid_json": 1, "transient": 1})
    stats.numbers.retries.update({"transient": 3, "reask": 1})
    stats.numbers.prompt_tokens, stats.numbers.completion_tokens = 1200, 345
    stats.set_blank(3)
    return stats


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def scrape(port: int) -> Samples:
    async with httpx2.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    response.raise_for_status()
    return parse(response.text)


def assert_busy_numbers(samples: Samples) -> None:
    assert value(samples, "pipeline_records_done_total") == 5
    assert value(samples, "pipeline_records_failed_total", **{"class": "invalid_json"}) == 1
    assert value(samples, "pipeline_records_failed_total", **{"class": "transient"}) == 1
    assert value(samples, "pipeline_records_failed_total", **{"class": "truncated"}) == 0
    assert value(samples, "pipeline_records_failed_total", **{"class": "too_long"}) == 0  # every class
    assert value(samples, "pipeline_chunks_done_total") == 0  # no long record in this run
    assert value(samples, "pipeline_records_pending") == 14  # the transient failure is still pending
    assert value(samples, "pipeline_records_remaining") == 13  # of this run's 20
    assert value(samples, "pipeline_records_at_start") == 20
    assert value(samples, "pipeline_records_blank") == 3  # set aside, not sent: none of the 20
    assert value(samples, "pipeline_records_too_long_unsent_total") == 0
    assert value(samples, "pipeline_requests_in_flight") == 1
    assert value(samples, "pipeline_concurrency") == 8
    assert value(samples, "pipeline_requests_total") == 4
    assert value(samples, "pipeline_request_timeouts_total") == 1
    assert value(samples, "pipeline_retries_total", cause="transient") == 3
    assert value(samples, "pipeline_retries_total", cause="reask") == 1
    assert value(samples, "pipeline_retries_total", cause="truncation") == 0
    assert value(samples, "pipeline_prompt_tokens_total") == 1200
    assert value(samples, "pipeline_output_tokens_total") == 345
    assert value(samples, "pipeline_reasoning_tokens_total") == 0
    assert value(samples, "pipeline_answers_from_reasoning_total") == 0
    assert value(samples, "pipeline_seconds_since_last_answer") == pytest.approx(10 - 3.3)
    assert value(samples, "pipeline_oldest_request_in_flight_seconds") == pytest.approx(5)
    assert value(samples, "pipeline_run_active") == 1


def assert_latency(samples: Samples) -> None:
    expected_le = {0.5: 1, 1: 1, 2.5: 1, 5: 2}  # 0.3 s and 3 s answers; every larger bucket holds both
    for bound in (*LATENCY_BUCKETS_S, float("inf")):
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        bucket = value(samples, "pipeline_request_latency_seconds_bucket", le=le)
        assert bucket == expected_le.get(bound, 2), le
    assert value(samples, "pipeline_request_latency_seconds_count") == 2
    assert value(samples, "pipeline_request_latency_seconds_sum") == pytest.approx(3.3)


def test_collector_exposes_every_number_of_the_run() -> None:
    stats = busy_stats(FakeClock())
    registry = CollectorRegistry()
    registry.register(RunCollector(stats, "nightly", wall_clock=lambda: 1_700_000_010.0))
    samples = parse(generate_latest(registry).decode())
    assert_busy_numbers(samples)
    assert_latency(samples)
    assert value(samples, "pipeline_run_start_time_seconds") == 1_700_000_000.0
    assert all(name.startswith("pipeline_") and ("job", "nightly") in labels for name, labels in samples)


def test_every_failure_class_and_retry_cause_is_there_at_zero() -> None:
    stats = RunStats(pending_at_start=3, concurrency=1, clock=FakeClock())
    stats.numbers.failures["something_new"] = 1  # a class added later must not be dropped
    registry = CollectorRegistry()
    registry.register(RunCollector(stats, "nightly"))
    samples = parse(generate_latest(registry).decode())
    for failure_class in FailureClass:
        assert value(samples, "pipeline_records_failed_total", **{"class": str(failure_class)}) == 0
    assert value(samples, "pipeline_records_failed_total", **{"class": "something_new"}) == 1
    for kind in RetryKind:
        assert value(samples, "pipeline_retries_total", cause=str(kind)) == 0
    assert value(samples, "pipeline_oldest_request_in_flight_seconds") == 0
    assert value(samples, "pipeline_request_latency_seconds_bucket", le="+Inf") == 0


def test_records_pending_is_the_job_s_backlog_whatever_the_limit() -> None:
    """A --limit 300 run of a job with 1,491 pending: at its end 1,192 are still pending, as status says
    (its transient failure among them), though the run has none left of its 300 (it said 0.0)."""
    stats = RunStats(pending_at_start=300, backlog_at_start=1491, concurrency=8, clock=FakeClock())
    stats.numbers.done, stats.numbers.failed = 297, 3
    stats.numbers.failures.update({"invalid_json": 2, "transient": 1})
    registry = CollectorRegistry()
    registry.register(RunCollector(stats, "nightly"))
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "pipeline_records_pending") == 1491 - 300 + 1
    assert value(samples, "pipeline_records_remaining") == 0
    assert value(samples, "pipeline_records_at_start") == 300


def test_records_never_sent_are_said_both_ways_blank_and_too_long() -> None:
    """The two numbers of records a run does not send, each a series: those set aside blank (every
    prompt field empty), and those failed too_long unsent (a count of the prompt said it cannot fit)."""
    stats = RunStats(pending_at_start=4, concurrency=1, clock=FakeClock())
    stats.numbers.done, stats.numbers.failed, stats.numbers.too_long_unsent = 1, 3, 2
    stats.numbers.failures.update({"too_long": 3})
    stats.set_blank(5)
    registry = CollectorRegistry()
    registry.register(RunCollector(stats, "nightly"))
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "pipeline_records_failed_total", **{"class": "too_long"}) == 3
    assert value(samples, "pipeline_records_too_long_unsent_total") == 2  # of the 3: one was sent
    assert value(samples, "pipeline_records_blank") == 5


async def test_http_endpoint_serves_live_numbers_on_a_free_port() -> None:
    clock = FakeClock()
    stats = busy_stats(clock)
    async with anyio.create_task_group() as tg:
        port = await tg.start(functools.partial(publish_metrics, stats, "nightly", port=0, textfile=None))
        assert isinstance(port, int) and port > 0
        samples = await scrape(port)
        assert_busy_numbers(samples)
        assert_latency(samples)
        started = value(samples, "pipeline_run_start_time_seconds")
        assert started == pytest.approx(time.time() - 10, abs=5)

        stats.numbers.done += 1
        clock.now += 20
        samples = await scrape(port)  # read at scrape time, not cached
        assert value(samples, "pipeline_records_done_total") == 6
        assert value(samples, "pipeline_records_pending") == 13
        assert value(samples, "pipeline_oldest_request_in_flight_seconds") == pytest.approx(25)
        assert value(samples, "pipeline_run_start_time_seconds") == started
        tg.cancel_scope.cancel()


async def test_server_is_closed_when_cancelled_and_the_port_can_be_reused() -> None:
    stats = busy_stats(FakeClock())
    publish = functools.partial(publish_metrics, stats, "nightly", port=0, textfile=None)
    async with anyio.create_task_group() as tg:
        port = await tg.start(publish)
        await scrape(port)
        tg.cancel_scope.cancel()
    with pytest.raises(httpx2.ConnectError):
        await scrape(port)
    async with anyio.create_task_group() as tg:  # the next run on the same port
        again = functools.partial(publish_metrics, stats, "nightly", port=port, textfile=None)
        assert await tg.start(again) == port
        assert value(await scrape(port), "pipeline_records_done_total") == 5
        tg.cancel_scope.cancel()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


async def test_port_in_use_is_a_config_error(busy_port: int) -> None:
    with pytest.raises(ConfigError, match=f"^--metrics-port {busy_port}: address already in use$"):
        await publish_metrics(RunStats(1, 1), "nightly", port=busy_port, textfile=None)


async def test_host_not_on_this_machine_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^--metrics-port 0: cannot listen on host .192\.0\.2\.1.: cannot assign requested address$",
    ):
        await publish_metrics(RunStats(1, 1), "nightly", port=0, host="192.0.2.1", textfile=None)


@pytest.mark.parametrize(("host", "beyond"), [("127.0.0.1", False), ("localhost", False), ("0.0.0.0", True)])
async def test_a_host_beyond_loopback_is_served_with_a_warning(host: str, beyond: bool) -> None:
    publish = functools.partial(
        publish_metrics, busy_stats(FakeClock()), "nightly", port=0, host=host, textfile=None
    )
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            port = await tg.start(publish)
            assert value(await scrape(port), "pipeline_records_done_total") == 5
            tg.cancel_scope.cancel()
    levels = {entry["log_level"] for entry in logs if "metrics" in entry["event"]}
    assert levels == ({"warning"} if beyond else {"info"})
    if beyond:
        warning = next(entry for entry in logs if entry["log_level"] == "warning")
        assert "without authentication" in warning["event"]
        assert warning["url"] == f"http://0.0.0.0:{port}/metrics"


async def test_textfile_is_written_every_interval_and_once_more_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.prom"
    stats = busy_stats(FakeClock())
    stats.numbers.done = 0
    waits: list[float] = []
    seen_done: list[float] = []
    third_tick = anyio.Event()

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        seen_done.append(value(parse(await anyio.Path(path).read_text()), "pipeline_records_done_total"))
        stats.numbers.done += 1
        if len(waits) == 3:
            third_tick.set()
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        publish = functools.partial(
            publish_metrics, stats, "nightly", port=None, textfile=path, interval_s=15, sleep=sleep
        )
        assert await tg.start(publish) is None
        await third_tick.wait()
        tg.cancel_scope.cancel()
    assert waits == [15, 15, 15]
    assert seen_done == [0, 1, 2]
    final = parse(path.read_text())
    assert value(final, "pipeline_records_done_total") == 3  # counted after the last periodic write
    assert value(final, "pipeline_run_active") == 0
    assert_latency(final)
    left = [entry.name async for entry in anyio.Path(tmp_path).iterdir()]
    assert left == [path.name]  # no temporary file left behind


async def test_textfile_and_http_together(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.prom"
    stats = busy_stats(FakeClock())
    async with anyio.create_task_group() as tg:
        publish = functools.partial(
            publish_metrics, stats, "nightly", port=0, textfile=path, sleep=lambda _: anyio.sleep_forever()
        )
        port = await tg.start(publish)
        assert_busy_numbers(await scrape(port))
        assert_busy_numbers(parse(path.read_text()))
        tg.cancel_scope.cancel()
    assert value(parse(path.read_text()), "pipeline_run_active") == 0


async def test_textfile_in_a_missing_folder_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "pipeline.prom"
    with pytest.raises(ConfigError, match=f"^--metrics-textfile {path}: folder .* does not exist$"):
        await publish_metrics(RunStats(1, 1), "nightly", port=None, textfile=path)


async def test_a_later_failed_write_only_warns(tmp_path: Path) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir()
    path = folder / "pipeline.prom"
    ticks: list[float] = []
    third_tick = anyio.Event()

    async def sleep(seconds: float) -> None:
        ticks.append(seconds)
        if len(ticks) == 1:
            await anyio.Path(path).unlink()
            await anyio.Path(folder).rmdir()  # e.g. the folder was cleaned up under a running job
        elif len(ticks) == 3:
            third_tick.set()
            await anyio.sleep_forever()

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            publish = functools.partial(
                publish_metrics, RunStats(1, 1), "nightly", port=None, textfile=path, sleep=sleep
            )
            await tg.start(publish)
            await third_tick.wait()
            tg.cancel_scope.cancel()
    warnings = [entry for entry in logs if entry["event"] == "cannot write metrics textfile"]
    assert len(warnings) == 3  # two periodic writes and the final one


async def test_nothing_to_publish_returns_at_once() -> None:
    publish = functools.partial(publish_metrics, RunStats(1, 1), "nightly", port=None, textfile=None)
    async with anyio.create_task_group() as tg:
        assert await tg.start(publish) is None


async def test_a_run_with_nothing_to_do_writes_the_same_series_once_saying_so(tmp_path: Path) -> None:
    """Issue 29: a quiet night wrote no textfile, so `time() - node_textfile_mtime_seconds > 86400` fired
    on every night with nothing new."""
    path = tmp_path / "pipeline.prom"
    clock = FakeClock()
    await write_textfile_once(RunStats(pending_at_start=0, concurrency=0, clock=clock), "nightly", path)
    quiet = parse(path.read_text())
    assert value(quiet, "pipeline_run_active") == 0
    assert value(quiet, "pipeline_records_done_total") == 0 and value(quiet, "pipeline_records_pending") == 0
    assert value(quiet, "pipeline_requests_total") == 0
    assert time.time() - value(quiet, "pipeline_run_start_time_seconds") < 60  # when it looked
    left = [entry.name async for entry in anyio.Path(tmp_path).iterdir()]
    assert left == [path.name]  # written beside and renamed: no temporary file left behind

    ordinary = tmp_path / "ordinary.prom"
    async with anyio.create_task_group() as tg:
        publish = functools.partial(
            publish_metrics, busy_stats(clock), "nightly", port=None, textfile=ordinary, interval_s=15
        )
        await tg.start(publish)
        tg.cancel_scope.cancel()
    families = {family.name for family in text_string_to_metric_families(path.read_text())}
    assert families == {family.name for family in text_string_to_metric_families(ordinary.read_text())}


async def test_nothing_to_do_in_a_missing_folder_is_the_same_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "pipeline.prom"
    with pytest.raises(ConfigError, match=f"^--metrics-textfile {path}: folder .* does not exist$"):
        await write_textfile_once(RunStats(0, 0), "nightly", path)
