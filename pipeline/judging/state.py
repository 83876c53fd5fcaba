"""What one judge has said so far in a judging session: the verdict that counts for each value, the values
marked missing, and the actions in the order they were made (what Backspace takes back).

An action is what one key press wrote: one judgment, or several made together (a value both answers gave,
a missing value for each answer that lacks it). Read back from the table, the judgments of one action
are told apart by their record and their shared time (they are written in one call, at one time).
Pure: the session builds it from the judgments it read, and changes it only after they were saved.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.quality.judgments import Judgment, JudgmentVerdict

#: (variant, record, field, value): a value of one answer, whoever judges it.
ValueKey = tuple[str, str, str, str]


def value_key(judgment: Judgment) -> ValueKey:
    return (judgment.variant, judgment.record_id, judgment.field, judgment.value)


@dataclass(frozen=True, slots=True)
class Action:
    """The judgments one key press made."""

    judgments: tuple[Judgment, ...]

    @property
    def record_id(self) -> str:
        return self.judgments[0].record_id

    @property
    def field(self) -> str:
        return self.judgments[0].field

    @property
    def value(self) -> str:
        return self.judgments[0].value

    @property
    def verdict(self) -> JudgmentVerdict:
        return self.judgments[0].verdict


class JudgeState:
    """One judge's judgments of a session, oldest first; the latest of a value is the one that counts."""

    def __init__(self, judgments: Iterable[Judgment] = ()) -> None:
        self._actions: list[Action] = []
        self._said: dict[ValueKey, list[Judgment]] = {}
        self._by_record: dict[str, set[ValueKey]] = {}  # what missing() looks through
        for action in group_actions(judgments):
            self.apply(action)

    def apply(self, action: Action) -> None:
        self._actions.append(action)
        for judgment in action.judgments:
            key = value_key(judgment)
            self._said.setdefault(key, []).append(judgment)
            self._by_record.setdefault(judgment.record_id, set()).add(key)

    def last(self) -> Action | None:
        return self._actions[-1] if self._actions else None

    def take_back(self, action: Action) -> None:
        """Forget ``action`` (the last one: undo goes back in order)."""
        if not self._actions or self._actions[-1] != action:
            raise ValueError("only the last action can be taken back")
        self._actions.pop()
        for judgment in action.judgments:
            key = value_key(judgment)
            said = self._said[key]
            said.remove(judgment)
            if not said:
                del self._said[key]
                self._by_record[judgment.record_id].discard(key)

    def verdict(self, key: ValueKey) -> JudgmentVerdict | None:
        said = self._said.get(key)
        return said[-1].verdict if said else None

    def missing(self, record_id: str) -> list[Judgment]:
        """The values marked missing in ``record_id`` that still are (the latest judgment says so)."""
        latest = [self._said[key][-1] for key in sorted(self._by_record.get(record_id, ()))]
        return [judgment for judgment in latest if judgment.verdict is JudgmentVerdict.MISSING]

    def __len__(self) -> int:
        return len(self._actions)


def group_actions(judgments: Iterable[Judgment]) -> list[Action]:
    """``judgments`` (oldest first) as the actions that made them: neighbours of one record and one time."""
    actions: list[list[Judgment]] = []
    for judgment in judgments:
        previous = actions[-1][-1] if actions else None
        if (
            previous is not None
            and previous.record_id == judgment.record_id
            and previous.judged_at is not None
            and previous.judged_at == judgment.judged_at
        ):
            actions[-1].append(judgment)
        else:
            actions.append([judgment])
    return [Action(tuple(group)) for group in actions]


def without(judgments: Sequence[Judgment], undone: Iterable[str]) -> list[Judgment]:
    """``judgments`` but those whose id is in ``undone``."""
    ids = set(undone)
    return [judgment for judgment in judgments if judgment.judgment_id not in ids]
