"""The answer breaker: a server that answers, but whose answers never validate, must not burn the
backlog.

A misconfigured reasoning parser, a wrong chat template or another model behind the URL answers every
request quickly and politely; each record then fails after all its re-asks, and a night marks a
123,849-record backlog failed. The router's count of server-side failures in a row
(``retry.abort_after_consecutive_failures``) never sees it: these are answers, not HTTP errors.

So the run judges the records the server answered (each by the answer it ended with, after the retry
policy re-asked), in a window of the last :data:`WINDOW`:

* valid: a result;
* invalid: a failure of an answer class (:data:`pipeline.errors.ANSWER_FAILURE_CLASSES`: invalid JSON,
  schema-invalid, empty, truncated);
* not judged: transient and permanent failures (the server's, counted by the router), ``too_long``
  (never sent), and records that failed on their answers in an earlier run (``--retry-failed`` and
  ``--only-failed`` ask for them again knowing they may fail again: a false alarm otherwise, that would
  keep them retryable and stop every later run on them).

It trips when the window is full and (a) every record in it failed, or (b) its valid share collapsed
against the run before it: under :data:`COLLAPSE_RATIO` of the run's share, and so far under it that a
window this bad would come by chance less than once in :data:`CHANCE` windows at the run's own rate
(so a run that was always poor is not a collapse, and 5-25% bad records never trip it). The run then
stops (exit 3) with one line: the classes, and one answer, shortened. The records that failed inside
the window, and those finishing while the run stops, are kept retryable (class ``transient``, see
:attr:`AnswerBreaker.kept_retryable`): the failure row keeps the evidence (the raw answer, the tokens
spent) and ``pipeline failures`` shows it, while a plain ``pipeline run`` does them again once the server
is fixed.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Set

from pipeline.errors import ANSWER_FAILURE_CLASSES, AnswersRejectedError
from pipeline.extraction.outcomes import Extracted, Failed, Outcome
from pipeline.source.reader import RecordId

#: Records in the window. At c=32 against a server whose every answer fails, the run stops after the
#: first 32 records (3 requests each with the default re-asks): about 100 requests, not the backlog.
WINDOW = 32
#: A collapse: the window's valid share under this fraction of the run's share before it...
COLLAPSE_RATIO = 0.5
#: ... and a window that bad less likely than this at the run's own rate.
CHANCE = 1e-9
#: Records judged before the window that make a "run so far" to compare with.
MIN_HISTORY = WINDOW
SHOWN_ANSWER_CHARS = 80

#: What the failure row of a record kept retryable says before its own message.
KEPT_NOTE = (
    "the run stopped: the server's answers stopped validating (see the run's message); kept for a "
    "plain `pipeline run` once the server is fixed; was "
)


class AnswerBreaker:
    """Fed every record's outcome (in the order they finish); says when to stop the run."""

    def __init__(self, window: int = WINDOW, failed_before: Set[RecordId] = frozenset()) -> None:
        self._window: deque[Outcome] = deque(maxlen=window)
        self._failed_before = failed_before
        self._size = window
        self._valid_before = 0  # judged records that left the window: the run so far
        self._judged_before = 0
        self.tripped: AnswersRejectedError | None = None
        self._kept: list[RecordId] = []  # after the trip: every answer failure stays retryable

    def observe(self, outcome: Outcome) -> AnswersRejectedError | None:
        """Judge one record's outcome; the error when this one trips the breaker (only the first time)."""
        if not _judged(outcome) or outcome.record_id in self._failed_before:
            return None
        if self.tripped is not None:
            if isinstance(outcome, Failed):
                self._kept.append(outcome.record_id)
            return None
        if len(self._window) == self._size:
            self._valid_before += isinstance(self._window[0], Extracted)
            self._judged_before += 1
        self._window.append(outcome)
        if len(self._window) < self._size:
            return None
        self.tripped = self._verdict()
        if self.tripped is not None:
            self._kept = [o.record_id for o in self._window if isinstance(o, Failed)]
        return self.tripped

    @property
    def kept_retryable(self) -> list[RecordId]:
        """The records failed inside the tripped window and after it: not failures of their own."""
        return list(self._kept)

    def _verdict(self) -> AnswersRejectedError | None:
        valid = sum(isinstance(outcome, Extracted) for outcome in self._window)
        if valid == 0:
            return self._error(f"the last {self._size} records all failed")
        if self._judged_before < MIN_HISTORY:
            return None
        # Laplace's estimate: a run with no failure so far is not taken for one that cannot fail.
        rate = (self._valid_before + 1) / (self._judged_before + 2)
        if valid / self._size >= COLLAPSE_RATIO * rate or _at_most(valid, self._size, rate) >= CHANCE:
            return None
        return self._error(
            f"{valid} of the last {self._size} records valid, against {rate:.0%} of the "
            f"{self._judged_before:,} before them"
        )

    def _error(self, what: str) -> AnswersRejectedError:
        failures = [outcome for outcome in self._window if isinstance(outcome, Failed)]
        classes = Counter(str(failure.failure_class) for failure in failures)
        named = ", ".join(f"{name} {count}" for name, count in sorted(classes.items()))
        shown = failures[-1]
        return AnswersRejectedError(
            f"the server answers, but its answers stopped validating: {what} ({named}); one answer: "
            f"{_shortened(shown.last_raw_output)} ({shown.failure_class}: {shown.message}). Stopped "
            "before the backlog is marked failed (a wrong chat template, reasoning parser or model?): "
            "the records that failed here stay retryable, and once the server is fixed a plain "
            "`pipeline run` does them"
        )


def _judged(outcome: Outcome) -> bool:
    if isinstance(outcome, Failed):
        return outcome.failure_class in ANSWER_FAILURE_CLASSES
    return True


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
