"""The simulator's tokens: a prompt's count, and its full blocks hashed as vLLM's prefix cache hashes them
(each with everything before it), so prompts share exactly the full blocks they have in common."""

from __future__ import annotations

from typing import Any

from pipeline.sim.blocks import BLOCK_SIZE
from pipeline.sim.tokens import CHARS_PER_TOKEN, TEMPLATE_TOKENS, block_hashes, prompt_text, prompt_tokens

SYSTEM = "You extract structured facts from UK job postings. " * 20  # 1,040 characters
EXAMPLES = [
    {"role": "user", "content": "Job title: Nurse\nCompany: NHS\nPosting: Night shifts."},
    {"role": "assistant", "content": '{"title": "Nurse", "skills": []}'},
]


def request(record: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, *EXAMPLES, {"role": "user", "content": record}]


def shared(first: tuple[int, ...], second: tuple[int, ...]) -> int:
    """How many leading blocks two chains have in common."""
    return next(
        (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
        min(len(first), len(second)),
    )


def test_a_prompt_counts_its_content_and_a_template_header_per_message() -> None:
    messages = request("Job title: Welder")
    content = sum(len(str(m["content"])) for m in messages)
    assert prompt_tokens(messages) == content // CHARS_PER_TOKEN + TEMPLATE_TOKENS * len(messages)
    assert prompt_tokens(messages) == len(prompt_text(messages)) // CHARS_PER_TOKEN
    assert prompt_tokens([{"role": "user", "content": None}]) == TEMPLATE_TOKENS  # no content, a header


def test_only_full_blocks_are_hashed() -> None:
    messages = request("Job title: Welder, Sheffield. " * 7)
    tokens = prompt_tokens(messages)
    assert tokens % BLOCK_SIZE  # a partial last block, which has no hash
    assert len(block_hashes(prompt_text(messages), BLOCK_SIZE)) == tokens // BLOCK_SIZE


def test_two_records_share_the_system_prompt_and_the_examples_and_no_more() -> None:
    first, second = request("Job title: Welder\n" * 40), request("Position: Chef\n" * 40)
    text = prompt_text(first)
    common = len(prompt_text(request("")))  # system, examples and the record message's header
    assert text[:common] == prompt_text(second)[:common] and text[common] != prompt_text(second)[common]
    hashes = block_hashes(text, BLOCK_SIZE)
    assert shared(hashes, block_hashes(prompt_text(second), BLOCK_SIZE)) == common // (
        BLOCK_SIZE * CHARS_PER_TOKEN
    )
    assert common % (BLOCK_SIZE * CHARS_PER_TOKEN)  # the block the records start in is theirs alone


def test_a_reask_shares_every_full_block_of_its_records_first_prompt() -> None:
    first = request("Job title: Welder\n" * 40)
    reask = [
        *first,
        {"role": "assistant", "content": '{"title": "Welder"'},
        {"role": "user", "content": "Your previous reply was rejected: invalid JSON."},
    ]
    before = block_hashes(prompt_text(first), BLOCK_SIZE)
    after = block_hashes(prompt_text(reask), BLOCK_SIZE)
    assert len(after) > len(before) and after[: len(before)] == before


def test_a_block_depends_on_everything_before_it() -> None:
    width = BLOCK_SIZE * CHARS_PER_TOKEN
    one, other = "a" * width + "b" * width, "c" * width + "b" * width
    assert block_hashes(one, BLOCK_SIZE)[1] != block_hashes(other, BLOCK_SIZE)[1]  # same tokens, not prefix
    assert block_hashes(one, 32) == block_hashes(one[: 2 * width], 32)  # a block of 32 tokens covers both
