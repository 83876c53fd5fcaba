"""One run's live numbers for Prometheus: an HTTP ``/metrics`` endpoint, a node_exporter textfile, or both.

:class:`RunCollector` reads a :class:`RunStats` at scrape time (its numbers once, :meth:`RunStats.now`:
the run's one record of them), so nothing is counted twice. The workers
update the stats on the event loop thread without locks, while scrapes arrive on the HTTP server's
threads; :func:`publish_metrics` therefore hops back to the event loop for every read, which also makes
each scrape one consistent instant (done + failed + remaining add up, histogram count matches its sum).

Each run gets its own :class:`CollectorRegistry`, never prometheus_client's global one, so several runs
in one process (and the tests) do not collide.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import math
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import anyio
import structlog
from anyio.abc import TaskStatus
from anyio.lowlevel import EventLoopToken, current_token
from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from pipeline.errors import ConfigError, FailureClass
from pipeline.extraction.retry import RetryKind
from pipeline.run.stats import RunStats
from pipeline.store.numbers import RunNumbers

log = structlog.get_logger("pipeline.run.prometheus")

PREFIX = "pipeline_"
#: Prometheus renames a scraped ``job`` label to ``exported_job`` unless the scrape sets honor_labels.
JOB_LABEL = "job"
DEFAULT_INTERVAL_S = 15.0


class RunCollector:
    """A prometheus_client custom collector over one run's :class:`RunStats`.

    ``collect()`` reads the stats directly: call it on the event loop thread that updates them (or
    through :func:`publish_metrics`, which does so for its server and textfile threads).
    """

    def __init__(self, stats: RunStats, job: str, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._stats = stats
        self._job = job
        # The stats clock is monotonic; fixed once so every scrape reports the same start instant.
        self.started_unix = wall_clock() - (stats.clock() - stats.started)
        #: Cleared for the last textfile write, so a file left behind says the run is over.
        self.active = True

    def collect(self) -> Iterator[Metric]:
        numbers = self._stats.now()
        yield from self._records(numbers)
        yield from self._requests(numbers)
        yield from self._timing()
        yield from self._endpoints()
        yield from self._server_cache(numbers)

    def _server_cache(self, run: RunNumbers) -> Iterator[Metric]:
        """The servers' prefix cache and preemptions since the run began, per endpoint, and the run's hit
        rate; an endpoint whose server has no /metrics (a proxy) has no series."""
        numbers = self._stats.endpoint_numbers()
        for name, documentation, kind in _CACHE_SERIES:
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(PREFIX + "endpoint_" + name, documentation, labels=[JOB_LABEL, "endpoint"])
            for endpoint, values in numbers.items():
                value = values.get(name.removesuffix("_total"))
                if value is not None:
                    family.add_metric([self._job, endpoint], float(value))
            yield family
        if run.prefix_cache_hit_rate is not None:
            yield self._gauge(
                "prefix_cache_hit_rate",
                "Prompt tokens the servers took from their prefix cache over those queried, this run.",
                run.prefix_cache_hit_rate,
            )

    def _endpoints(self) -> Iterator[Metric]:
        """One series per endpoint (label ``endpoint``: host:port) for each of its numbers."""
        numbers = self._stats.endpoint_numbers()
        for name, documentation, kind in _ENDPOINT_SERIES:
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(PREFIX + "endpoint_" + name, documentation, labels=[JOB_LABEL, "endpoint"])
            for endpoint, values in numbers.items():
                family.add_metric([self._job, endpoint], float(values[name.removesuffix("_total")]))
            yield family

    def _records(self, n: RunNumbers) -> Iterator[Metric]:
        yield self._counter("records_done_total", "Records extracted and committed.", n.done)
        yield self._counter_by(
            "records_failed_total",
            "Records committed as failed, by failure class.",
            "class",
            _with_known_keys(n.failures, FailureClass),
        )
        yield self._counter(
            "records_too_long_unsent_total",
            "Of the records failed too_long, those never sent: a count of the prompt said it cannot fit.",
            n.too_long_unsent,
        )
        yield self._counter(
            "chunks_done_total", "Chunks of long records (chunking:) answered and committed.", n.chunks_done
        )
        yield self._counter(
            "answers_from_reasoning_total",
            "Records whose answer came in the reasoning field, content null (taken, and marked).",
            n.answers_from_reasoning,
        )
        yield self._gauge(
            "records_pending",
            "Records of the job still pending, whatever --limit: after a plain run, what status calls "
            "pending (a --sample, --retry-failed, --only-failed or --redo-stale run: those it selects).",
            n.backlog,
        )
        yield self._gauge(
            "records_remaining", "Records this run set out to do, not finished yet.", n.remaining
        )
        yield self._gauge("records_at_start", "Records this run set out to do.", n.pending_at_start)
        yield self._gauge(
            "records_blank",
            "Records this run's options select that it set aside unsent: every prompt field empty.",
            n.blank,
        )

    def _requests(self, n: RunNumbers) -> Iterator[Metric]:
        s = self._stats
        yield self._gauge("requests_in_flight", "Requests sent and not ended yet.", s.in_flight)
        yield self._gauge("concurrency", "Most requests allowed in flight at once.", s.concurrency)
        yield self._counter(
            "requests_total", "Requests sent to the servers, every attempt (cancelled ones too).", n.attempts
        )
        yield self._counter("request_timeouts_total", "Requests that timed out.", n.timeouts)
        yield self._counter_by(
            "retries_total",
            "Requests repeated, by cause.",
            "cause",
            _with_known_keys(n.retries, RetryKind),
        )
        yield self._counter("prompt_tokens_total", "Prompt tokens the server reported.", n.prompt_tokens)
        yield self._counter("output_tokens_total", "Output tokens the server reported.", n.completion_tokens)
        yield self._counter(
            "reasoning_tokens_total",
            "Reasoning tokens the server reported (of the output).",
            n.reasoning_tokens,
        )
        latency = HistogramMetricFamily(
            PREFIX + "request_latency_seconds",
            "Time from sending a request to the server's answer (timeouts excluded).",
            labels=[JOB_LABEL],
        )
        buckets = [(_le(bound), count) for bound, count in s.latency.cumulative()]
        latency.add_metric([self._job], buckets, s.latency.total_s)
        yield latency

    def _timing(self) -> Iterator[Metric]:
        s = self._stats
        now = s.clock()
        yield self._gauge(
            "seconds_since_last_answer",
            "Seconds since the server last finished a request (since the start before the first).",
            s.since_last_answer_s(now),
        )
        yield self._gauge(
            "oldest_request_in_flight_seconds",
            "Age of the oldest request in flight; 0 when none is.",
            s.oldest_in_flight_s(now) or 0.0,
        )
        yield self._gauge("run_start_time_seconds", "Unix time the run started.", self.started_unix)
        yield self._gauge("run_active", "1 while the run goes on, 0 once it has ended.", int(self.active))

    def _counter(self, name: str, documentation: str, value: float) -> Metric:
        # CounterMetricFamily strips a trailing "_total" and the exposition adds it back.
        family = CounterMetricFamily(PREFIX + name, documentation, labels=[JOB_LABEL])
        family.add_metric([self._job], value)
        return family

    def _gauge(self, name: str, documentation: str, value: float) -> Metric:
        family = GaugeMetricFamily(PREFIX + name, documentation, labels=[JOB_LABEL])
        family.add_metric([self._job], value)
        return family

    def _counter_by(self, name: str, documentation: str, label: str, values: dict[str, float]) -> Metric:
        family = CounterMetricFamily(PREFIX + name, documentation, labels=[JOB_LABEL, label])
        for key, value in values.items():
            family.add_metric([self._job, key], value)
        return family


_ENDPOINT_SERIES = (
    ("up", "1 while the endpoint is in the rotation, 0 while it is held (gone, stalled).", "gauge"),
    ("limit", "Requests the endpoint may have in flight now (auto: what the controller chose).", "gauge"),
    ("in_flight", "Requests in flight at the endpoint.", "gauge"),
    ("requests_total", "Requests sent to the endpoint.", "counter"),
    ("answers_total", "Replies the endpoint delivered.", "counter"),
    ("output_tokens_total", "Output tokens the endpoint delivered.", "counter"),
    ("timeouts_total", "Requests to the endpoint that timed out.", "counter"),
    ("outages_total", "Times the endpoint was taken out of the rotation.", "counter"),
)


_CACHE_SERIES = (
    ("prefix_cache_queries_total", "Prompt tokens the server looked up in its prefix cache.", "counter"),
    ("prefix_cache_hits_total", "Prompt tokens the server found in its prefix cache.", "counter"),
    ("prefix_cache_hit_rate", "Prefix-cache hits over queries at the endpoint since the run began.", "gauge"),
    ("preemptions_total", "Requests the server preempted (its KV cache full) during this run.", "counter"),
)


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client's own histograms write it ("1.0", "+Inf")."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _with_known_keys(counts: dict[str, int], known: Iterable[str]) -> dict[str, float]:
    """Every known key, 0 when absent (so rate() and alerts see the series from the start), plus any
    other key the counter holds."""
    snapshot = dict(counts)
    keys = [str(key) for key in known]
    return {key: snapshot.get(key, 0) for key in [*keys, *sorted(set(snapshot) - set(keys))]}


class _OnEventLoop:
    """Runs a collector on the event loop thread, for a scrape or write arriving on another thread."""

    def __init__(self, collector: RunCollector, token: EventLoopToken) -> None:
        self._collector = collector
        self._token = token

    def collect(self) -> list[Metric]:
        return anyio.from_thread.run_sync(lambda: list(self._collector.collect()), token=self._token)


async def publish_metrics(
    stats: RunStats,
    job: str,
    *,
    port: int | None,
    host: str = "127.0.0.1",
    textfile: Path | None,
    interval_s: float = DEFAULT_INTERVAL_S,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    task_status: TaskStatus[int | None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Publish ``stats`` until cancelled: serve ``/metrics`` on ``host:port`` (0 picks a free port) and/or
    rewrite ``textfile`` every ``interval_s`` and once more at the end.

    Started with ``await task_group.start(...)``, it reports the bound port (None without ``port``)
    once listening and once the textfile was written, so a :class:`ConfigError` (port in use, missing
    folder) reaches the caller before the run goes on. With neither ``port`` nor ``textfile`` it returns.
    """
    collector = RunCollector(stats, job)
    registry = CollectorRegistry()
    registry.register(_OnEventLoop(collector, current_token()))
    async with AsyncExitStack() as cleanup:
        bound: int | None = None
        if port is not None:
            server = await _serve(registry, host, port)
            cleanup.push_async_callback(_shut_down, server)
            bound = server.server_port
            _say_where(host, server)
        if textfile is not None:
            await _write_first(textfile, registry)
            cleanup.push_async_callback(_write_last, textfile, registry, collector)
        task_status.started(bound)
        if textfile is None:
            if port is not None:
                await anyio.sleep_forever()
            return
        while True:
            await sleep(interval_s)
            await _write(textfile, registry)


async def write_textfile_once(stats: RunStats, job: str, textfile: Path) -> None:
    """Write ``textfile`` once, atomically, for a run that ended as it began (nothing to do): the series
    of every run, at what ``stats`` hold (nothing done, nothing pending) and ``pipeline_run_active`` 0,
    so that the file's mtime says the nightly run ran. A missing folder is a :class:`ConfigError`, as
    at the start of :func:`publish_metrics`."""
    collector = RunCollector(stats, job)
    collector.active = False
    registry = CollectorRegistry()
    # Registered as it is, not through _OnEventLoop: nothing updates these stats while the file is written.
    registry.register(collector)
    await _write_first(textfile, registry)


async def _serve(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    # Shielded so a cancellation while binding cannot leave a server thread behind.
    with anyio.CancelScope(shield=True):
        try:
            server, _thread = await anyio.to_thread.run_sync(
                functools.partial(start_http_server, port, addr=host, registry=registry)
            )
        except OSError as error:
            raise ConfigError(_listen_error(error, host, port)) from error
    return server


def _say_where(host: str, server: WSGIServer) -> None:
    """Log the URL; warn when the metrics are reachable from other machines, since anyone who can
    reach the port reads them (they carry no authentication)."""
    address = str(server.server_address[0])
    url_host = f"[{host}]" if ":" in host else host
    url = f"http://{url_host}:{server.server_port}/metrics"
    if ipaddress.ip_address(address.split("%")[0]).is_loopback:
        log.info("serving metrics", url=url)
        return
    log.warning(
        "serving metrics beyond this machine, without authentication: anyone who reaches the port reads "
        "the run's numbers (job name, endpoints, counts); firewall it or keep the default 127.0.0.1",
        url=url,
        address=address,
    )


def _listen_error(error: OSError, host: str, port: int) -> str:
    if error.errno == errno.EADDRINUSE:
        return f"--metrics-port {port}: address already in use"
    reason = (error.strerror or str(error)).lower()
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        return f"--metrics-port {port}: cannot listen on host {host!r}: {reason}"
    return f"--metrics-port {port}: {reason}"


async def _shut_down(server: WSGIServer) -> None:
    def stop() -> None:
        server.shutdown()  # waits for serve_forever's next poll, at most half a second
        server.server_close()

    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(stop)


def _write_blocking(path: Path, registry: CollectorRegistry) -> None:
    # Atomic (temporary file + rename); the temporary name does not end in .prom, so node_exporter
    # never reads half a file.
    write_to_textfile(str(path), registry)


async def _write(path: Path, registry: CollectorRegistry) -> None:
    try:
        await anyio.to_thread.run_sync(_write_blocking, path, registry)
    except OSError as error:
        # Monitoring must not end a nightly run: the next write may succeed.
        log.warning("cannot write metrics textfile", path=str(path), error=str(error))


async def _write_first(path: Path, registry: CollectorRegistry) -> None:
    if not await anyio.Path(path.parent).is_dir():
        raise ConfigError(f"--metrics-textfile {path}: folder {path.parent} does not exist")
    if path.suffix != ".prom":
        log.warning("node_exporter's textfile collector only reads *.prom files", path=str(path))
    try:
        await anyio.to_thread.run_sync(_write_blocking, path, registry)
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise ConfigError(f"--metrics-textfile {path}: cannot write: {reason}") from error


async def _write_last(path: Path, registry: CollectorRegistry, collector: RunCollector) -> None:
    collector.active = False
    with anyio.CancelScope(shield=True):
        await _write(path, registry)
