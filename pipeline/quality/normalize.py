"""Text normalisation shared by the agreement metrics and grounding, so that "the same text" means one
thing everywhere; :data:`NORMALISATION_RULE` states it in words for reports.

:func:`normalize_with_offsets` gives the same text as :func:`normalize_text` plus, for each normalised
character, the span of the original text it came from, so that a match found in normalised text is
turned back into a span of the original (``original[start:end]``).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Only quotes and sentence punctuation are stripped from the ends: "C++", "C#" and ".NET" are names,
# and stripping every punctuation character would make "C#" equal "C".
QUOTES = "\"'`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a"
LEADING_STRIP = " " + QUOTES + "-\u2013\u2014\u2022\u00b7*"  # plus list bullets and dashes
TRAILING_STRIP = " " + QUOTES + ".,;:!?\u2026"

NORMALISATION_RULE = (
    "Unicode NFKC, casefold, whitespace runs to one space, then quotes, bullets and dashes stripped "
    "from the start and quotes and .,;:!?… from the end (never inside)"
)

_WORD = re.compile(r"\S+")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def normalize_text(value: str) -> str:
    """``value`` as compared by the metrics and grounding, in this order:

    1. Unicode NFKC (full-width letters and digits are ASCII, the ligature U+FB01 is ``fi``, a no-break
       space is a space);
    2. casefold (``Straße`` is ``strasse``);
    3. every run of whitespace (spaces, tabs, newlines) becomes one space, and the ends are stripped;
    4. quotes (straight, curly, guillemets), list bullets and dashes are stripped from the start, and
       quotes and ``. , ; : ! ? …`` from the end; punctuation inside is kept, and so are ``+ #`` and a
       leading ``.`` (``C++``, ``C#``, ``.NET``).
    """
    folded = unicodedata.normalize("NFKC", value).casefold()
    return " ".join(folded.split()).lstrip(LEADING_STRIP).rstrip(TRAILING_STRIP)


@dataclass(frozen=True, slots=True)
class NormalizedText:
    """A normalised text; character ``i`` came from ``original[starts[i]:ends[i]]``."""

    text: str
    starts: list[int]
    ends: list[int]

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original text that ``text[start:end]`` (not empty) came from."""
        return self.starts[start], self.ends[end - 1]


def _combining_chunks(segment: str) -> list[str]:
    """``segment`` cut before every character that is not a combining mark, so each chunk is one base
    character with its combining marks (NFKC composes within such a chunk, never across)."""
    chunks: list[str] = []
    for char in segment:
        if chunks and unicodedata.combining(char):
            chunks[-1] += char
        else:
            chunks.append(char)
    return chunks


def _fold_non_ascii(segment: str, offset: int, out: list[str], starts: list[int], ends: list[int]) -> None:
    position = offset
    for chunk in _combining_chunks(segment):
        folded = unicodedata.normalize("NFKC", chunk).casefold()
        out.append(folded)
        starts.extend([position] * len(folded))
        ends.extend([position + len(chunk)] * len(folded))
        position += len(chunk)


def _fold(text: str) -> tuple[str, list[int], list[int]]:
    """NFKC + casefold with offsets; ASCII runs (NFKC leaves them alone) are lowered in one go."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    position = 0
    for run in _NON_ASCII.finditer(text):
        begin = run.start()
        # A combining mark belongs to the character before it, which may be ASCII ("e" + U+0301).
        if begin > position and unicodedata.combining(text[begin]):
            begin -= 1
        out.append(text[position:begin].lower())
        starts.extend(range(position, begin))
        ends.extend(range(position + 1, begin + 1))
        _fold_non_ascii(text[begin : run.end()], begin, out, starts, ends)
        position = run.end()
    out.append(text[position:].lower())
    starts.extend(range(position, len(text)))
    ends.extend(range(position + 1, len(text) + 1))
    return "".join(out), starts, ends


def normalize_with_offsets(text: str) -> NormalizedText:
    """:func:`normalize_text` of ``text``, with the original span of every normalised character.

    The one space a whitespace run becomes spans the whole run. NFKC is applied per base character
    with its combining marks; for the rare sequences that compose across such characters (decomposed
    Hangul jamo) the text may differ from :func:`normalize_text`'s, which only means no match there."""
    folded, folded_starts, folded_ends = _fold(text)
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    previous_end = 0  # in folded: where the previous word ended
    for word in _WORD.finditer(folded):
        if pieces:
            pieces.append(" ")
            starts.append(folded_starts[previous_end])
            ends.append(folded_ends[word.start() - 1])
        pieces.append(word.group())
        starts.extend(folded_starts[word.start() : word.end()])
        ends.extend(folded_ends[word.start() : word.end()])
        previous_end = word.end()
    collapsed = "".join(pieces)
    first = len(collapsed) - len(collapsed.lstrip(LEADING_STRIP))
    last = len(collapsed.rstrip(TRAILING_STRIP))
    if first >= last:
        return NormalizedText("", [], [])
    return NormalizedText(collapsed[first:last], starts[first:last], ends[first:last])
