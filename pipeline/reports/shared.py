"""What the quality reports share: the grounded share of extracted values, and how ids, shares and
values are written in the text reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.quality.agreement import id_order
from pipeline.quality.found_share import FoundShare, found_shares
from pipeline.reports.reading import StoredResult
from pipeline.wording import counted, number

SHOWN_IDS = 10
VALUE_CHARS = 100


@dataclass(frozen=True, slots=True)
class GroundingShare:
    """Of the values at one grounded path, how many were found in the record text."""

    path: str
    counts: FoundShare

    def to_json(self) -> dict[str, Any]:
        return self.counts.to_json()

    def describe(self) -> str:
        counts = self.counts
        share = "" if counts.share is None else f" ({counts.share:.0%})"
        return f"{number(counts.found)} of {counted(counts.values, 'value')} found in the text{share}"


@dataclass(frozen=True, slots=True)
class GroundingSummary:
    shares: tuple[GroundingShare, ...]  # one per grounded path of the schema, in schema order
    without_grounding: int  # results stored without grounding (made before it was recorded)

    def to_json(self) -> dict[str, Any]:
        return {share.path: share.to_json() for share in self.shares}


def grounding_summary(paths: Sequence[str], results: Iterable[StoredResult]) -> GroundingSummary:
    """The stored grounding of ``results`` counted per path (``paths``: the schema's grounded paths)."""
    grounded = [result.grounding for result in results]
    values = (value for grounding in grounded if grounding is not None for value in grounding)
    shares = tuple(GroundingShare(path, counts) for path, counts in found_shares(values, paths).items())
    return GroundingSummary(shares, sum(grounding is None for grounding in grounded))


def grounding_lines(summary: GroundingSummary, indent: str = "  ") -> list[str]:
    lines = [f"{indent}{share.path}: {share.describe()}" for share in summary.shares]
    if summary.without_grounding:
        lines.append(f"{indent}({counted(summary.without_grounding, 'result')} stored without grounding)")
    return lines


def ids_text(keys: Iterable[str], limit: int = SHOWN_IDS) -> str:
    """``3, 5, 42`` in id order, the first ``limit`` of them then ``…``."""
    ordered = sorted(keys, key=id_order)
    return ", ".join(ordered[:limit]) + (", …" if len(ordered) > limit else "")


def shown_value(value: Any, limit: int = VALUE_CHARS) -> str:
    """A value as JSON on one line, cut to ``limit`` characters."""
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def class_counts(classes: Iterable[str]) -> dict[str, int]:
    """Failure classes counted, largest first (then by name)."""
    counts: dict[str, int] = {}
    for name in classes:
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def schema_extraction(extracted: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Only the schema's fields of an extraction: one made under an older schema may hold others."""
    wanted = set(names)
    return {name: value for name, value in extracted.items() if name in wanted}
