"""What a run learns from the server's own numbers, shared by all its requests: how many tokens the
server counts for what the pipeline estimates, and how many tokens its answers take.

* The rate. Every reply names its prompt's tokens (``usage.prompt_tokens``), and so do vLLM's 400 for
  a request past the context and ``POST /tokenize``: each such count, divided by the pipeline's
  estimate of the same messages (:func:`pipeline.extraction.budget.estimated_tokens`), is one rate.
  The estimate errs towards more tokens (the server's ~3.7-4 characters a token against its 3 bytes),
  so behind a proxy that cannot count, a prompt 1,000 tokens short of a small context would be
  estimated past it: later prompts are estimated at the run's learned rate instead, the rate of all
  but the densest :data:`DENSEST_SHARE` of the prompts counted (the others are over-, not
  under-estimated), and :data:`RATE_MARGIN` more. The fixed part (system prompt, examples, the chat
  template) is most of a short record's prompt and the same in every one, so the rate learned on the
  first answer holds for the next.
* What an answer needs: what all but the shortest :data:`SHORTEST_SHARE` of the run's answers took
  (their completion tokens, reasoning included; answers that passed validation), once
  :data:`ANSWERS_TO_MEASURE` are in; until then the fewest tokens an answer of the schema can be
  (:func:`fewest_answer_tokens`). A budget the context cuts below that is not sent
  (:func:`pipeline.extraction.budget.fitted`): hardly any answer would fit it. One above it may not
  hold this record's answer either, but it may: it is sent, and an answer cut off is ``too_long``.
  A run starts from the answers of the variant's latest results (the run reads them once from its
  database): a ``--only-failed`` run of a few records the context barely holds knows from its first
  request what an answer takes, not only the schema's floor; and a record whose answer an earlier run
  saw cut off with all the room the context left needs more than that.

Both keep the run's latest :data:`LEARNED_WINDOW` values. A request whose budget only the estimate
cuts waits, while nothing is learned, for a request in flight to teach the rate
(:meth:`Calibration.wait_to_learn`), so a run's first records do not each ask the server the same thing,
nor go with a budget the plain estimate cut far below what the context leaves.
Only budgets use what is learned: the chunk planner keeps the plain estimate, since whether a record is
split changes what is sent, which must not depend on how much the run had learned when the record came.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
from pydantic import BaseModel

#: How many of the run's latest rates and answers are learned from.
LEARNED_WINDOW = 1000
#: The learned rate is that of all but the densest of the prompts counted (nearest rank)...
DENSEST_SHARE = 0.05
#: Added to the learned rate: a prompt longer than those counted may be a little denser (the chat
#: template's tokens weigh less in it), and a prompt under-estimated costs a 400 and a retry.
RATE_MARGIN = 0.02
#: ... and what an answer needs, what all but the shortest answers took.
SHORTEST_SHARE = 0.01
#: How many answers are measured before their size is what an answer needs.
ANSWERS_TO_MEASURE = 10


@dataclass(frozen=True, slots=True)
class AnswerNeed:
    """The fewest tokens a budget cut to fit the context may have and still be sent, and why."""

    tokens: int
    why: str

    def __str__(self) -> str:
        return f"{self.tokens:,} tokens ({self.why})"


def fewest_answer_tokens(schema: type[BaseModel]) -> int:
    """The fewest tokens an answer of ``schema`` can be: its braces, and a name and a value for each
    required field (a token each at least: a tokenizer does not merge a key, its quotes and its value
    into one token)."""
    required = sum(1 for field in schema.model_fields.values() if field.is_required())
    return 1 + 2 * required


class _Window:
    """The latest :data:`LEARNED_WINDOW` values and where a share of them lies, sorted again only after
    a change (it is read for every request)."""

    def __init__(self) -> None:
        self._values: deque[float] = deque(maxlen=LEARNED_WINDOW)
        self._sorted: list[float] | None = None

    def __len__(self) -> int:
        return len(self._values)

    def add(self, value: float) -> None:
        self._values.append(value)
        self._sorted = None

    def at(self, share: float) -> float:
        """The value ``share`` of them are at most (nearest rank)."""
        if self._sorted is None:
            self._sorted = sorted(self._values)
        return self._sorted[max(0, math.ceil(share * len(self._sorted)) - 1)]


class Calibration:
    """The run's learned rate of server tokens to estimated ones, and its answers' sizes (one per run:
    the extractor's). ``fewest_answer``: what an answer needs until answers are measured
    (:func:`fewest_answer_tokens`); ``answered_before``: the completion tokens of earlier runs' answers,
    oldest first, measured as this run's are (the run's own push them out of the window, oldest first)."""

    def __init__(self, fewest_answer: int = 1, answered_before: Sequence[int] = ()) -> None:
        self._fewest_answer = fewest_answer
        self._rates = _Window()
        self._answers = _Window()
        for tokens in answered_before[-LEARNED_WINDOW:]:
            if tokens > 0:
                self._answers.add(tokens)
        self._before = len(self._answers)
        self._answered = 0  # this run's
        self._in_flight = 0
        self._changed: anyio.Event | None = None  # made when first waited on (within the event loop)

    @property
    def learned(self) -> bool:
        return len(self._rates) > 0

    def counted(self, estimate: int, tokens: int | None) -> None:
        """The server counted ``tokens`` for messages the pipeline estimated at ``estimate``."""
        if tokens and estimate > 0:
            self._rates.add(tokens / estimate)
            self._notify()

    def scaled(self, estimate: int) -> int:
        """An estimate at the learned rate (as it is, before anything is learned)."""
        if not self._rates:
            return estimate
        return math.ceil(estimate * self._rates.at(1 - DENSEST_SHARE) * (1 + RATE_MARGIN))

    def answered(self, completion_tokens: int | None) -> None:
        """An answer that passed validation took ``completion_tokens`` (its reasoning included)."""
        if completion_tokens:
            self._answers.add(completion_tokens)
            self._answered += 1

    def answer_need(self, max_tokens: int, cut_before: int | None = None) -> AnswerNeed:
        """What an answer needs, never more than the job's budget ``max_tokens``; for a record whose
        answer an earlier run saw cut off at ``cut_before`` tokens (all the context left it), more than
        that, if more than the run's answers need."""
        need = self._run_need(max_tokens)
        if cut_before is not None and need.tokens <= cut_before < max_tokens:
            why = f"its answer was cut off at {cut_before:,} tokens in an earlier run"
            return AnswerNeed(cut_before + 1, why)
        return need

    def _run_need(self, max_tokens: int) -> AnswerNeed:
        if len(self._answers) >= ANSWERS_TO_MEASURE:
            tokens = math.ceil(self._answers.at(SHORTEST_SHARE))
            measured = len(self._answers)
            why = f"what {1 - SHORTEST_SHARE:.0%} of the {measured:,} answers measured took at least"
            before = min(self._before, LEARNED_WINDOW - self._answered)  # the run's own pushed out the rest
            if before > 0:
                why += f", {'all' if before == measured else f'{before:,}'} of them by earlier runs"
        else:
            tokens = self._fewest_answer
            why = (
                f"the fewest an answer of the schema can be, until {ANSWERS_TO_MEASURE} answers are measured"
            )
        return AnswerNeed(max(1, min(tokens, max_tokens)), why)

    @contextmanager
    def sending(self) -> Iterator[None]:
        """A request in flight: its reply (or its 400) will teach the rate."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            self._notify()

    async def wait_to_learn(self) -> bool:
        """Whether the rate is learned, once no request in flight may still teach it."""
        while not self.learned and self._in_flight:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()
        return self.learned

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
