"""What the server says back to `concurrency: auto` (:mod:`pipeline.servers.limits`) besides throughput: a
queue (the limit exceeds what the server runs), preemptions past a full KV cache (a thrash), and replies
nearing the client's timeout. Each is a :data:`Signal`: the level to back off to, the reason in words,
and whether that level is what the server runs (the search goes on there). And what its KV cache says
of the next step up (:func:`aim_up`).

A queue is told apart from a server taking in requests sent together: it admits a few a step, as their
prefills fit in a step's token budget (vLLM's chunked prefill), and the rest wait meanwhile; while the
scrapes show more running and fewer waiting, that is admission, not a server that runs fewer than sent.
Only the scrapes after it (:func:`steady`) can show a queue.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pipeline.servers.knee_search import KneeSearch
from pipeline.servers.window import ServerLoad, Tuning, Window

#: The level to back off to, why, and whether it is what the server runs.
Signal = tuple[int, str, bool]


def admitting(scrapes: Sequence[ServerLoad], span: int = 3) -> bool:
    """Whether the server was still taking its queue in at the last scrape: more running and fewer waiting
    than ``span`` - 1 scrapes before (or at the first), since a step with prefills may outlast a scrape."""
    if len(scrapes) < 2:
        return False
    before, last = scrapes[-min(span, len(scrapes))], scrapes[-1]
    if None in (before.running, last.running, before.waiting, last.waiting):
        return False
    return (last.running or 0.0) > (before.running or 0.0) and (last.waiting or 0.0) < (before.waiting or 0.0)


def steady(scrapes: Sequence[ServerLoad]) -> Sequence[ServerLoad]:
    """The scrapes after the last one that showed the server still admitting (all, if none did)."""
    for end in range(len(scrapes), 1, -1):
        if admitting(scrapes[:end]):
            return scrapes[end:]
    return scrapes


def flooded(scrapes: Sequence[ServerLoad], tuning: Tuning) -> bool:
    """Two steady scrapes are enough after a step up that the server queues a good part of: no blip does."""
    if len(scrapes) < 2:
        return False
    load = scrapes[-1]
    return (load.waiting or 0.0) > tuning.flood_share * max(load.running or 0.0, 1.0)


def queue_signal(
    window: Window, limit: int, tuning: Tuning, own_part: Callable[[ServerLoad, int], float]
) -> Signal | None:
    """The server queues what it is sent, once it stopped admitting: in ``waiting_share`` of the steady
    scrapes, more than ``queue_share`` of those running (a short queue keeps a full server busy), or
    flooded at once after a step up. ``own_part``: this job's part of a scrape's requests."""
    if window.from_nothing and window.started_at is None:
        return None  # still taking in what was sent together (1 running, 11 waiting on a CPU vLLM)
    scrapes = steady(window.scrapes)
    flood = window.grew and flooded(scrapes, tuning)
    if len(scrapes) < tuning.min_scrapes and not flood:
        return None
    waiting = Window.mean([load.waiting for load in scrapes])
    queued = sum(1 for load in scrapes if (load.waiting or 0) > 0)
    running = Window.mean([load.running for load in scrapes])
    if running is not None and running < 1:  # running nothing: a server starting (a CPU server's first
        return None  # prefill) or stalled (the watchdog's), not one that runs fewer than it is sent
    tolerated = tuning.queue_share * (running or 0.0)
    if waiting is None or queued < tuning.waiting_share * len(scrapes) or waiting <= tolerated:
        return None
    runs = f", {running:.0f} running" if running is not None else ""
    scraped = f"mean of {len(scrapes)} scrapes" if len(scrapes) > 1 else "one scrape"
    mine = own_part(scrapes[-1], limit)
    level = limit - max(1, round(waiting * mine))
    if mine < 1 and running:  # beside other jobs: this job's part of what it runs (the scrapes lag the
        level = min(limit - 1, round(running * mine))  # others' moves, and their waiting with them)
    elif len(scrapes) < tuning.min_scrapes:  # flooded: what the server runs now
        level = min(level, round((scrapes[-1].running or level) * mine))
    return level, f"the server queues at {limit}: {waiting:.0f} waiting{runs} ({scraped})", True


def preemption_signal(window: Window, limit: int, tuning: Tuning) -> Signal | None:
    """Preemptions above ``preemption_rate`` per reply once the transient is over: a thrash, down one
    ``min_step``. A step up admits its requests at once, and a few are preempted until the batch
    settles, at a level that runs without any."""
    scrapes = window.scrapes
    if len(scrapes) < tuning.min_scrapes:
        return None
    settled = scrapes[window.settled_scrape :] if window.started_at is not None else []
    counter = [load.preemptions_total for load in settled if load.preemptions_total is not None]
    preempted = counter[-1] - counter[0] if len(counter) >= 2 else 0.0
    expected = max(len(window.replies), limit)  # replies in a turnover at least
    if preempted < 3 or preempted <= tuning.preemption_rate * expected:
        return None
    kv = Window.mean([load.kv_usage for load in scrapes])
    full = f", KV cache {kv:.0%} used" if kv is not None else ""
    replies = len(window.replies)
    return (
        limit - max(1, round(limit * tuning.min_step)),
        f"the server preempted {preempted:.0f} requests in {replies} replies at {limit}{full}",
        False,
    )


def latency_signal(window: Window, limit: int, timeout_s: float, tuning: Tuning) -> Signal | None:
    """p90 latency above ``latency_share`` of the timeout (a timeout is a reply that took all of it): back
    off in proportion, to 0.8 of that share."""
    allowed, p90 = tuning.latency_share * timeout_s, window.p90_latency
    if p90 <= allowed:
        return None
    timeouts = sum(seconds >= timeout_s for _, seconds in window.replies)
    timed_out = f", {timeouts} of {len(window.replies)} replies timed out" if timeouts else ""
    return (
        math.floor(limit * 0.8 * allowed / p90),
        f"p90 latency {p90:.0f} s at {limit} is above {tuning.latency_share:.0%} "
        f"of the {timeout_s:.0f} s timeout{timed_out}",
        False,
    )


def aim_up(knee: KneeSearch, window: Window, load: ServerLoad | None, tuning: Tuning) -> str:
    """What ``/metrics`` say about the next step up from the best level (the window's). Near a full KV
    cache: one step to where it would be full, then small ones. With room (nothing waiting): faster
    steps while they pay well, but no further than the KV wall (``kv_fill`` of the cache at the KV
    each running request uses now), and first to a ``descent`` below it: a peak of throughput may
    lie below the wall, and it costs less to look from there."""
    kv = window.mean([scrape.kv_usage for scrape in window.scrapes])
    if kv is not None and kv >= tuning.kv_high:  # collapse is near: approach it in small steps
        running = window.mean([scrape.running for scrape in window.scrapes]) or 0.0
        full = running / kv
        knee.reach_up = max(knee.smallest, min(knee.reach_up, math.log(full / knee.best)))
        return f" (KV cache {kv:.0%} used: full at ~{full:.0f})"
    if load is None or not load.running or not load.kv_usage or load.waiting is None or load.waiting > 0:
        return ""
    if knee.reach_up >= knee.largest:
        knee.reach_up = max(knee.reach_up, math.log(tuning.sprint))
    wall = tuning.kv_fill * load.running / load.kv_usage
    aim = wall / tuning.descent if knee.best * tuning.descent**2 <= wall else wall
    if math.log(aim / knee.best) >= knee.reach_up:
        return ""
    knee.reach_up = max(knee.smallest, math.log(aim / knee.best))
    return f" (KV cache {load.kv_usage:.0%} used by {load.running:.0f} requests: room for ~{wall:.0f})"


def room(
    window: Window, limit: int, cap: int, timeout_s: float, tuning: Tuning
) -> tuple[int, int, str] | None:
    """The opening's jump while the last scrape shows the server running everything sent (0.9 of the
    limit at least), nothing waiting and its KV cache far from full: the level to jump to (``sprint`` x,
    more while the replies' latency leaves room under the timeout), the top it aims below (the KV wall
    at ``kv_fill`` of the cache at the KV each running request uses now, or ``cap``) and why; None when
    the scrape does not show room."""
    load = window.scrapes[-1]
    if load.waiting is None or load.waiting > 0 or not load.running or not load.kv_usage:
        return None
    if load.running < 0.9 * limit:
        return None  # not all sent yet, or another client's requests: nothing to conclude
    wall = math.floor(tuning.kv_fill * load.running / load.kv_usage)
    top = min(wall, cap)  # the first window measures below it: a peak of throughput may lie below
    # A server that runs fewer than it admits queues the rest: their latency grows by the jump's factor,
    # which must keep replies well within the timeout (sprint x while no reply tells the latency).
    factor = max(tuning.sprint, tuning.latency_share * timeout_s / window.mean_latency)
    target = min(math.floor(limit * factor), math.floor(top / tuning.descent))
    reason = (
        f"the server runs all {load.running:.0f} with nothing waiting, KV cache {load.kv_usage:.0%} used "
        f"(room for ~{wall}): jumping to {target}"
    )
    return target, top, reason
