"""`concurrency: auto` and several jobs on one server, judged over servers drawn at random from a family
(:mod:`pipeline.bench.family_server`, written apart from the two server models the policy was tuned on;
tests/support/server_family.py draws them and measures), in the closed loop on the virtual clock.

The issue's properties: a first run reaches 0.92 of the best fixed level and the second 0.97 (runs of
~30 reply latencies); two and three jobs together reach 0.9 of one alone, within 25% of each other; a
job starting a quarter in gets its part. Each test leans its search toward bad servers (``target``),
and a failure prints the server as its parameters (a ``FamilySpec`` to paste as an ``@example``) and
every figure of it.

Only the properties that hold today are tests (their names start with ``test_``). The others are
written below as they will run, each with a server the search found that breaks it as its example:
prefix its name with ``test_`` to switch it on once the policy meets it. ``HYPOTHESIS_PROFILE=soak``
(``make soak``) draws more servers, with larger KV caches, from a random seed; CI runs a fixed few.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, example, given, settings, target

from pipeline.bench.family_server import FamilySpec
from tests.support.properties import log_sequence
from tests.support.server_family import BY_NAME, figures, jobs_together, joiner, servers

PROFILES = {
    "ci": settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)),
    # a server of 128 takes a minute or two: a round of the soak stays within its hour
    "soak": settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck)),
    "dev": settings(
        max_examples=1,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    ),
}
PROFILE_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
PROFILE = PROFILES[PROFILE_NAME]
#: CI's servers hold up to 32 of the job's requests, with little noise: a run's CPU grows with both.
SERVERS = servers(most_fit=128) if PROFILE_NAME == "soak" else servers(most_fit=32, most_noise=0.1)


def holds(name: str, server: FamilySpec) -> None:
    """The property ``name`` holds on ``server``; the search leans toward where it holds least."""
    prop = BY_NAME[name]
    margin = prop.margin(server)
    target(-margin, label=name)
    log_sequence(f"test_auto_family {name}", 1)
    figure = (1 + margin) * prop.at_least
    assert margin >= 0, f"{prop.words}: {figure:.3f}, under {prop.at_least:g}: {figures(server)}"


@PROFILE
@given(SERVERS)
def test_two_jobs_started_together_end_within_25_percent_of_each_other(server: FamilySpec) -> None:
    holds("two_apart", server)


@PROFILE
@given(SERVERS)
def test_three_jobs_started_together_end_within_25_percent_of_each_other(server: FamilySpec) -> None:
    holds("three_apart", server)


@PROFILE
@given(SERVERS)
def test_a_job_starting_a_quarter_in_gets_its_part(server: FamilySpec) -> None:
    """The two reach 0.9 of one job alone, and the joiner answers within 25% of the other's replies."""
    holds("late", server)
    holds("late_part", server)


# The properties fail a policy that does not share: a job held at 2 requests beside an `auto` one, on a
# server of 16 that runs its best at the fit.
BESIDE = FamilySpec(kv_size=16 * 1300 + 1000, max_num_seqs=128, single_tok_s=100.0)


def test_a_job_held_at_two_beside_others_breaks_the_spread_and_the_joiners_part() -> None:
    assert jobs_together(BESIDE, (None, 2)).spread > 1.25
    assert jobs_together(BESIDE, (None, None, 2)).spread > 1.25
    held = joiner(BESIDE, level=2)
    assert held.part < 0.8 and joiner(BESIDE).part >= 0.8
    assert jobs_together(BESIDE, (2, 2)).share < 0.9  # and two held there, what one alone does


# Not met today: switched on by the name's test_ prefix once the policy meets them. Their examples are
# the servers the search found that break them. The family's simplest server (every axis at its first
# value: a KV cache of 8 of the job's requests by tokens, a decline past it, /metrics without a queue):
# best fixed 8 (189 tok/s), a first run 0.984, the second 0.966. Two and three jobs on it were 0.888
# and 0.894 of one alone with each job its own limit; with one limit per server on a machine they are
# 0.982 and 0.964, but the soak drew a server (below) where two give 0.778: not met yet either.
SIMPLEST = FamilySpec(
    kv_by="tokens",
    kv_size=18400,
    past="decline",
    fall_to=0.5,
    overflow="preempt",
    max_num_seqs=64,
    chunked_prefill=False,
    prefix_caching=False,
    single_tok_s=33.5,
    half_batch=32.0,
    peak_batch=None,
    prefill_tok_s=20000.0,
    noise=0.0,
    metrics_queue=False,
    slot_tokens=4096,
    seed=0,
)


@PROFILE
@given(SERVERS)
# 8 slots by requests, a cliff past them, /metrics without a queue: best fixed 8 (197 tok/s); the first
# run sits at 10, past the cliff, 0.567, and leaves no knee (the second 0.567 too)
@example(
    server=FamilySpec(
        kv_by="requests",
        kv_size=8,
        past="cliff",
        fall_to=0.5,
        overflow="preempt",
        max_num_seqs=64,
        chunked_prefill=False,
        prefix_caching=False,
        single_tok_s=33.5,
        half_batch=512.0,
        peak_batch=None,
        prefill_tok_s=5000.0,
        noise=0.0,
        metrics_queue=False,
        slot_tokens=4096,
        seed=0,
    )
)
def first_run_reaches_092_of_the_best_fixed_level(server: FamilySpec) -> None:
    holds("first", server)


@PROFILE
@given(SERVERS)
@example(server=SIMPLEST)
def second_run_reaches_097_of_the_best_fixed_level(server: FamilySpec) -> None:
    holds("second", server)


@PROFILE
@given(SERVERS)
@example(server=SIMPLEST)
# Found by the soak with one limit per machine: 0.778 of one alone (best fixed 8; three jobs 0.763).
@example(
    server=FamilySpec(
        kv_by="tokens",
        kv_size=11400,
        past="decline",
        fall_to=0.5,
        overflow="preempt",
        max_num_seqs=64,
        chunked_prefill=False,
        prefix_caching=True,
        single_tok_s=33.5,
        half_batch=32.0,
        peak_batch=None,
        prefill_tok_s=20000.0,
        noise=0.0,
        metrics_queue=False,
        slot_tokens=4096,
        seed=0,
    )
)
def two_jobs_together_reach_09_of_one_alone(server: FamilySpec) -> None:
    holds("two", server)


@PROFILE
@given(SERVERS)
@example(server=SIMPLEST)
def three_jobs_together_reach_09_of_one_alone(server: FamilySpec) -> None:
    holds("three", server)
