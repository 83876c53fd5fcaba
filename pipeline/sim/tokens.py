"""The simulator's tokens: how it counts a prompt and cuts it into the KV cache's blocks.

A prompt is its messages laid out as a chat template lays them out: each message a header of
:data:`TEMPLATE_TOKENS` tokens (its role and the template's delimiters) and then its content; a token is
:data:`CHARS_PER_TOKEN` characters of that text. So a prompt has ``len(text) // 4`` tokens (its
``usage.prompt_tokens`` and ``POST /tokenize``'s count), and its full blocks of ``block_size`` tokens are
its ``block_size * 4``-character pieces, hashed as vLLM's automatic prefix caching hashes them: each with
the hash of the blocks before it, so two prompts share a block only if they share everything up to its
end (the system prompt, the few-shot turns, the user message's header and whatever leading text their
records have in common). The last partial block has no hash: vLLM caches only full blocks.
"""

from __future__ import annotations

from typing import Any

CHARS_PER_TOKEN = 4
#: The tokens a chat template adds around each message (its role, its start and end markers).
TEMPLATE_TOKENS = 4
_HEADER_CHARS = TEMPLATE_TOKENS * CHARS_PER_TOKEN


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The prompt as the simulator tokenises it: per message a fixed-width header naming its role,
    then its content."""
    return "".join(_header(message) + str(message.get("content") or "") for message in messages)


def _header(message: dict[str, Any]) -> str:
    return f"<|{message.get('role')}|>".ljust(_HEADER_CHARS)[:_HEADER_CHARS]


def text_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return text_tokens(prompt_text(messages))


def block_hashes(text: str, block_size: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of ``block_size`` tokens of a prompt's ``text`` (a block's
    hash covers every token up to its end). Python's ``hash`` of a tuple: cheap, and the cache it keys
    lives in the one process that made it."""
    width = block_size * CHARS_PER_TOKEN
    chain: list[int] = []
    parent = 0
    for start in range(0, len(text) - width + 1, width):
        parent = hash((parent, text[start : start + width]))
        chain.append(parent)
    return tuple(chain)
