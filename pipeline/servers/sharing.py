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

**Several jobs on one server** (several nightly jobs on one box, each with its own database): each job's
`auto` reads the server's ``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` at every scrape;
what it does not have in flight itself is another job's, taken. Its share is what fits less the
others' in flight, or if more, its part of the fit in proportion to what it holds (jobs that start
together at the fit scale down together to fill it, not each to nothing); and a job holding more than
all the others together is held to half the fit (no less than the others), so a job that came second
climbs to its half while the first gives way: two jobs meet at half the fit each, three or more never
let one hold more than the rest together. A share is never below what the others count as a job
(:func:`visible`: fewer in flight are taken for the noise between a scrape and a count, and a job the
others cannot see would never be given way to). The share bounds the search from above (a limit above it
drops to it at once, after :data:`SCRAPES` scrapes that show the others, each counted against this job's
most in flight since the one before: a scrape lags the client's count), and a limit held to its share
follows it up as the others give way; within it the search goes on as alone, and a queue on the server
is this job's only in proportion to its part of the requests there. Beside others the fit is counted
again at the replies' tokens after :data:`REFIT_REPLIES` of them (every job's share must be of the
same fit). When :data:`RELEASE_SCRAPES` scrapes in a row show no other job's requests, the job goes
back at once to the level it measured alone (else to its fit). A job that starts while others run
starts at its share (:func:`joining_share`: what they leave, at least half the fit, so that they see it
and give way) rather than at the fit; a third job does the same, and the two already there give way
until none holds more than the rest together.
Nothing is shared but the server's own counts: no file, no database, jobs of different machines and
databases coordinate alike. A server without ``/metrics`` or its KV cache gives no share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.servers.capacity import RequestFit
from pipeline.servers.knee_search import ServerLoad

#: Requests on the server not in this job's count that are still this job's: those that finished or were
#: sent between the scrape and the count. Fewer "others" than this (or this share of the fit) are none.
NOISE = 3
NOISE_SHARE = 0.05
#: Scrapes that must all show other jobs' requests: one is a blip.
SCRAPES = 2
#: Scrapes in a row that must show no other job's requests before a job takes the server back: this job's
#: own count runs ahead of the server's right after its limit rose, hiding the others for a scrape or two.
RELEASE_SCRAPES = 4
#: Replies after which a job beside others counts its fit again at their tokens (alone: its first window).
REFIT_REPLIES = 8


def others_in_flight(load: ServerLoad, own_in_flight: int) -> float | None:
    """Requests on the server (running and waiting) that are not this job's; None when it does not say."""
    if load.running is None:
        return None
    return max(0.0, load.running + (load.waiting or 0.0) - own_in_flight)


def server_share(fit: int, own_in_flight: int, load: ServerLoad) -> int | None:
    """This job's share of a server whose KV cache holds ``fit`` of its requests (the module docstring
    says the rule); None when no other job's request is there (or the server does not say)."""
    others = others_in_flight(load, own_in_flight)
    if others is None or others < visible(fit):
        return None  # a scrape and the client's count differ by the replies between them
    # What the others leave, and at least this job's part of the fit in proportion to what it holds
    # (jobs that started together at the fit scale down together, not each to nothing)
    share = max(fit - others, math.ceil(fit * own_in_flight / (own_in_flight + others)))
    if own_in_flight > others:  # give way: the others may climb to their half
        share = min(share, max(others, math.ceil(fit / 2)))
    # Never so few that the others take this job's requests for noise: they would never give way.
    return max(1, math.floor(share), min(visible(fit), math.ceil(fit / 2)))


def visible(fit: int) -> int:
    """The fewest requests other jobs on a server where ``fit`` of theirs fit count as a job's."""
    return math.ceil(max(NOISE, NOISE_SHARE * fit))


def joining_share(fit: int, load: ServerLoad) -> int | None:
    """Where a job starts on a server where ``fit`` of its requests fit and other jobs' requests already
    run (``load``, read before its first request): what they leave, and at least half the fit (the most
    a job holding more than all the others together keeps), so that they see it and give way; None when
    no other job's request is there."""
    others = others_in_flight(load, 0)
    if others is None or others < visible(fit):
        return None
    return max(1, min(fit, max(fit - math.ceil(others), math.ceil(fit / 2))))


def settled_share(
    fit: int, own_now: int, scrapes: Sequence[tuple[ServerLoad, int]]
) -> tuple[int, float] | None:
    """This job's share and the others' requests by the last :data:`SCRAPES` scrapes, each with this
    job's in flight when it came; None unless every one shows others. Each is counted against the more
    of this job's in flight then and now: a scrape lags the client's count, and a limit just lowered
    drains (fewer in flight now than the server still runs), which is no other job."""
    if len(scrapes) < SCRAPES:
        return None
    found = []
    for load, own_then in scrapes[-SCRAPES:]:
        own = max(own_then, own_now)
        share = server_share(fit, own, load)
        if share is None:
            return None
        found.append((share, others_in_flight(load, own) or 0.0))
    return max(found)


def alone(fit: int, own_now: int, scrapes: Sequence[tuple[ServerLoad, int]]) -> bool:
    """Whether none of the last :data:`RELEASE_SCRAPES` scrapes shows another job's requests."""
    recent = scrapes[-RELEASE_SCRAPES:]
    return len(recent) == RELEASE_SCRAPES and all(
        server_share(fit, max(own_then, own_now), load) is None for load, own_then in recent
    )


@dataclass(slots=True)
class ServerShare:
    """One job's view of a server others may use: the fit, its own in flight, the last scrapes, its share."""

    fit: RequestFit | None = None
    refined: bool = False  # the fit was counted again at a window's replies
    replied_tokens: tuple[int, int, int] = (0, 0, 0)  # replies, their prompt and answer tokens, until then
    share: int | None = None  # None: no other job's requests there (or nothing known)
    released: bool = False  # the others' requests were there and are gone (until the limit takes it)
    in_flight: int = 0  # this job's in flight at the last count
    own_peak: int = 0  # the most since the last scrape: the server counted at some moment since
    scrapes: list[tuple[ServerLoad, int]] = field(default_factory=list)  # with this job's in flight

    def scraped(self, load: ServerLoad) -> None:
        self.scrapes = [*self.scrapes[1 - max(SCRAPES, RELEASE_SCRAPES) :], (load, self.own_peak)]
        self.own_peak = self.in_flight

    def counted(self, in_flight: int) -> tuple[int, float] | None:
        """This job's in flight now; its share and the others' requests, when others are there."""
        own, self.in_flight = self.in_flight, in_flight
        self.own_peak = max(self.own_peak, in_flight)
        return self._settle(max(own, in_flight))

    def _settle(self, own: int) -> tuple[int, float] | None:
        """The share while every recent scrape shows others; kept while some do, gone once none does.
        Beside others the fit is counted again at the replies' tokens as soon as a few came (each job's
        share must be of the same fit, and the first window may not come while shares move)."""
        if self.fit is None:
            return None
        settled = settled_share(self.fit.requests, own, self.scrapes)
        if settled is not None and not self.refined and self.replied_tokens[0] >= REFIT_REPLIES:
            self._measure_fit()
            settled = settled_share(self.fit.requests, own, self.scrapes)
        if settled is not None:
            self.share = settled[0]
        elif self.share is not None and alone(self.fit.requests, own, self.scrapes):
            self.share, self.released = None, True
        return settled

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
        """Once: the fit at the mean prompt and answer of the replies so far (None without any)."""
        if self.fit is None or self.refined or not self.replied_tokens[0]:
            return None
        self._measure_fit()
        self._settle(self.in_flight)
        return self.fit

    def _measure_fit(self) -> None:
        replies, prompts, answers = self.replied_tokens
        if self.fit is not None and replies:
            self.refined = True
            self.fit = self.fit.measured(prompts / replies, answers / replies)
