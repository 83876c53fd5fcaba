"""What the server says back to `concurrency: auto` besides throughput: a queue told apart from a server
still admitting what was sent together, with made-up /metrics."""

from __future__ import annotations

from pipeline.servers.signals import admitting, queue_signal, steady
from pipeline.servers.window import DEFAULT_TUNING, ServerLoad, Window


def load(running: float, waiting: float) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=0.3, preemptions_total=0.0)


def window(limit: int, scrapes: list[ServerLoad]) -> Window:
    return Window(limit, 0.0, grew=True, precision=0.05, scrapes=scrapes)


def alone(_load: ServerLoad, _limit: int) -> float:
    return 1.0


# 359 sent at once to a server that prefills four prompts a step: it takes them in over a minute.
ADMITTING = [load(4 + 8 * i, 355 - 8 * i) for i in range(10)]


def test_a_server_taking_in_what_was_sent_together_is_admitting_not_queueing() -> None:
    assert admitting(ADMITTING)
    assert steady(ADMITTING) == []
    assert queue_signal(window(359, ADMITTING), 359, DEFAULT_TUNING, alone) is None


def test_a_step_with_prefills_may_outlast_a_scrape_and_is_still_admission() -> None:
    """Two scrapes inside one long prefill step show the same counts: the one before tells."""
    scrapes = [load(20, 339), load(28, 331), load(28, 331)]
    assert admitting(scrapes)


def test_only_the_scrapes_after_admission_ended_can_show_a_queue() -> None:
    """Once all is admitted the server runs them all: the transient's waiting is no queue."""
    settled = [load(359, 0)] * 4
    assert steady(ADMITTING + settled) == settled[2:]  # each compared with the one two before
    assert queue_signal(window(359, ADMITTING + settled), 359, DEFAULT_TUNING, alone) is None


def test_a_server_that_runs_fewer_than_sent_queues_the_rest() -> None:
    """--max-num-seqs 8 and 16 sent: flat at 8 running, 8 waiting, scrape after scrape."""
    scrapes = [load(8, 8)] * 3
    assert not admitting(scrapes)
    signal = queue_signal(window(16, scrapes), 16, DEFAULT_TUNING, alone)
    assert signal == (8, "the server queues at 16: 8 waiting, 8 running (mean of 3 scrapes)", True)


def test_a_flood_after_a_step_up_needs_two_steady_scrapes() -> None:
    one = [load(8, 8)]
    assert queue_signal(window(16, one), 16, DEFAULT_TUNING, alone) is None  # one may catch admission
    assert queue_signal(window(16, one * 2), 16, DEFAULT_TUNING, alone) is not None


def test_a_server_running_nothing_yet_is_starting_not_queueing() -> None:
    """The bundled CPU vLLM at a run's start: 12 waiting, 0 running for two scrapes while its first
    prefill runs. Read as a queue, it cut the limit from 15 to 3 (what it "runs")."""
    starting = [load(0, 12)] * 3
    assert queue_signal(window(15, starting[:2]), 15, DEFAULT_TUNING, alone) is None
    assert queue_signal(window(15, starting), 15, DEFAULT_TUNING, alone) is None
    assert queue_signal(
        window(15, [*starting, load(3, 12), load(3, 12), load(3, 12)]), 15, DEFAULT_TUNING, alone
    )


def test_what_a_run_sent_together_from_nothing_is_no_queue_before_the_first_replies() -> None:
    """The bundled CPU vLLM a moment later: 1 running, 11 waiting, scrape after scrape (one prefill per
    step of seconds). Read as a flood it cut the limit to 1, and a run stores its knee."""
    slow = [load(1, 11)] * 4
    first = Window(15, 0.0, grew=True, precision=0.05, scrapes=list(slow), lockstep=True, from_nothing=True)
    assert queue_signal(first, 15, DEFAULT_TUNING, alone) is None
    first.reply(30.0, 30.0, 400, ok=True)  # the first reply: what waits now waits for room
    first.scrapes.extend(slow)
    assert queue_signal(first, 15, DEFAULT_TUNING, alone) is not None
    assert queue_signal(window(15, slow), 15, DEFAULT_TUNING, alone) is not None  # any later window


def test_a_queue_beside_another_jobs_requests_is_this_jobs_only_in_proportion() -> None:
    """The server runs 60 of two jobs' 128: this job, half of them, takes half the queue as its own."""
    scrapes = [load(60, 68)] * 3
    level, reason, runs = queue_signal(window(64, scrapes), 64, DEFAULT_TUNING, lambda _l, _c: 0.5) or (
        0,
        "",
        0,
    )
    assert (level, runs) == (30, True) and reason.startswith("the server queues at 64: 68 waiting")
