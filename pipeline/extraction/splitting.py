"""Splitting a long text into overlapping chunks, each at most a given size, at the most natural place:
a paragraph break, else the end of a sentence, else a space between words, else anywhere (a run
without spaces, which only a hard cut can split).

A chunk is a span of the original text (``text[start:end]``), so an offset found in a chunk is an
offset in the text plus the chunk's start, and the chunks together cover the text. Each chunk after the
first starts up to ``overlap`` characters before the previous one ended, at the start of a sentence (or
of a word), so that a value a boundary cuts through is whole in one of them. A cut is never placed in
the first half of a chunk's room, so a chunk is never tiny because a break came early. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Where each kind of break ends, which is where the next piece of text starts.
_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
# Sentence ends: . ! ? … and the ideographic full stop, full-width ! and ?; then closing quotes.
_SENTENCE = re.compile(r"(?<=[.!?\u2026\u3002\uff01\uff1f])[\"'\u201d\u2019)\]]*\s+|\n\s*")
_WORD = re.compile(r"\s+")
_BREAKS = (_PARAGRAPH, _SENTENCE, _WORD)


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


def split_text(text: str, max_chars: int, overlap_chars: int = 0) -> list[Span]:
    """Chunks of at most ``max_chars`` characters covering ``text``, each after the first starting
    about ``overlap_chars`` (at most half of ``max_chars``) before the previous one's end."""
    if max_chars < 1:
        raise ValueError(f"a chunk must hold at least one character, not {max_chars}")
    overlap = max(0, min(overlap_chars, max_chars // 2))
    spans: list[Span] = []
    start = 0
    while len(text) - start > max_chars:
        end = _cut(text, start, start + max_chars)
        spans.append(Span(start, end))
        start = _next_start(text, start, end, overlap)
    spans.append(Span(start, len(text)))
    return spans


def _cut(text: str, start: int, limit: int) -> int:
    """The end of the last break of the best kind in the second half of ``text[start:limit]``."""
    earliest = start + (limit - start) // 2
    for pattern in _BREAKS:
        ends = [match.end() for match in pattern.finditer(text, earliest, limit) if match.end() <= limit]
        if ends and ends[-1] > start:
            return ends[-1]
    return limit


def _next_start(text: str, start: int, end: int, overlap: int) -> int:
    """Where the chunk after ``text[start:end]`` starts: ``overlap`` characters back, moved forward to
    the first sentence (or word) that starts there; always after ``start``."""
    if overlap == 0:
        return end
    target = end - overlap
    for pattern in (_SENTENCE, _WORD):
        match = pattern.search(text, target, end)
        if match is not None and match.end() < end:
            return max(match.end(), start + 1)
    return max(target, start + 1)
