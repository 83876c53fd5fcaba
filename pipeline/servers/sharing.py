"""Where `concurrency: auto` starts on a server that says how large its KV cache is, and how several jobs
share one server: the requests of this job that fit at once (:class:`~pipeline.servers.capacity.RequestFit`,
the one place that counts them) and this job's share of them while others' requests run there
(:func:`server_share`).

**What a request holds before any reply**: its prompt at the fixed part as the server counts it
(``/tokenize``; its full blocks held once when prefix caching is on) and an answer of the job's
``max_tokens``, the most it may take, as the run's preflight counts it. An answer is usually far
shorter, so the count is low on that side; the record's own text is not in it yet, so with long records
it is high on the other (the server's queue and preemptions back the limit off at once). Once replies
come (the first window), the fit is counted again, by the same arithmetic, at their mean prompt and
completion tokens as the server counted them (``usage``): the record's text, the schema's tokens and the
answer as they are.

**Jobs on other machines** sharing the server (the `auto` jobs of one machine share one limit, and
are one job here: :mod:`~pipeline.servers.slot_pool`): each reads the server's
``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` at every scrape; what it does not have in
flight itself is another job's, taken, one job holding what this one does not. What they share is what
the server holds at once: the fit, or fewer when it runs fewer and queues the rest (:class:`BatchCap`:
its ``--max-num-seqs``, or what its KV cache admits). A job's share is what the others leave of it, or
if more its part in proportion to what it holds; a job holding more than the others is held to
:data:`FAIR` more than them, so the job holding fewer sets the pace. The share is a ceiling (a limit
above it drops to it at once, after :data:`SCRAPES` scrapes that show the others, each counted against
this job's most in flight since the one before: a scrape lags the client's count, and a limit moves
only when its share is :data:`SHARE_MOVES` away). Within it each job searches on as alone, but judges a
level by the server's throughput at the server's level (its own and the others'), the one curve all
share: its own throughput would rise with its part of a server past its best level, so every job would
hold on to its share of the fit. A job its share held follows the others up as far as they hold, no
further (two that followed each other past it would ratchet each other up to the fit); one whose
search went below its share stays there. A share, and a server signal's back-off, is never below what
the others count as a job (:func:`least_share`: fewer in flight are taken for the noise between a
scrape and a count, and a job the others cannot see would never be given way to), and a queue is this
job's only in proportion to its part of the requests there. Beside others the fit is counted again at
the replies' tokens after :data:`REFIT_REPLIES` of them (every job's share must be of the same fit),
and while the KV cache has room a job waits up to :data:`FIT_SCRAPES` scrapes for them before it takes
a share of the fit it began with. A job's steps beside others are of the server's level (4% of its own,
half the server, would move it 2%, a gain under the windows' noise).
When :data:`RELEASE_SCRAPES` scrapes in a row show no other job's requests, the job goes back at once
to the level it measured alone (else to what the server holds). A job that starts while others run
starts at its part of what the server runs (:func:`joining_share`: half), so that they see it and give
way. A run that ends beside others leaves the next night the level it measured alone, or the server's
level it found with the others, not its share. A server without ``/metrics`` or its KV cache gives no
share. A router in front of the server is how jobs of several machines share it as one client.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.servers.capacity import RequestFit
from pipeline.servers.window import DEFAULT_TUNING, ServerLoad

#: Requests on the server not in this job's count that are still this job's: those that finished or were
#: sent between the scrape and the count. Fewer "others" than this (or this share of the fit) are none.
NOISE = 3
NOISE_SHARE = 0.05
#: A job holding more than the others is held to this much more than them: the one holding fewer sets the
#: pace (each job's search is of the server's throughput, to which it is indifferent which job holds
#: what), and the other follows it down and up.
FAIR = 0.2
#: A limit moves to its share only when that is this much away: each move starts the job's search again.
SHARE_MOVES = 0.1
#: Scrapes that must all show other jobs' requests: one is a blip.
SCRAPES = 2
#: Scrapes in a row that must show no other job's requests before a job takes the server back: this job's
#: own count runs ahead of the server's right after its limit rose, hiding the others for a scrape or two.
RELEASE_SCRAPES = 4
#: Replies after which a job beside others counts its fit again at their tokens (alone: its first window).
REFIT_REPLIES = 8
#: Scrapes a job beside others waits for those replies before it takes a share of the fit as first counted.
FIT_SCRAPES = 10


def others_in_flight(load: ServerLoad, own_in_flight: int) -> float | None:
    """Requests on the server (running and waiting) that are not this job's; None when it does not say."""
    if load.running is None:
        return None
    return max(0.0, load.running + (load.waiting or 0.0) - own_in_flight)


@dataclass(frozen=True, slots=True)
class Others:
    """The other jobs' requests on the server as one job sees them at a scrape."""

    requests: float  # running and waiting there, not this job's: one other job's, for all it can tell

    @property
    def words(self) -> str:
        return f"{self.requests:.0f} other requests"


def server_share(fit: int, own_in_flight: int, load: ServerLoad) -> tuple[int, Others] | None:
    """This job's share of a server whose KV cache holds ``fit`` of its requests (the module docstring
    says the rule) and the others as it sees them; None when no other job's request is there (or the
    server does not say)."""
    requests = others_in_flight(load, own_in_flight)
    if requests is None or requests < visible(fit):
        return None  # a scrape and the client's count differ by the replies between them
    # What the others leave, and at least this job's part of the fit in proportion to what it holds
    # (jobs that started together at the fit scale down together, not each to nothing)
    share = max(fit - requests, math.ceil(fit * own_in_flight / (own_in_flight + requests)))
    if own_in_flight > requests:  # give way: no more than the others hold, and a little
        share = min(share, math.ceil(requests * (1 + FAIR)))
    return max(math.floor(share), least_share(fit)), Others(requests)


def least_share(fit: int) -> int:
    """The fewest a job beside others holds on a server where ``fit`` of its requests fit: never so few
    that the others take its requests for noise (they would never give way), nor more than half."""
    return max(1, min(visible(fit), math.ceil(fit / 2)))


def visible(fit: int) -> int:
    """The fewest requests other jobs on a server where ``fit`` of theirs fit count as a job's."""
    return math.ceil(max(NOISE, NOISE_SHARE * fit))


def joining_share(fit: int, load: ServerLoad | None) -> int | None:
    """Where a job starts on a server where ``fit`` of its requests fit and other jobs' requests already
    run (``load``, read before its first request): its half of what the server runs now (the other's
    level is the best it found; it sees this job and gives way, and a server doing better with more is
    found by both searches). None when no other job's requests are there, or the server does not say."""
    others = others_in_flight(load, 0) if load is not None else None
    if others is None or others < visible(fit):
        return None
    # What runs now, not the fit as first counted: at max_tokens (this job's replies not in yet) the fit
    # may be a third of what the others' replies say, and its part would cut them to a fraction.
    runs = math.floor(load.running or others) if load is not None else 0
    return max(least_share(runs), math.ceil(runs / 2))


@dataclass(slots=True)
class BatchCap:
    """The most requests the server runs at once when it queues the rest (its ``--max-num-seqs``, or what
    its KV cache admits): the most running any scrape showed, as long as a scrape showed requests waiting
    beside that many running. Every job reads the same scrapes, so every job divides the same number;
    requests waiting while the server admits a burst a few a step are no cap (it runs more later)."""

    most_running: float = 0.0
    queued_at_most: bool = False
    last_running: float = 0.0  # the scrape before: more running now is a server still admitting

    def seen(self, load: ServerLoad) -> BatchCap:
        running, waiting = load.running or 0.0, load.waiting or 0.0
        admitting, self.last_running = running > self.last_running + NOISE, running
        if running > self.most_running + NOISE:
            self.most_running, self.queued_at_most = running, False
        if waiting >= NOISE and not admitting and running >= self.most_running - NOISE:
            self.most_running, self.queued_at_most = max(running, self.most_running), True
        return self

    def capacity(self, fit: int) -> int:
        """What the jobs share: the fit, or the batch cap when the server runs fewer at once."""
        if not self.queued_at_most or self.most_running < 1:
            return fit
        return max(1, min(fit, math.floor(self.most_running)))


def settled_share(
    fit: int, own_now: int, scrapes: Sequence[tuple[ServerLoad, int]]
) -> tuple[int, Others] | None:
    """This job's share and the others (:func:`server_share`) by the last :data:`SCRAPES` scrapes, each
    with this job's in flight when it came; None unless every one shows others. Each is counted against
    the more of this job's in flight then and now: a scrape lags the client's count, and a limit just
    lowered drains (fewer in flight now than the server still runs), which is no other job."""
    if len(scrapes) < SCRAPES:
        return None
    found = []
    for load, own_then in scrapes[-SCRAPES:]:
        share = server_share(fit, max(own_then, own_now), load)
        if share is None:
            return None
        found.append(share)
    return max(found, key=lambda share: share[0])


def alone(fit: int, scrapes: Sequence[tuple[ServerLoad, int]]) -> bool:
    """Whether none of the last :data:`RELEASE_SCRAPES` scrapes shows another job's requests, each
    against this job's in flight when it came (not now: a limit that just rose would hide the others)."""
    recent = scrapes[-RELEASE_SCRAPES:]
    return len(recent) == RELEASE_SCRAPES and all(
        server_share(fit, own_then, load) is None for load, own_then in recent
    )


def followed_up(share: int, others: Others) -> int:
    """How far a job its share held follows it up as the others' requests grow: to what they hold, no
    further (beyond, only its own search takes it, on the server's throughput: two jobs that each
    followed the other past it would ratchet each other up to the fit)."""
    return min(share, math.ceil(others.requests))


@dataclass(slots=True)
class ServerShare:
    """One job's view of a server others may use: the fit, its own in flight, the last scrapes, its share."""

    fit: RequestFit | None = None
    refined: bool = False  # the fit was counted again at a window's replies
    refit_taken: bool = False  # and the limit was given the chance to move there
    replied_tokens: tuple[int, int, int] = (0, 0, 0)  # replies, their prompt and answer tokens, until then
    share: int | None = None  # None: no other job's requests there (or nothing known)
    released: bool = False  # the others' requests were there and are gone (until the limit takes it)
    in_flight: int = 0  # this job's in flight at the last count
    own_peak: int = 0  # the most since the last scrape: the server counted at some moment since
    scrapes: list[tuple[ServerLoad, int]] = field(default_factory=list)  # with this job's in flight
    batch_cap: BatchCap = field(default_factory=BatchCap)
    scrape_count: int = 0
    # KV-cache use from which the server is full (the controller's ``kv_high``): a job takes its share at
    # once then, its fit counted again or not
    kv_full: float = DEFAULT_TUNING.kv_high

    def scraped(self, load: ServerLoad) -> None:
        self.scrape_count += 1
        self.scrapes = [*self.scrapes[1 - max(SCRAPES, RELEASE_SCRAPES) :], (load, self.own_peak)]
        self.own_peak = self.in_flight
        self.batch_cap.seen(load)

    @property
    def holds_words(self) -> str:
        """What the jobs share, in words: "where 80 fit" or "that runs 8 at once (80 fit)"."""
        fit = self.fit.requests if self.fit is not None else None
        capacity = self.capacity
        if capacity is None or fit is None or capacity == fit:
            return f"where {fit} fit"
        return f"that runs {capacity} at once ({fit} fit)"

    @property
    def least(self) -> int | None:
        """The fewest a server signal backs this job off to (None: the server's size is not known): a
        queue beside others is theirs as much as this job's, and a job backed off below it would be
        invisible to them; alone, the server runs at least its capacity anyway."""
        capacity = self.capacity
        return None if capacity is None else least_share(capacity)

    @property
    def capacity(self) -> int | None:
        """What the jobs on the server share: the fit, or fewer when the server queues the rest."""
        return None if self.fit is None else self.batch_cap.capacity(self.fit.requests)

    def counted(self, in_flight: int) -> tuple[int, Others] | None:
        """This job's in flight now; its share and the others, when others are there."""
        own, self.in_flight = self.in_flight, in_flight
        self.own_peak = max(self.own_peak, in_flight)
        return self._settle(max(own, in_flight))

    def _settle(self, own: int) -> tuple[int, Others] | None:
        """The share while every recent scrape shows others; kept while some do, gone once none does.
        Beside others the fit is counted again at the replies' tokens as soon as a few came (each job's
        share must be of the same fit, and the first window may not come while shares move)."""
        if self.capacity is None:
            return None
        settled = settled_share(self.capacity, own, self.scrapes)
        if settled is not None and not self.refined and self.replied_tokens[0] >= REFIT_REPLIES:
            self._measure_fit()
            settled = settled_share(self.capacity, own, self.scrapes)
        if settled is not None and not self.refined and self.scrape_count < FIT_SCRAPES and self._kv_room():
            return None  # a share of a fit counted at max_tokens may be a third of the others' (theirs
            # measured): wait for this job's first replies, a few scrapes at most
        if settled is not None:
            self.share = settled[0]
        elif self.share is not None and alone(self.capacity, self.scrapes):
            self.share, self.released = None, True
        return settled

    def _kv_room(self) -> bool:
        """Whether the last scrape shows the KV cache with room (below ``kv_full``): the others hold
        more than this job's fit as first counted, and the server takes them; a full one is overloaded."""
        kv = self.scrapes[-1][0].kv_usage if self.scrapes else None
        return kv is not None and kv < self.kv_full

    def own_part(self, load: ServerLoad, limit: int) -> float:
        """This job's part of what a scrape shows on the server: 1 alone, less beside other jobs."""
        others = others_in_flight(load, self.own_peak)
        if others is None or others < max(NOISE, NOISE_SHARE * limit):
            return 1.0
        return self.own_peak / (self.own_peak + others)

    def replied(self, prompt_tokens: int, answer_tokens: int) -> None:
        """A reply's tokens as the server counted them, kept until the fit is counted again."""
        if self.fit is not None and not self.refined and answer_tokens > 0:
            replies, prompts, answers = self.replied_tokens
            self.replied_tokens = (replies + 1, prompts + prompt_tokens, answers + answer_tokens)

    def refine(self) -> RequestFit | None:
        """Once: the fit at the mean prompt and answer of the replies so far (None without any), also when
        it was counted again beside others before (the limit has not moved to it yet)."""
        if self.fit is None or self.refit_taken or not (self.refined or self.replied_tokens[0]):
            return None
        if not self.refined:
            self._measure_fit()
            self._settle(self.in_flight)
        self.refit_taken = True
        return self.fit

    def _measure_fit(self) -> None:
        replies, prompts, answers = self.replied_tokens
        if self.fit is not None and replies:
            self.refined = True
            self.fit = self.fit.measured(prompts / replies, answers / replies)
