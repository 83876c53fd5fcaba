"""The answer breaker: a server that answers, but whose answers never validate, must not burn the
backlog.

A misconfigured reasoning parser, a wrong chat template or another model behind the URL answers every
request quickly and politely; each record then fails after all its re-asks, and a night marks a
123,849-record backlog failed. The router's count of server-side failures in a row
(``retry.abort_after_consecutive_failures``) never sees it: these are answers, not HTTP errors.

So the run judges the records the server answered, each by the answer it ended with (after the retry
policy re-asked):

* valid: a result;
* invalid: a failure of an answer class (:data:`pipeline.errors.ANSWER_FAILURE_CLASSES`: invalid JSON,
  schema-invalid, empty, truncated);
* not judged: transient and permanent failures (the server's, counted by the router), ``too_long``
  (never sent, or cut by the pipeline's own budget), and records that failed on their answers in an
  earlier run (``--retry-failed`` and ``--only-failed`` ask for them again knowing they may fail again:
  a false alarm otherwise, that would keep them retryable and stop every later run on them).

The records are judged **in the order they were sent**, not the order they finish. With most of a
run in flight at once, the records valid on their first answer finish first and those on their second
and third attempt finish last, so in finishing order the tail of every run (and the whole of a run
smaller than its concurrency) looks like a collapse. A record that finishes before those sent ahead of
it waits (:attr:`AnswerBreaker.waiting`) until they have finished; a window is then a run of
consecutive records as they were sent, whose mix of valid and failed does not depend on latency.

It trips when (a) the first :data:`WINDOW` judged records to finish all failed, none valid before them
(whatever the order: a run that has made nothing valid yet says so, a healthy one never does), or a
window of :data:`WINDOW` judged records is full and (b) every record in it failed, or (c) its valid
share collapsed against the records sent before it: under :data:`COLLAPSE_RATIO` of
their share, and so far under it that a window this bad would come by chance less than once in
:data:`CHANCE` windows at their rate (so a run that was always poor is not a collapse, and 5-25% bad
records never trip it). The run then stops (exit 3) with one line: which records were compared with
which, the classes, and one answer, shortened. The records that failed inside the window, those that
finished out of turn after it, and those finishing while the run stops, are kept retryable (class
``transient``, see :attr:`AnswerBreaker.kept_retryable`): the failure row keeps the evidence (the raw
answer, the tokens spent) and ``pipeline failures`` shows it, while a plain ``pipeline run`` does them
again once the server is fixed.

How soon it stops a server whose every answer is garbage: when the first :data:`WINDOW` records to
finish have failed all their attempts. With concurrency ``c``, the other requests in flight are then
on their own attempts, so the run sends at most about ``attempts * (WINDOW + c)`` requests (3 attempts
by default: 192 at c=32, 864 at c=256), never the backlog.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence, Set
from dataclasses import dataclass

from pipeline.errors import ANSWER_FAILURE_CLASSES, AnswersRejectedError
from pipeline.extraction.outcomes import Failed, Outcome
from pipeline.source.reader import RecordId

#: Records in the window. At c=32 against a server whose every answer fails, the run stops once the
#: first 32 records sent have failed (3 requests each with the default re-asks).
WINDOW = 32
#: A collapse: the window's valid share under this fraction of the share before it...
COLLAPSE_RATIO = 0.5
#: ... and a window that bad less likely than this at that rate.
CHANCE = 1e-9
#: Records judged before the window that make a "run so far" to compare with.
MIN_HISTORY = WINDOW
SHOWN_ANSWER_CHARS = 80

#: What the failure row of a record kept retryable says before its own message.
KEPT_NOTE = (
    "the run stopped: the server's answers stopped validating (see the run's message); kept for a "
    "plain run once the server is fixed; was "
)


@dataclass(frozen=True, slots=True)
class _Judged:
    """One judged record: its place in the sending order (1-based) and, if it failed, the failure."""

    turn: int
    failure: Failed | None


class AnswerBreaker:
    """Told each record as it is sent (:meth:`sent`) and its outcome as it finishes (:meth:`observe`);
    judges them in the order they were sent and says when to stop the run."""

    def __init__(
        self, window: int = WINDOW, failed_before: Set[RecordId] = frozenset(), plain_run: str | None = None
    ) -> None:
        self._size = window
        self._plain_run = plain_run  # the command its stop names: the run's, without its selection
        self._failed_before = failed_before
        self._turns = 0  # records sent so far
        self._next = 1  # the turn judged next
        self._waiting: dict[int, _Judged | None] = {}  # finished before their turn (None: not judged)
        self._window: deque[_Judged] = deque(maxlen=window)
        self._valid_before = 0  # judged records sent before the window: the run so far
        self._judged_before = 0
        self._valid_yet = False  # whether any judged record finished valid
        self._failed_first: list[Failed] = []  # until one is valid: every judged failure, as they finish
        self.tripped: AnswersRejectedError | None = None
        self._kept: list[RecordId] = []  # after the trip: every answer failure stays retryable

    def sent(self) -> int:
        """A record is being sent: its turn, to give back with its outcome."""
        self._turns += 1
        return self._turns

    @property
    def waiting(self) -> int:
        """Records that finished before the records sent ahead of them: judged once those have."""
        return len(self._waiting)

    def observe(self, turn: int, outcome: Outcome) -> AnswersRejectedError | None:
        """Judge the outcome of the record sent at ``turn`` (and any that waited for it); the error when
        this trips the breaker (only the first time)."""
        judged = self._judged(turn, outcome)
        if self.tripped is not None:
            if judged is not None and judged.failure is not None:
                self._kept.append(judged.failure.record_id)
            return None
        if judged is not None and not self._valid_yet:
            self._note_first(judged)
            if self.tripped is not None:
                return self.tripped
        self._waiting[turn] = judged
        while self.tripped is None and self._next in self._waiting:
            ready = self._waiting.pop(self._next)
            self._next += 1
            if ready is not None:
                self.tripped = self._judge(ready)
        if self.tripped is None:
            return None
        pending = [entry for entry in self._waiting.values() if entry is not None]
        self._waiting.clear()
        self._kept = [entry.failure.record_id for entry in (*self._window, *pending) if entry.failure]
        return self.tripped

    @property
    def kept_retryable(self) -> list[RecordId]:
        """The records failed inside the tripped window and after it: not failures of their own."""
        return list(self._kept)

    def _judged(self, turn: int, outcome: Outcome) -> _Judged | None:
        if outcome.record_id in self._failed_before:
            return None
        if isinstance(outcome, Failed):
            return _Judged(turn, outcome) if outcome.failure_class in ANSWER_FAILURE_CLASSES else None
        return _Judged(turn, None)

    def _note_first(self, judged: _Judged) -> None:
        """Until a record is valid: whether the first :data:`WINDOW` to finish all failed (the order
        they finish in says nothing when none is valid: the trip comes as soon as they have)."""
        if judged.failure is None:
            self._valid_yet = True
            self._failed_first.clear()
            return
        self._failed_first.append(judged.failure)
        if len(self._failed_first) < self._size:
            return
        what = f"the first {self._size} records to finish all failed after their re-asks, none valid"
        self.tripped = self._error(what, self._failed_first)
        self._waiting.clear()
        self._kept = [failure.record_id for failure in self._failed_first]

    def _judge(self, judged: _Judged) -> AnswersRejectedError | None:
        if len(self._window) == self._size:
            self._valid_before += self._window[0].failure is None
            self._judged_before += 1
        self._window.append(judged)
        if len(self._window) < self._size:
            return None
        return self._verdict()

    def _verdict(self) -> AnswersRejectedError | None:
        valid = sum(entry.failure is None for entry in self._window)
        compared = self._compared()
        if valid == 0:
            return self._error(f"{compared} all failed after their re-asks")
        if self._judged_before < MIN_HISTORY:
            return None
        # Laplace's estimate: a run with no failure so far is not taken for one that cannot fail.
        rate = (self._valid_before + 1) / (self._judged_before + 2)
        if valid / self._size >= COLLAPSE_RATIO * rate or _at_most(valid, self._size, rate) >= CHANCE:
            return None
        return self._error(
            f"{valid} of {compared} valid after their re-asks, against {rate:.0%} of the "
            f"{self._judged_before:,} judged records sent before them"
        )

    def _compared(self) -> str:
        """Which records the window holds, by their place in the sending order."""
        first, last = self._window[0].turn, self._window[-1].turn
        among = "" if last - first + 1 == self._size else f" ({self._size} of them judged)"
        return f"records #{first:,}-#{last:,} in the order they were sent{among}"

    def _error(self, what: str, failures: Sequence[Failed] | None = None) -> AnswersRejectedError:
        """The stop's one line, of ``failures`` (the window's, unless given)."""
        if failures is None:
            failures = [entry.failure for entry in self._window if entry.failure is not None]
        classes = Counter(str(failure.failure_class) for failure in failures)
        named = ", ".join(f"{name} {count}" for name, count in sorted(classes.items()))
        shown = failures[-1]
        return AnswersRejectedError(
            f"the server answers, but its answers stopped validating: {what} ({named}); one answer: "
            f"{_shortened(shown.last_raw_output)} ({shown.failure_class}: {shown.message}). Stopped "
            "before the backlog is marked failed (a wrong chat template, reasoning parser or model?): "
            f"the records that failed here stay retryable, and once the server is fixed a plain run"
            f"{f' (`{self._plain_run}`)' if self._plain_run else ''} does them"
        )


def _at_most(successes: int, trials: int, rate: float) -> float:
    """The chance of at most ``successes`` in ``trials`` at ``rate`` (the binomial distribution)."""
    return sum(math.comb(trials, k) * rate**k * (1 - rate) ** (trials - k) for k in range(successes + 1))


def _shortened(raw: str | None) -> str:
    """The answer on one line, cut short: enough to recognise a template or parser gone wrong."""
    if not raw or not raw.strip():
        return "(no content)"
    text = " ".join(raw.split())
    if len(text) > SHOWN_ANSWER_CHARS:
        text = text[:SHOWN_ANSWER_CHARS] + "…"
    return repr(text)
