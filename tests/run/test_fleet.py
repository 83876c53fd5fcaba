"""What a run leaves the next one of each server (:func:`pipeline.run.fleet.knees_to_store`): the knee
`concurrency: auto` found, except one found while the client was the bottleneck, which the run names;
and the servers' counters read before the first request and at the end, so a short run has them."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from structlog.testing import capture_logs

from pipeline.extraction.prompt import client_settings
from pipeline.job.spec import load_job
from pipeline.reports.status import job_status
from pipeline.run import fleet
from pipeline.run.fleet import knees_to_store
from pipeline.servers.client import LLMClient
from pipeline.servers.client_load import ClientLoad
from pipeline.servers.config import EndpointConfig
from pipeline.servers.endpoint import Endpoint
from pipeline.servers.knee_search import KneeMemory
from pipeline.servers.limits import AdaptiveLimit
from pipeline.servers.router import Router
from tests.support.fakes import ScriptedServer, good_completion, respond
from tests.support.jobs import make_job, write_job
from tests.support.runs import run_served


def auto_endpoint(tmp_path: Path, port: int) -> Endpoint:
    spec = load_job(write_job(tmp_path))
    config = EndpointConfig(f"http://127.0.0.1:{port}/v1", "test-model", None, 512, None, True)
    client = LLMClient(client_settings(spec, config))
    return Endpoint(config, client, abort_after_failures=3, timeout_s=900.0)


def measured(endpoint: Endpoint, knee: int, client: ClientLoad | None) -> None:
    """As if the run's windows had found ``knee`` (and the client been the bottleneck in one)."""
    controller = endpoint.controller
    assert isinstance(controller, AdaptiveLimit)
    controller._knee.best, controller._knee.best_tp, controller._measured = knee, 700.0, True
    controller._client_bound = client


def test_a_knee_found_while_the_client_was_the_bottleneck_is_not_stored_and_the_run_says_why(
    tmp_path: Path,
) -> None:
    starved, healthy = auto_endpoint(tmp_path, 8001), auto_endpoint(tmp_path, 8002)
    measured(starved, 8, ClientLoad(lag_s=0.12, cpu_share=0.97))
    measured(healthy, 256, None)
    router = Router([starved, healthy], give_up_after_s=60.0, stall_after_s=600.0)
    with capture_logs() as logs:
        stored = knees_to_store(router)
    assert stored == {healthy.config.knee_key: KneeMemory(256, False, tokens_per_s=700.0)}
    (warning,) = [log for log in logs if log["log_level"] == "warning"]
    assert warning["endpoint"] == "127.0.0.1:8001"
    assert warning["event"] == (
        "concurrency auto: the knee found is not stored as the server's: the client was the bottleneck "
        "(event-loop lag 120 ms, its thread's CPU 97% of a core); the next run starts where an earlier "
        "one left"
    )


def test_a_run_whose_client_kept_up_says_nothing_and_stores_every_knee(tmp_path: Path) -> None:
    first, second = auto_endpoint(tmp_path, 8001), auto_endpoint(tmp_path, 8002)
    measured(first, 64, None)
    measured(second, 128, None)
    with capture_logs() as logs:
        stored = knees_to_store(Router([first, second], give_up_after_s=60.0, stall_after_s=600.0))
    assert [memory.level for memory in stored.values()] == [64, 128]
    assert not [log for log in logs if log["log_level"] == "warning"]


class CountingServer(ScriptedServer):
    """A vLLM whose ``/metrics`` counters grow with each chat request: 100 prompt tokens looked up, 90
    of them from the prefix cache."""

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics":
            sent = len(self.bodies)
            return httpx2.Response(
                200,
                text=f"vllm:prefix_cache_queries_total {100.0 * sent}\n"
                f"vllm:prefix_cache_hits_total {90.0 * sent}\nvllm:num_preemptions_total 0.0\n",
            )
        answer = super().__call__(request)
        assert isinstance(answer, httpx2.Response)
        return answer


@pytest.mark.anyio
async def test_a_short_run_whose_server_reading_was_cut_short_has_the_hit_rate_and_preemptions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reading of the server before the first request has a budget (a loaded machine, a slow
    /tokenize outlast it): cut short, it kept no counters, and 30 records in well under the 5 s between
    counter scrapes had nothing to count from at the end: no hit rate and no preemptions (None in the
    row, status and the progress line)."""
    monkeypatch.setattr(fleet, "FIT_BUDGET_S", 0.0)  # every reading is cut short
    spec = make_job(tmp_path, records=30)
    summary = await run_served(spec, CountingServer([respond(good_completion())], max_model_len=8192))
    assert summary.done == 30
    report = job_status(spec)
    assert report.last_numbers is not None and report.last_numbers.prefix_cache_queries == 3000
    assert (report.server_cache.prefix_cache_hit_rate, report.server_cache.preemptions) == (0.9, 0)
