"""Splitting a long field into overlapping chunks at paragraph, sentence, word, then any boundary."""

from __future__ import annotations

import itertools
import random

import pytest

from pipeline.extraction.splitting import Span, split_text

PARAGRAPHS = "\n\n".join(
    " ".join(f"Sentence {p}.{s} says something about the job." for s in range(6)) for p in range(8)
)


def covered(text: str, spans: list[Span]) -> bool:
    """The chunks start at 0, end at the end, and each starts inside (or at the end of) the one before."""
    if spans[0].start != 0 or spans[-1].end != len(text):
        return False
    return all(b.start <= a.end and b.start > a.start for a, b in itertools.pairwise(spans))


def test_a_text_that_fits_is_one_chunk() -> None:
    assert split_text("short", 10) == [Span(0, 5)]
    assert split_text("", 10) == [Span(0, 0)]


def test_chunks_end_at_paragraph_breaks_when_one_is_in_the_second_half() -> None:
    spans = split_text(PARAGRAPHS, 700)
    assert covered(PARAGRAPHS, spans) and all(len(span) <= 700 for span in spans)
    for span in spans[:-1]:
        assert PARAGRAPHS[span.start : span.end].endswith("\n\n")  # a paragraph break, kept with it
        assert PARAGRAPHS[span.end] == "S"  # the next chunk starts with the next paragraph


def test_without_paragraphs_at_sentences_then_words_then_anywhere() -> None:
    sentences = PARAGRAPHS.replace("\n\n", " ")
    for span in split_text(sentences, 200)[:-1]:
        assert sentences[span.start : span.end].endswith("job. ")
    words = sentences.replace(".", "")
    for span in split_text(words, 200)[:-1]:
        assert words[span.end - 1] == " " and words[span.end] != " "
    solid = "x" * 95
    assert split_text(solid, 30) == [Span(0, 30), Span(30, 60), Span(60, 90), Span(90, 95)]


def test_an_early_break_does_not_make_a_tiny_chunk() -> None:
    text = "Hi.\n\n" + "word " * 100
    first = split_text(text, 100)[0]
    assert len(first) > 50  # the paragraph break at 5 is in the first half: a later word break wins


def test_overlap_starts_each_chunk_at_a_sentence_within_the_overlap() -> None:
    sentences = PARAGRAPHS.replace("\n\n", " ")
    spans = split_text(sentences, 300, overlap_chars=80)
    assert covered(sentences, spans)
    for before, after in itertools.pairwise(spans):
        assert 0 < before.end - after.start <= 80
        assert sentences[after.start : after.start + 9] == "Sentence "  # a whole sentence repeated


def test_overlap_is_at_most_half_a_chunk() -> None:
    spans = split_text("x" * 100, 20, overlap_chars=50)
    assert covered("x" * 100, spans)
    assert all(a.end - b.start <= 10 for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize("seed", range(20))
def test_any_text_is_covered_by_chunks_no_longer_than_asked(seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["word", " ", "\n", "\n\n", ". ", "! ", "é", "职位", "x" * rng.randint(1, 40)]
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3000)))
    size = rng.randint(5, 400)
    spans = split_text(text, size, overlap_chars=rng.randint(0, size))
    assert covered(text, spans) and all(len(span) <= size for span in spans)


def test_a_chunk_must_hold_something() -> None:
    with pytest.raises(ValueError, match="at least one character"):
        split_text("text", 0)
