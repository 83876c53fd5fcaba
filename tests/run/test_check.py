"""pipeline.run.check, check_lines and preflight: every line ``pipeline check`` says, against a fake vLLM
served on 127.0.0.1 and reached through the production client; a proxy without /metrics or /tokenize,
a probe that never answers, a server that is down; the exit codes and the JSON keys; and the run's
preflight, which says the cheap part's warnings and never holds the run up."""

from __future__ import annotations

import re
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
import httpx2
import orjson
import pytest
from structlog.testing import capture_logs

from pipeline.errors import ConfigError
from pipeline.job.commands import command
from pipeline.job.spec import JobSpec
from pipeline.run.check import CheckReport, check_job
from pipeline.run.check_lines import Check, backlog_check, fixed_part_check, timeout_check
from pipeline.run.probes import PROBE_TRANSIENT_RETRIES
from pipeline.servers.capacity import RequestFit
from pipeline.store.opening import prepare_database
from tests.support.clock import FakeSleep
from tests.support.fakes import (
    GOOD_ITEM,
    HANG,
    Answer,
    completion,
    dead_url,
    error,
    respond,
    serving,
)
from tests.support.jobs import make_job, table_rows
from tests.support.runs import run_served

pytestmark = pytest.mark.anyio

JSON_KEYS = {
    "context",
    "kv_tokens",
    "requests_that_fit",
    "prefix_caching",
    "answer_in_reasoning",
    "reasoning_effort_honored",
    "longest_prompt",
    "eta_s",
    "checks",
}
LINES = ["context", "kv_cache", "prefix_caching", "answer", "reasoning_effort", "response_format", "timeout"]
PREFIX_COUNT = 50  # what the fake's /tokenize says of the fixed part (no record in it)
PROMPT_COUNT = 100  # ... and of a record's prompt, as its completions' usage says
LONG_RECORD = "A LONG RECORD"


def vllm_past_context(context: int, prompt: int, max_tokens: int) -> str:
    """vLLM's 400 for a request past its context."""
    return (
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion). "
        "Please reduce the length of the messages or completion."
    )


@dataclass
class FakeVllm:
    """vLLM as check reads it: /v1/models, /metrics (cache settings), /tokenize, chat completions whose
    reasoning tokens follow reasoning_effort; each knob one thing a real server gets wrong."""

    blocks: int = 10_000  # x block_size tokens
    block_size: int = 16
    counted: int = PROMPT_COUNT  # what /tokenize says of a record's prompt
    prefix_caching: bool = True
    metrics: bool = True
    tokenize: bool = True
    max_model_len: int | None = 32_768
    answer_in_reasoning: bool = False
    refuse_format: bool = False
    hang: bool = False
    reasoning: dict[str, int] = field(default_factory=lambda: {"low": 20, "medium": 200})
    speed: float | None = None  # the simulator's --speed, as `pipeline sim` says it in /metrics
    server_error: bool = False  # every completion an HTTP 500, which the retry policy retries
    errors_first: int = 0  # the first this many completions an HTTP 500, then answers
    long_record: int = 0  # what it counts for a prompt with LONG_RECORD in it
    bodies: list[dict[str, object]] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> Answer:
        path = request.url.path
        if path.endswith("/models"):
            listed = {"max_model_len": self.max_model_len} if self.max_model_len else {}
            return respond({"object": "list", "data": [{"id": "test-model", **listed}]})
        if path == "/metrics":
            return respond(self._metrics()) if self.metrics else error(404, "Not Found")
        if path == "/tokenize":
            if not self.tokenize:
                return error(404, "Not Found")
            return respond({"count": self._prompt_tokens(request.content.decode())})
        body = orjson.loads(request.content)
        self.bodies.append(body)
        if self.hang:
            return HANG
        if self.server_error or len(self.bodies) <= self.errors_first:
            return error(500, "Internal Server Error: the engine died " + "x" * 400)
        if self.refuse_format and "response_format" in body:
            return error(400, "response_format is not supported by this server")
        prompt = self._prompt_tokens(request.content.decode())
        if self.max_model_len and prompt + int(str(body["max_tokens"])) > self.max_model_len:
            return error(400, vllm_past_context(self.max_model_len, prompt, int(str(body["max_tokens"]))))
        reasoning_tokens = self.reasoning.get(str(body.get("reasoning_effort")), 0)
        answer = orjson.dumps(GOOD_ITEM).decode()
        if self.answer_in_reasoning:
            return respond(completion(None, reasoning=answer, reasoning_tokens=reasoning_tokens))
        return respond(completion(answer, reasoning="thinking", reasoning_tokens=reasoning_tokens))

    def _prompt_tokens(self, text: str) -> int:
        if LONG_RECORD in text:
            return self.long_record
        return self.counted if "Description of posting" in text else PREFIX_COUNT

    def _metrics(self) -> str:
        return (
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.block_size}",enable_prefix_caching="{self.prefix_caching}",'
            f'num_gpu_blocks="{self.blocks}"}} 1.0\n'
        ) + (f"pipeline_sim:speed {self.speed}\n" if self.speed is not None else "")


async def checked(tmp_path: Path, server: FakeVllm, **job: object) -> CheckReport:
    spec = make_job(tmp_path, records=10, **job)
    async with serving(server) as served:
        return await check_job(spec.with_overrides(base_url=served.url), probe_timeout_s=5)


def line(report: CheckReport, name: str) -> tuple[str, str]:
    found = [check for check in report.checks if check.name == name]
    assert len(found) == 1, [check.name for check in report.checks]
    return found[0].status, found[0].message


async def test_a_good_server_is_all_ok_with_every_key_and_line(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm())
    assert [check.name for check in report.checks] == [*LINES, "backlog"]
    assert {check.status for check in report.checks} == {"ok"} and report.exit_code == 0
    data = report.as_json()
    assert set(data) >= JSON_KEYS and len(data["endpoints"]) == 1
    # 100 prompt and 40 completion tokens are 9 blocks of 16; the 3 full blocks of the 50-token prefix are
    # held once for all of them, so each holds 6 of its own
    assert data["kv_tokens"] == 160_000 and data["requests_that_fit"] == (10_000 - 3) // 6
    assert data["context"] == 32_768 and data["prefix_caching"] is True
    assert data["answer_in_reasoning"] is False and data["reasoning_effort_honored"] is True
    assert data["eta_s"] > 0 and data["pending"] == 10
    assert all(set(check) == {"name", "status", "message"} for check in data["checks"])


#: 30 blocks of 128 tokens (vLLM's CPU build), prefix caching on. The probes' 100 prompt and 40 answer
#: tokens take 2 blocks each and the 50-token prefix fills none (no block of it is shared): 15 fit. Before
#: any reply a request is the prefix and max_tokens 256: 3 blocks each, 10 fit. A count in tokens would
#: say 42, one in blocks of 16 or with the prefix's partial block shared other numbers again.
CPU_BLOCKS = FakeVllm(blocks=30, block_size=128)


async def test_checks_fit_is_the_one_count_at_the_measured_answers_and_counted_prompts(
    tmp_path: Path,
) -> None:
    report = await checked(tmp_path, CPU_BLOCKS, concurrency=15)
    fit = RequestFit(
        30 * 128, 100, 40, shared_prefix_tokens=PREFIX_COUNT, prefix_caching=True, block_size=128
    )
    assert report.as_json()["requests_that_fit"] == fit.requests == 15
    assert line(report, "kv_cache") == (
        "ok",
        "3,840 tokens: about 15 requests fit (~256 tokens each of its own, for ~100 prompt and ~40 answer "
        "tokens; answers as 3 probes measured, prompts as counted over 10 records), c=15",
    )
    # The prompts as /tokenize counts them, not as three probes' usage: 400 + 40 tokens are 4 blocks
    (tmp_path / "counted").mkdir()
    counted = await checked(tmp_path / "counted", replace(CPU_BLOCKS, counted=400), concurrency=15)
    assert counted.as_json()["requests_that_fit"] == 30 // 4
    assert "for ~400 prompt and ~40 answer tokens" in line(counted, "kv_cache")[1]


async def test_the_preflight_and_autos_start_take_the_one_count_at_max_tokens(tmp_path: Path) -> None:
    for folder in ("fixed", "auto"):
        (tmp_path / folder).mkdir()
    fixed = await run_logged(make_job(tmp_path / "fixed", records=2, concurrency=16), CPU_BLOCKS)
    said = [entry["event"] for entry in fixed if entry["event"].startswith("server check: kv_cache")]
    assert len(said) == 1 and "c=16, about 10 fit (~384 tokens each of its own, for ~50 prompt" in said[0]
    auto = await run_logged(make_job(tmp_path / "auto", records=2, concurrency="auto"), CPU_BLOCKS)
    started = [entry for entry in auto if entry["event"].startswith("concurrency auto starts where")]
    assert [entry["event"][-2:] for entry in started] == ["10"]


async def run_logged(spec: JobSpec, server: FakeVllm) -> list[MutableMapping[str, Any]]:
    with capture_logs() as logs:
        summary = await run_served(spec, server)
    assert summary.done == 2
    return logs


async def test_the_probes_are_the_jobs_own_requests_sent_alone(tmp_path: Path) -> None:
    server = FakeVllm()
    await checked(tmp_path, server)
    probes, contrast = server.bodies[:3], server.bodies[3]
    assert len(server.bodies) == 4 and all(b["reasoning_effort"] == "low" for b in probes)
    assert all("response_format" in b and b["max_tokens"] == 256 for b in server.bodies)
    assert all("Description of posting" in str(b["messages"]) for b in probes)
    assert contrast["reasoning_effort"] == "medium"


async def test_more_requests_than_fit_is_a_warning_with_the_number(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(blocks=30))  # (30 blocks - 3 shared) // 6 each
    status, message = line(report, "kv_cache")
    assert status == "warn" and report.exit_code == 1
    assert "c=8, about 4 fit" in message and "use `concurrency: auto` or <= 4" in message
    assert "collapse past ~4" in message


async def test_not_one_request_fitting_is_a_failure(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(blocks=5))
    assert line(report, "kv_cache")[0] == "fail" and report.exit_code == 3


async def test_auto_concurrency_is_told_where_it_starts(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(blocks=30), concurrency="auto")
    status, message = line(report, "kv_cache")
    assert status == "ok" and "about 4 requests" in message and "auto starts there" in message
    assert line(report, "timeout")[1].startswith("at c=4 a reply takes")


async def test_prefix_caching_off_says_what_it_costs_this_job(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(prefix_caching=False))
    status, message = line(report, "prefix_caching")
    assert status == "warn" and "50 x 10 records = 500 tokens" in message
    assert "--enable-prefix-caching" in message and report.as_json()["prefix_caching"] is False


async def test_an_answer_in_reasoning_is_said_with_its_recovery(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(answer_in_reasoning=True))
    status, message = line(report, "answer")
    assert status == "warn" and "3 of 3 probes put the JSON in `reasoning`" in message
    assert "the run recovers it" in message and report.as_json()["answer_in_reasoning"] is True


async def test_a_server_ignoring_reasoning_effort_is_a_warning(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(reasoning={"low": 100, "medium": 100}))
    status, message = line(report, "reasoning_effort")
    assert status == "warn" and "not honoured" in message and "low: 100, medium: 100" in message
    assert report.as_json()["reasoning_effort_honored"] is False


async def test_reasoning_taking_most_of_max_tokens_is_a_warning(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(reasoning={"low": 200, "medium": 400}))
    status, message = line(report, "reasoning_effort")
    assert status == "warn" and "78% of max_tokens 256" in message


async def test_a_job_without_reasoning_effort_sends_no_contrast_probe(tmp_path: Path) -> None:
    server = FakeVllm()
    report = await checked(tmp_path, server, reasoning_effort=None)
    assert len(server.bodies) == 3 and report.as_json()["reasoning_effort_honored"] is None
    assert line(report, "reasoning_effort")[0] == "ok"


async def test_a_refused_response_format_is_a_warning_and_the_probes_go_on_without_it(
    tmp_path: Path,
) -> None:
    server = FakeVllm(refuse_format=True)
    report = await checked(tmp_path, server)
    status, message = line(report, "response_format")
    assert status == "warn" and "refused" in message
    assert line(report, "answer") == ("ok", "in content (3 of 3 probes)")
    assert "response_format" not in server.bodies[-1]


async def test_a_probe_that_never_answers_is_a_failure_with_the_seconds(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    async with serving(FakeVllm(hang=True)) as served:
        report = await check_job(spec.with_overrides(base_url=served.url), probe_timeout_s=0.3)
    assert line(report, "probe") == ("fail", "no reply within 0.3 s (a probe, alone)")
    assert report.exit_code == 3 and line(report, "answer") == ("unknown", "no probe answered")
    for name in ("timeout", "backlog"):  # nothing measured: neither ok nor a second failure
        assert line(report, name)[0] == "unknown", name
    # Whether the server takes response_format shows only in an answer (or a refusal): none came
    assert line(report, "response_format") == ("unknown", "whether it is accepted: no probe answered")


async def test_a_server_answering_errors_is_said_with_its_answer_not_as_silence(tmp_path: Path) -> None:
    """An HTTP 500 is retried as a run retries it, until the probe's time is up: the line says what the
    server answered (shortened), not that it did not answer."""
    spec = make_job(tmp_path, records=10)
    async with serving(FakeVllm(server_error=True)) as served:
        report = await check_job(spec.with_overrides(base_url=served.url), probe_timeout_s=0.3)
    status, message = line(report, "probe")
    assert status == "fail" and report.exit_code == 3
    assert message.startswith(
        "in 0.3 s the server answered once, with an error a run retries (a probe, alone); it: HTTP 500: "
        "Internal Server Error: the engine died xxx"
    )
    assert message.endswith("x…") and len(message) < 250
    assert line(report, "response_format")[0] == "unknown"


async def test_a_server_answering_every_probe_with_an_error_fails_after_two_probes(tmp_path: Path) -> None:
    """At the default --probe-timeout (120 s) a probe answered HTTP 500 every time was retried as a run
    retries it, six times with backoff: the check took 106 s to fail. Each probe stops at the third
    answer, and a second probe that gets only errors too fails the check."""
    spec, server, waits = make_job(tmp_path, records=10), FakeVllm(server_error=True), FakeSleep()
    async with serving(server) as served:
        report = await check_job(spec.with_overrides(base_url=served.url), sleep=waits)
    status, message = line(report, "probe")
    assert status == "fail" and report.exit_code == 3
    assert len(server.bodies) == 2 * (PROBE_TRANSIENT_RETRIES + 1) == 6 and len(waits.waits) == 4
    assert re.fullmatch(
        r"in [\d.]+ s the server answered 3 times, each with an error a run retries \(a probe, alone\); "
        r"the last: HTTP 500: Internal Server Error: the engine died x+…",
        message,
    ), message


async def test_one_probe_that_got_only_errors_beside_answered_ones_is_a_warning(tmp_path: Path) -> None:
    """A server failing a quarter of its requests spends a probe's three tries once in 64: a run copes
    with it, so one such probe among answered ones warns and the check goes on; it failed the check,
    which then disagreed with the run."""
    server, waits = FakeVllm(errors_first=3), FakeSleep()
    spec = make_job(tmp_path, records=10)
    async with serving(server) as served:
        report = await check_job(spec.with_overrides(base_url=served.url), sleep=waits)
    status, message = line(report, "probe")
    assert status == "warn" and report.exit_code == 1, report.lines()
    assert message.endswith(
        "; 2 other probes answered: the server errs on some requests, which a run retries"
    ), message
    assert line(report, "answer") == ("ok", "in content (2 of 2 probes)")


async def test_a_server_answering_an_error_once_then_answering_passes(tmp_path: Path) -> None:
    """A blip: the first request answered HTTP 500, the retry and every probe after it answered."""
    server, waits = FakeVllm(errors_first=1), FakeSleep()
    spec = make_job(tmp_path, records=10)
    async with serving(server) as served:
        report = await check_job(spec.with_overrides(base_url=served.url), sleep=waits)
    assert report.exit_code == 0, report.lines()
    assert line(report, "answer") == ("ok", "in content (3 of 3 probes)") and len(waits.waits) == 1


async def test_a_proxy_without_metrics_or_tokenize_gets_unknown_not_a_traceback(tmp_path: Path) -> None:
    """What the server does not say is unknown, its own status: not ok (it was not checked), not a
    problem (the exit code stays 0)."""
    report = await checked(tmp_path, FakeVllm(metrics=False, tokenize=False, max_model_len=None))
    for name, said in (
        ("kv_cache", "the server's /metrics give no vllm:cache_config_info"),
        ("prefix_caching", "the server's /metrics do not say"),
        ("context", "the server lists no max_model_len"),
    ):
        assert line(report, name) == ("unknown", said)
    data = report.as_json()
    assert data["kv_tokens"] is None and data["requests_that_fit"] is None and data["prefix_caching"] is None
    assert data["context"] is None and report.exit_code == 0
    assert {check["status"] for check in data["checks"]} == {"ok", "unknown"}
    assert "unknown  kv_cache: the server's /metrics give" in report.lines()[1]


async def test_a_server_that_is_down_cannot_serve_the_job_in_one_line(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    report = await check_job(spec.with_overrides(base_url=dead_url()), probe_timeout_s=5)
    status, message = line(report, "server")
    assert status == "fail" and "cannot connect" in message and report.exit_code == 3
    assert [check.name for check in report.checks] == ["server"]  # no backlog of a server not there
    assert set(report.as_json()) >= JSON_KEYS and report.as_json()["kv_tokens"] is None


async def test_a_source_whose_every_record_is_blank_is_said_as_such(tmp_path: Path) -> None:
    """Found by the property tests: one record, every prompt field empty, and check said the source
    had no records."""
    spec = make_job(tmp_path, records=0)
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute("CREATE TABLE postings AS SELECT 7 AS id, '' AS title, ' ' AS description")
    async with serving(FakeVllm()) as served:
        with pytest.raises(ConfigError) as blank:
            await check_job(spec.with_overrides(base_url=served.url), probe_timeout_s=5)
    assert str(blank.value) == (
        f"{spec.source_file}: every record of the source is blank (1 record has empty title and "
        "description: id 7), so there is nothing to probe the server with and nothing a run would send: "
        "load records with text in those fields"
    )


async def test_with_one_server_down_of_two_the_backlog_is_the_other_ones(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    async with serving(FakeVllm()) as up:
        two = spec.with_overrides(
            endpoint=spec.endpoint.model_dump(exclude={"base_url"}, exclude_none=True),
            endpoints=[{"base_url": dead_url()}, {"base_url": up.url}],
        )
        report = await check_job(two, probe_timeout_s=5)
    status, message = line(report, "backlog")
    assert status == "ok" and message.startswith("10 records x") and report.exit_code == 3


async def test_the_probes_ask_for_what_a_run_asks_for_in_a_short_context(tmp_path: Path) -> None:
    """A context of 300 leaves a 100-token prompt 200 of max_tokens 256: the probes ask for 200, as the
    run does (they asked for 256, the server refused each with a 400, and nothing was measured)."""
    server = FakeVllm(max_model_len=300)
    report = await checked(tmp_path, server)
    assert [body["max_tokens"] for body in server.bodies] == [200] * 4  # the effort's probe too
    assert line(report, "answer") == ("ok", "in content (3 of 3 probes)")
    assert "probe" not in [check.name for check in report.checks]
    assert line(report, "context") == (
        "warn",
        "300 tokens: of the 5 pending records with the longest prompts, a run sends 5 with less than "
        "max_tokens 256 (the least left: 200, beside record 0's 100 tokens), 0 of them less than the ~40 "
        "the probes' answers took: an answer cut off there fails its record as too_long",
    )
    ran = FakeVllm(max_model_len=300)
    (tmp_path / "run").mkdir()
    assert (await run_served(make_job(tmp_path / "run", records=10), ran)).done == 10
    assert {body["max_tokens"] for body in ran.bodies} == {200}


async def test_a_record_a_run_refuses_the_check_names_and_the_run_refuses(tmp_path: Path) -> None:
    """The longest of all the pending records, not of a sample, counted by the server: the one a run
    fails as too_long unsent is named by its id, and the run does fail it, unsent."""
    server = FakeVllm(max_model_len=4096, long_record=5000)
    spec = make_job(tmp_path, records=200)
    edit = f"UPDATE postings SET description = '{LONG_RECORD} ' || repeat('word ', 4000) WHERE id = 142"
    with duckdb.connect(str(spec.database)) as connection:
        connection.execute(edit)
    async with serving(server) as served:
        report = await check_job(spec.with_overrides(base_url=served.url), probe_timeout_s=5)
    status, message = line(report, "context")
    assert status == "fail" and report.exit_code == 3
    assert message.startswith(
        "4,096 tokens: of the 5 pending records with the longest prompts, a run fails 1 as too_long, "
        "unsent (record 142: 5,000 tokens); use chunking: {field: description}, a longer context"
    )
    longest = {"record_id": 142, "tokens": 5000, "counted": True, "max_tokens": None}
    assert report.as_json()["longest_prompt"] == longest
    summary = await run_served(spec, FakeVllm(max_model_len=4096, long_record=5000))
    assert (summary.done, summary.failed) == (199, 1)
    failures = table_rows(spec.database, "SELECT record_id, failure_class, attempts FROM failures")
    assert failures == [(142, "too_long", 0)]


@pytest.mark.parametrize(
    ("answers_before", "status", "done"),
    [
        ([], "warn", 10),  # an answer needs the schema's fewest: 100 tokens left is room, sent
        ([150] * 10, "fail", 0),  # earlier runs' answers took 150: not sent
    ],
)
async def test_what_an_answer_needs_starts_where_a_runs_does_from_earlier_answers(
    tmp_path: Path, answers_before: list[int], status: str, done: int
) -> None:
    """A context of 200 leaves a 100-token prompt 100 tokens: a run sends it while it knows only the
    schema's fewest, and refuses it unsent once earlier runs' answers took more. The check says so."""
    spec = make_job(tmp_path, records=10)
    prepare_database(spec).close()
    with duckdb.connect(str(spec.database)) as connection:
        for n, tokens in enumerate(answers_before):  # results of records since removed
            connection.execute(
                "INSERT INTO results (variant, record_id, completion_tokens) VALUES ('main', ?, ?)",
                [1000 + n, tokens],
            )
    async with serving(FakeVllm(max_model_len=200)) as served:
        report = await check_job(spec.with_overrides(base_url=served.url), probe_timeout_s=5)
    assert line(report, "context")[0] == status
    if status == "fail":
        assert (
            "a run fails all 5 (more may not fit: 5 were counted) as too_long, unsent"
            in (line(report, "context")[1])
        )
        assert "(record 0: 100 tokens, too few left for an answer)" in line(report, "context")[1]
    summary = await run_served(spec, FakeVllm(max_model_len=200))
    assert (summary.done, summary.failed) == (done, 10 - done)


async def test_a_server_that_counts_no_prompt_leaves_their_fit_unknown(tmp_path: Path) -> None:
    report = await checked(tmp_path, FakeVllm(tokenize=False))
    assert line(report, "context") == (
        "unknown",
        "32,768 tokens; the longest pending prompt is ~102 tokens, estimated (record 0): the server "
        "does not count prompts",
    )
    assert report.exit_code == 0 and report.as_json()["longest_prompt"]["counted"] is False


def test_a_runs_preflight_says_what_the_prompts_fixed_part_leaves() -> None:
    assert fixed_part_check(4096, 2876, 4096) == Check(
        "context",
        "warn",
        "4,096 tokens: the prompt's fixed part (system prompt, examples, template: 2,876 tokens) leaves "
        "1,220 of max_tokens 4,096; every request asks for less",
    )
    assert fixed_part_check(131_072, 2876, 4096).status == "ok"
    assert fixed_part_check(4096, None, 4096).status == "unknown"


async def test_several_endpoints_each_have_their_report_and_share_the_backlog(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=10)
    async with serving(FakeVllm()) as first, serving(FakeVllm(prefix_caching=False)) as second:
        two = spec.with_overrides(
            endpoint=spec.endpoint.model_dump(exclude={"base_url"}, exclude_none=True),
            endpoints=[{"base_url": first.url}, {"base_url": second.url}],
        )
        report = await check_job(two, probe_timeout_s=5)
    data = report.as_json()
    assert [e["base_url"] for e in data["endpoints"]] == [first.url, second.url]
    assert data["prefix_caching"] is True  # the top level is the first endpoint's
    assert {check["endpoint"] for check in data["checks"]} == {first.url, second.url}
    assert "on two" not in line(report, "backlog")[1]
    assert report.exit_code == 1  # the second's prefix caching


def test_a_timeout_shorter_than_the_predicted_reply_fails_and_a_close_one_warns() -> None:
    fail = timeout_check(256, 270.0, 180.0)
    assert fail.status == "fail"
    assert (
        fail.message
        == "at c=256 a reply takes ~4.5 min; request_timeout_s 180 would kill them: set it to 540 or more"
    )
    assert timeout_check(256, 150.0, 180.0).status == "warn"
    assert timeout_check(256, 60.0, 900.0).status == "ok"
    busy = timeout_check(256, 60.0, 900.0, busy=40)
    assert "measured beside 40 other requests: an overestimate" in busy.message


async def test_the_runs_preflight_warns_at_start_and_does_not_stop_it(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=3)
    with capture_logs() as logs:
        summary = await run_served(spec, FakeVllm(blocks=20, prefix_caching=False))
    assert summary.done == 3
    said = [entry["event"] for entry in logs if entry["event"].startswith("server check")]
    assert len(said) == 2 and "kv_cache" in said[0] and "answer counted at max_tokens" in said[0]
    assert f"`{command('check', str(spec.source_file))}` measures" in said[0]  # pasted anywhere
    assert "prefix_caching: off" in said[1]
    started = next(i for i, entry in enumerate(logs) if entry["event"] == "run started")
    assert all(logs.index(entry) < started for entry in logs if entry["event"].startswith("server check"))


async def test_a_preflight_whose_server_does_not_answer_waits_no_more_than_a_second(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=1)
    server = FakeVllm()

    def slow_metrics(request: httpx2.Request) -> Answer:
        return HANG if request.url.path == "/metrics" else server(request)

    started = time.perf_counter()
    with capture_logs() as logs:
        summary = await run_served(spec, slow_metrics)
    assert summary.done == 1 and time.perf_counter() - started < 5
    assert not [entry for entry in logs if entry["event"].startswith("server check")]


async def test_a_server_that_gives_no_context_is_sent_no_preflight_reads(tmp_path: Path) -> None:
    spec = make_job(tmp_path, records=2)
    paths: list[str] = []
    server = FakeVllm(max_model_len=None)

    def recorded(request: httpx2.Request) -> Answer:
        paths.append(request.url.path)
        return server(request)

    summary = await run_served(spec, recorded)
    assert summary.done == 2 and "/metrics" not in paths and "/tokenize" not in paths


async def test_against_a_simulator_the_times_are_the_models_and_the_wall_time_is_said(tmp_path: Path) -> None:
    """A simulator at --speed 50 finishes in seconds a backlog its model would take minutes for: the
    reply time and the ETA are named as model time, with the wall time beside them."""
    report = await checked(tmp_path, FakeVllm(speed=50))
    assert report.endpoints[0].speed == 50
    for name in ("timeout", "backlog"):
        assert (
            "of model time" in line(report, name)[1] and "wall time at --speed 50)" in line(report, name)[1]
        )
    real = await checked(tmp_path, FakeVllm())
    assert not any("model time" in line(real, name)[1] for name in ("timeout", "backlog"))


def test_the_backlogs_eta_is_the_models_and_its_wall_time_each_servers_own() -> None:
    one = backlog_check(2499, 400, [1000.0], [50.0])
    assert one.message == (
        "2,499 records x ~400 output tokens / ~1,000 tok/s: ~16.7 min of model time here "
        "(20 s wall time at --speed 50), ~8.3 min on two"
    )
    # A real server at 1,000 tok/s and a simulator at --speed 3 doing 1,000 of the model's: 4,000 a
    # second of wall time in all, twice the model's.
    mixed = backlog_check(2499, 400, [1000.0, 1000.0], [1.0, 3.0])
    assert mixed.message.endswith("~8.3 min of model time here (4.2 min wall time at --speed 2)")
    assert backlog_check(1, 400, [10.0]).message == (
        "1 record x ~400 output tokens / ~10 tok/s: ~40 s here, ~20 s on two"
    )
