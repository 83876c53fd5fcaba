"""The fault matrix against a real `pipeline sim` process: each fault alone, all of them together with a
server restart mid-run, a restart alone, and a server that queues (--max-num-seqs far below the
concurrency).

Every case: the run completes (exit 0 or 1, never an abort); every source record ends exactly once in
results or failures, each failure classified in a class the injected faults can cause; attempts (the
results' and failures' ``attempts`` columns, and the requests the server received) stay within
1.3 times the records, so faults never set off a retry storm; a re-ask adds one exchange to the record's
first request and never more, so prompts never grow without bound. ``pytest -s`` prints the figures.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.errors import FailureClass
from pipeline.extraction.parse import MAX_ECHOED_OUTPUT_CHARS, REASK_INSTRUCTION
from pipeline.extraction.prompt import PromptBuilder
from pipeline.job.spec import load_job
from pipeline.sim.answers import CHARS_PER_TOKEN, prompt_tokens
from tests.support.datasets import build_postings
from tests.support.jobs import table_rows, write_job
from tests.support.logged_run import json_log_lines
from tests.support.processes import REPO, SimProcess, pipeline_command, subprocess_env

pytestmark = pytest.mark.integration

MAX_ATTEMPTS_PER_RECORD = 1.3
RECORDS = 1500
CONCURRENCY = 32
REQUEST_TIMEOUT_S = 3.0  # a hang costs one worker this long
DOWN_S = 1.5  # how long the server is away when it restarts
RESTART_AT = 0.4  # ... after the server has received this share of the records' requests
RUN_TIMEOUT_S = 300.0
# A short fixed latency keeps each case to seconds on two cores; the seed fixes the server's draws.
FIXED_LATENCY = ("--latency", "0.05", "--jitter", "0.5", "--seed", "11")
# What a re-ask may add to the record's first request: the rejected answer (echoed up to
# MAX_ECHOED_OUTPUT_CHARS) and one instruction naming the error (a summary of at most 8 errors), as two
# messages.
REASK_MESSAGES = 2
REASON_CHARS = 2000
REASK_CHARS = MAX_ECHOED_OUTPUT_CHARS + len(REASK_INSTRUCTION) + REASON_CHARS
REASK_TOKENS = REASK_CHARS // CHARS_PER_TOKEN + 4 * REASK_MESSAGES

RATES = {
    "server_error": 0.05,
    "reset": 0.02,
    "hang": 0.01,
    "invalid_json": 0.05,
    "schema_invalid": 0.05,
    "length": 0.03,
    "context_length": 0.01,
}
# The failure classes each fault can leave once the record's retries of that kind run out.
CLASSES = {
    "server_error": {FailureClass.TRANSIENT},
    "reset": {FailureClass.TRANSIENT},
    "hang": {FailureClass.TRANSIENT},
    "invalid_json": {FailureClass.INVALID_JSON},
    "schema_invalid": {FailureClass.SCHEMA_INVALID},
    "length": {FailureClass.TRUNCATED},
    "context_length": {FailureClass.PERMANENT},
}
# A restart within operations.server_down_abort_s costs no record: requests wait for the server
# instead of spending their retries on refused connections.
RESTART_CLASSES: set[FailureClass] = set()


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    faults: dict[str, float] = field(default_factory=dict)
    restart: bool = False
    records: int = RECORDS
    concurrency: int = CONCURRENCY
    server: tuple[str, ...] = FIXED_LATENCY
    request_timeout_s: float = REQUEST_TIMEOUT_S

    def sim_args(self) -> list[str]:
        args = ["--model", "test-model", *self.server]
        for fault, rate in self.faults.items():
            args += [f"--fault-{fault.replace('_', '-')}", str(rate)]
        return args

    def allowed_classes(self) -> set[FailureClass]:
        allowed = set().union(*(CLASSES[fault] for fault in self.faults))
        return allowed | (RESTART_CLASSES if self.restart else set())


CASES = [
    *(Case(fault, {fault: rate}) for fault, rate in RATES.items()),
    # 21% of requests faulted and retried: ~1.27 attempts per record expected, so enough records to
    # keep the measured ratio close to that; c=32 so the restart drops few requests in flight.
    Case("all+restart", dict(RATES), restart=True, records=4000),
    Case("restart", restart=True),
    # 64 workers, 8 sequences at a time: 56 wait in the server's queue. Timeouts sized for the queue.
    Case(
        "max-num-seqs=8,c=64",
        concurrency=64,
        server=("--profile", "gpt-oss-120b", "--speed", "200", "--max-num-seqs", "8", "--seed", "11"),
        request_timeout_s=60.0,
    ),
]

TABLE: list[dict[str, str]] = []


@pytest.fixture(scope="module", autouse=True)
def _print_table() -> Iterator[None]:
    yield
    if TABLE:
        print("\nfault matrix\n" + format_table(TABLE))


def format_table(rows: list[dict[str, str]]) -> str:
    columns = list(rows[0])
    widths = {column: max(len(column), *(len(row[column]) for row in rows)) for column in columns}
    lines = ["  ".join(column.ljust(widths[column]) for column in columns)]
    lines += ["  ".join(row[column].ljust(widths[column]) for column in columns) for row in rows]
    return "\n".join(lines)


@dataclass(slots=True)
class ServerCounts:
    """The simulator's counters, summed over its processes (a restart starts them again at 0)."""

    requests: float = 0.0
    max_prompt_tokens: float = 0.0
    max_messages: float = 0.0
    peak_in_flight: float = 0.0
    peak_waiting: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    down_s: float | None = None  # from the kill until the new process served

    def add(self, metrics: dict[str, float]) -> None:
        self.requests += metrics["pipeline_sim:chat_requests_total"]
        self.max_prompt_tokens = max(self.max_prompt_tokens, metrics["pipeline_sim:max_prompt_tokens"])
        self.max_messages = max(self.max_messages, metrics["pipeline_sim:max_messages"])
        self.peak_in_flight = max(self.peak_in_flight, metrics["pipeline_sim:peak_requests_in_flight"])
        self.peak_waiting = max(self.peak_waiting, metrics["pipeline_sim:peak_requests_waiting"])
        for name, value in metrics.items():
            if name.startswith("pipeline_sim:faults_total{"):
                self.faults[name.split('fault="', 1)[1].rstrip('"}')] += int(value)


def first_prompts(job: Path) -> tuple[int, int]:
    """The largest first-attempt prompt, in the simulator's tokens, and its number of messages."""
    spec = load_job(job)
    builder = PromptBuilder(spec)
    rows = table_rows(spec.database, "SELECT title, description FROM postings")
    requests = [builder.request_for({"title": title, "description": text}) for title, text in rows]
    sizes = [prompt_tokens([dict(message) for message in r.messages]) for r in requests]
    return max(sizes), max(len(r.messages) for r in requests)


def run_case(case: Case, folder: Path) -> tuple[subprocess.CompletedProcess[str], ServerCounts, float]:
    sim = SimProcess(*case.sim_args(), log=folder / "sim.log")
    counts = ServerCounts()
    sim.start()
    try:
        job = write_job(
            folder,
            database="postings.duckdb",
            endpoint={"base_url": sim.url},
            concurrency=case.concurrency,
            request_timeout_s=case.request_timeout_s,
            max_tokens=2048,
            schema="schemas.linkedin:JobPosting",
            retry={"backoff_initial_s": 0.05, "backoff_max_s": 0.5},
        )
        started = time.perf_counter()
        with (folder / "run.out").open("w") as out, (folder / "run.err").open("w") as err:
            run = subprocess.Popen(
                pipeline_command("run", str(job), "--log-format", "json", "--progress", "log"),
                stdout=out,
                stderr=err,
                text=True,
                env=subprocess_env(),
                cwd=REPO,
            )
            try:
                if case.restart:
                    restart_mid_run(case, sim, run, counts)
                returncode = run.wait(timeout=RUN_TIMEOUT_S)
            finally:
                if run.poll() is None:
                    run.kill()
                    run.wait(timeout=30)
        elapsed = time.perf_counter() - started
        counts.add(sim.metrics())
    finally:
        sim.stop()
    completed = subprocess.CompletedProcess(
        run.args, returncode, (folder / "run.out").read_text(), (folder / "run.err").read_text()
    )
    return completed, counts, elapsed


def restart_mid_run(case: Case, sim: SimProcess, run: subprocess.Popen[str], counts: ServerCounts) -> None:
    """Once the server has received RESTART_AT of the records' requests: kill it, wait, start it again
    on the same port with the same seed. Its counters are read just before the kill."""
    deadline = time.monotonic() + RUN_TIMEOUT_S / 2
    while run.poll() is None and time.monotonic() < deadline:
        metrics = sim.metrics()
        if metrics["pipeline_sim:chat_requests_total"] >= RESTART_AT * case.records:
            counts.add(metrics)
            killed = time.perf_counter()
            sim.restart(DOWN_S)
            counts.down_s = time.perf_counter() - killed
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never reached {RESTART_AT:.0%} of its requests (exit {run.poll()})")


def log_entries(stderr: str) -> Iterator[dict[str, object]]:
    yield from json_log_lines(stderr)


def log_events(stderr: str) -> Counter[str]:
    """Warning and error log lines by event, to show what the run saw."""
    return Counter(
        str(entry.get("event"))
        for entry in log_entries(stderr)
        if entry.get("level") in ("warning", "error", "critical")
    )


def outage(server: ServerCounts, stderr: str) -> str:
    """How long the server was away, and how long the run held its requests (its own account)."""
    if server.down_s is None:
        return "-"
    held = [entry.get("down_s") for entry in log_entries(stderr) if "down_s" in entry]
    return f"{server.down_s:.1f}/" + ("+".join(str(value) for value in held) or "?")


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_fault_matrix(case: Case, tmp_path: Path) -> None:
    database = tmp_path / "postings.duckdb"
    build_postings(database, case.records)
    run, server, elapsed = run_case(case, tmp_path)
    failures = dict(table_rows(database, "SELECT failure_class, count(*) FROM failures GROUP BY ALL"))
    done = table_rows(database, "SELECT count(*) FROM results")[0][0]
    attempts = table_rows(
        database,
        "SELECT (SELECT coalesce(sum(attempts), 0) FROM results) + "
        "(SELECT coalesce(sum(attempts), 0) FROM failures)",
    )[0][0]
    first_max_tokens, first_messages = first_prompts(tmp_path / "job.yaml")
    injected = ", ".join(f"{name} {count}" for name, count in sorted(server.faults.items()) if count)
    TABLE.append(
        {
            "case": case.name,
            "records": str(case.records),
            "exit": str(run.returncode),
            "done": str(done),
            "failed": ", ".join(f"{name} {count}" for name, count in sorted(failures.items())) or "0",
            "attempts/rec": f"{attempts / case.records:.3f}",
            "sim req/rec": f"{server.requests / case.records:.3f}",
            "faults injected": injected or "-",
            "prompt max (1st)": f"{server.max_prompt_tokens:.0f} ({first_max_tokens})",
            "msgs": f"{server.max_messages:.0f}",
            "peak in flight/queued": f"{server.peak_in_flight:.0f}/{server.peak_waiting:.0f}",
            "down/held s": outage(server, run.stderr),
            "s": f"{elapsed:.1f}",
        }
    )
    print("\n" + format_table(TABLE[-1:]))
    warnings = log_events(run.stderr)
    if warnings:
        print(f"log warnings/errors: {dict(warnings)}")

    # The run completed (with failures at most): never an abort, never a hang.
    assert run.returncode in (0, 1), run.stderr[-3000:]
    statuses = table_rows(database, "SELECT status FROM runs ORDER BY run_id")
    assert statuses == [("completed_with_failures" if failures else "completed",)], run.stderr[-3000:]
    # Every source record exactly once across results and failures.
    assert table_rows(database, "SELECT count(*) - count(DISTINCT record_id) FROM results") == [(0,)]
    assert table_rows(database, "SELECT count(*) - count(DISTINCT record_id) FROM failures") == [(0,)]
    assert table_rows(database, "SELECT count(*) FROM results JOIN failures USING (record_id)") == [(0,)]
    assert done + sum(failures.values()) == case.records
    # Each failure is classified, and in a class the injected faults can cause.
    assert set(failures) <= {str(name) for name in case.allowed_classes()}, failures
    unexplained = "SELECT count(*) FROM failures WHERE message IS NULL OR message = ''"
    assert table_rows(database, unexplained) == [(0,)]
    if case.faults.keys() == {"context_length"}:  # a 400 is not retried: one failure per fault
        assert failures.get(FailureClass.PERMANENT, 0) == server.faults["context_length"]
    # No retry storm, counted by the pipeline and by the server.
    assert attempts <= MAX_ATTEMPTS_PER_RECORD * case.records
    assert server.requests <= MAX_ATTEMPTS_PER_RECORD * case.records
    # Every attempt reached the server. Around a restart, the two counts may differ by what was in
    # flight: requests the killed server had received (its counters are read just before the kill)
    # cost no attempt when a probe confirmed it gone (they were sent again once it answered), and a
    # request that broke while the server was already back counts as an attempt the old one never saw.
    # A request the client gave up on (a timeout, on a loaded machine) may end before the server counts it.
    timed_out = warnings.get("request timed out", 0)
    assert abs(server.requests - attempts) <= (case.concurrency if case.restart else 0) + timed_out
    # Re-asks start again from the record's first request: one exchange more at most.
    assert server.max_messages <= first_messages + REASK_MESSAGES
    assert first_max_tokens <= server.max_prompt_tokens <= first_max_tokens + REASK_TOKENS
    if case.name.startswith("max-num-seqs"):  # the server queued most of the requests
        assert server.peak_in_flight == case.concurrency
        assert server.peak_waiting >= case.concurrency - 8 - 8
    if not {"invalid_json", "schema_invalid"} & case.faults.keys():  # nothing to re-ask
        assert server.max_prompt_tokens == first_max_tokens
        assert server.max_messages == first_messages
