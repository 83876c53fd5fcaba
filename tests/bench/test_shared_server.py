"""Several `auto` jobs on one server, each with its own client, on one machine taking their requests from
one pool of slots (pipeline.servers.slot_pool), on both server models (the simulator's engine and the
second, written apart from it), on a virtual clock: a server whose KV cache holds 64 of the jobs'
requests and that collapses past it."""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import cache

import pytest

from pipeline.bench.closed_loop import SERVER_MODELS, Scenario, Workload
from pipeline.bench.shared_server import Job, JobResult, run_jobs

FIT = 64
RECORDS = 1200


def server(model: str) -> Scenario:
    return Scenario(
        "gpt-oss-120b",
        20_000,
        kv_cache_tokens=FIT * 1900,
        max_num_seqs=512,
        fit_start=True,
        speed=10,
        server=model,
    )


@cache
def alone(model: str) -> JobResult:
    (job,) = run_jobs(server(model), [Job(RECORDS)])
    assert job.finished
    return job


def latency_s(model: str) -> float:
    """A reply's latency alone at the fit, by Little's law."""
    return FIT * alone(model).duration_s / RECORDS


def together(jobs: list[JobResult]) -> float:
    """Both jobs' records per second over the time from the first start to the last end."""
    return sum(job.answered for job in jobs) / (max(j.ended_s for j in jobs) - min(j.started_s for j in jobs))


def time_past_the_fit(jobs: list[JobResult], start_s: float, end_s: float) -> float:
    """How long between ``start_s`` and ``end_s`` the jobs' limits added up to well past the fit (15%)."""
    moments = sorted({start_s, end_s, *(at for job in jobs for at, _ in job.trace if start_s < at < end_s)})
    over = [
        (later - at)
        for at, later in itertools.pairwise(moments)
        if sum(job.limit_at(at) for job in jobs) > 1.15 * FIT
    ]
    return sum(over)


@pytest.mark.parametrize("model", SERVER_MODELS)
def test_two_jobs_started_together_finish_together_and_as_fast_as_one_of_both(model: str) -> None:
    first, second = run_jobs(server(model), [Job(RECORDS // 2), Job(RECORDS // 2)])
    assert first.finished and second.finished
    slower, faster = max(first.duration_s, second.duration_s), min(first.duration_s, second.duration_s)
    assert slower <= 1.25 * faster
    assert together([first, second]) >= 0.9 * alone(model).records_per_s
    # Past the fit only until each job's scrapes show the other: well under a reply's latency (until the
    # first is done sending: then the other's limit takes what its last requests leave as they drain).
    sending = min(first.sent_all_s, second.sent_all_s)
    assert time_past_the_fit([first, second], 0.0, sending) <= 0.5 * latency_s(model)


@pytest.mark.parametrize("model", SERVER_MODELS)
def test_a_job_left_alone_takes_the_server_back_within_a_few_reply_latencies(model: str) -> None:
    long, short = run_jobs(server(model), [Job(3 * RECORDS // 4), Job(RECORDS // 4)])
    assert short.ended_s < long.ended_s
    back = long.reached(round(0.9 * FIT), short.ended_s)
    assert back is not None and back - short.ended_s <= 3 * latency_s(model)


@pytest.mark.parametrize("model", SERVER_MODELS)
def test_a_job_that_starts_while_another_runs_gets_its_share_without_the_server_collapsing(
    model: str,
) -> None:
    late = alone(model).duration_s / 4
    first, second = run_jobs(server(model), [Job(RECORDS // 2), Job(RECORDS // 2, start_s=late)])
    assert first.finished and second.finished
    half = second.reached(round(0.4 * FIT), late)
    assert half is not None and half - late <= 5 * latency_s(model)
    both = min(first.ended_s, second.ended_s)
    sending = min(first.sent_all_s, second.sent_all_s)
    # One limit for both: past the fit no longer than one job alone probes past it (the second model's
    # search steps to 74 and back), where two searches of their own overshot while they saw each other
    lone = alone(model)
    probing = time_past_the_fit([lone], 0.0, lone.sent_all_s)
    assert time_past_the_fit([first, second], late, sending) <= probing + 0.75 * latency_s(model)
    served = sum(job.answered_between(late + latency_s(model), both) for job in (first, second))
    assert served / (both - late - latency_s(model)) >= 0.9 * alone(model).records_per_s  # no collapse
    assert together([first, second]) >= 0.9 * alone(model).records_per_s


# Servers whose best level lies well below the requests their KV cache holds (the seeds' curves, with the
# whole cache): gpt-oss-120b peaks near 256 of ~500 that fit; the 9B runs 8 at once (--max-num-seqs)
# of ~170. Sharing the fit there put each job past the server's best level.
BELOW_THE_FIT = [
    pytest.param(profile, model, records, id=f"{profile}-{model}")
    for profile, records in (("gpt-oss-120b", 3000), ("nemotron-nano-9b", 1500))
    for model in SERVER_MODELS
]


def roomy(profile: str, model: str) -> Scenario:
    return Scenario(
        profile,
        10**7,
        workload=Workload(prompt_tokens=2300 - 327, output_tokens=327),
        max_tokens=2048,
        fit_start=True,
        speed=10,
        server=model,
    )


@pytest.mark.parametrize(("profile", "model", "records"), BELOW_THE_FIT)
def test_two_jobs_share_the_servers_best_level_not_its_kv_fit(profile: str, model: str, records: int) -> None:
    (one,) = run_jobs(roomy(profile, model), [Job(2 * records)])
    first, second = run_jobs(roomy(profile, model), [Job(records), Job(records)])
    assert first.finished and second.finished
    slower, faster = max(first.duration_s, second.duration_s), min(first.duration_s, second.duration_s)
    assert slower <= 1.25 * faster
    assert together([first, second]) >= 0.9 * one.records_per_s


@pytest.mark.parametrize("model", SERVER_MODELS)
def test_a_job_that_only_ran_beside_another_goes_on_alone_at_the_servers_level_not_its_fit(
    model: str,
) -> None:
    """It joined a quarter in and never measured the server alone: left alone, it holds the level the
    two found together (gpt-oss-120b: near 256; one limit for both, which the first's end leaves as it
    was), not the ~500 that fit."""
    server = roomy("gpt-oss-120b", model)
    (one,) = run_jobs(server, [Job(6000)])
    first, second = run_jobs(server, [Job(3000), Job(3000, start_s=one.duration_s / 4)])
    assert first.ended_s < second.ended_s
    if model == "steps":  # past ~256 it slows: before, back to 494; the simulator's plateau is flat to 512
        assert 128 <= second.limit_at(first.ended_s + 10) <= 360
    assert together([first, second]) >= 0.9 * one.records_per_s


@pytest.mark.parametrize("jobs_count", [3, 4])
@pytest.mark.parametrize("model", SERVER_MODELS)
def test_jobs_on_one_machine_started_together_share_the_server_as_one_job_would(
    model: str, jobs_count: int
) -> None:
    """They take their requests from one pool (pipeline.servers.slot_pool): one search, each job its
    part. Before, by the server's sum alone, the job holding as much as the two others together saw a
    fair pair, and kept twice their part; four searches of their own each read the three others' probes
    as the server's answer to its own (0.83-0.90 of one job alone). Past the fit no longer than one job
    alone probes past it."""
    jobs = run_jobs(server(model), [Job(RECORDS // jobs_count)] * jobs_count)
    assert all(job.finished for job in jobs)
    durations = [job.duration_s for job in jobs]
    assert max(durations) <= 1.25 * min(durations)
    assert together(jobs) >= 0.9 * alone(model).records_per_s
    sending = min(job.sent_all_s for job in jobs)
    lone = alone(model)
    probing = time_past_the_fit([lone], 0.0, lone.sent_all_s)
    assert time_past_the_fit(jobs, 0.0, sending) <= probing + 0.5 * latency_s(model)


@pytest.mark.parametrize("model", SERVER_MODELS)
def test_on_a_server_that_shows_the_rest_waiting_past_its_cache_jobs_share_what_one_would_hold(
    model: str,
) -> None:
    """Past its KV cache the server's /metrics show 64 running and the rest waiting (as vLLM's do when
    it preempts), and its throughput falls smoothly, to half at twice the cache: two jobs of one
    machine, together or the second a quarter in, hold what one job alone holds (each searching on its
    own, both backed off to 10 in flight together and never climbed back)."""
    queued = replace(server(model), queued_past_cache=True, thrash=1.0)
    (one,) = run_jobs(queued, [Job(RECORDS)])
    pair = run_jobs(queued, [Job(RECORDS // 2), Job(RECORDS // 2)])
    late = run_jobs(queued, [Job(RECORDS // 2), Job(RECORDS // 2, start_s=one.duration_s / 4)])
    for jobs in (pair, late):
        assert all(job.finished for job in jobs)
        assert together(jobs) >= 0.9 * one.records_per_s
    durations = [job.duration_s for job in pair]
    assert max(durations) <= 1.25 * min(durations)
    assert late[1].reached(round(0.4 * FIT), one.duration_s / 4) is not None  # the joiner gets its part


@pytest.mark.parametrize("model", SERVER_MODELS)
def test_four_jobs_on_a_server_that_runs_8_at_once_share_it_as_one_job_would(model: str) -> None:
    """The 9B runs 8 and ~170 fit: a pool that handed the first job its whole start at once had it
    queued at the server before the others came (it finished 1.5x before them), and room taken from
    counts a tick old put 214 in flight where the pool held 130 (0.41 of one job alone)."""
    scenario = roomy("nemotron-nano-9b", model)
    (one,) = run_jobs(scenario, [Job(1200)])
    jobs = run_jobs(scenario, [Job(300)] * 4)
    assert all(job.finished for job in jobs)
    durations = [job.duration_s for job in jobs]
    assert max(durations) <= 1.25 * min(durations)
    assert together(jobs) >= 0.9 * one.records_per_s
