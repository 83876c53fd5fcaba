"""The KV cache's blocks as vLLM's automatic prefix caching keeps them.

* The cache is ``num_gpu_blocks`` blocks of :data:`BLOCK_SIZE` tokens.
* A running request holds the blocks of its prompt and of what it has generated. Its prompt's full blocks
  are *cached*: known by their chained hash (:func:`pipeline.sim.tokens.block_hashes`), held once however
  many running requests share them. Its other blocks (the prompt's partial last block, the generated
  tokens) are its own; the engine counts those.
* A cached block that no running request holds any more stays cached, *evictable*: it counts as free
  (a request may be admitted into its space), and it is evicted, least recently freed first, only when
  that space is taken. A later request with the same leading tokens finds it there until then.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: vLLM's block size on a GPU by default: the KV cache is ``num_gpu_blocks`` blocks of this many tokens.
BLOCK_SIZE = 16


class BlockCache:
    """The cached blocks: those running requests hold (by how many hold each), and the evictable rest."""

    def __init__(self, total: int) -> None:
        self.total = total  # every block of the cache, cached or not
        self._held: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.evictions = 0

    @property
    def held(self) -> int:
        """Cached blocks some running request holds, each counted once."""
        return len(self._held)

    @property
    def evictable(self) -> int:
        return len(self._evictable)

    def cached_run(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``' leading blocks are cached, held or evictable (vLLM's longest hit)."""
        for index, block in enumerate(hashes):
            if block not in self._held and block not in self._evictable:
                return index
        return len(hashes)

    def taking(self, hashes: Sequence[int]) -> int:
        """The free blocks that holding ``hashes`` takes: each not held yet (an evictable one included:
        held again, it is no longer free)."""
        held = self._held
        return sum(1 for block in hashes if block not in held)

    def hold(self, hashes: Sequence[int]) -> None:
        """One more holder of each of ``hashes``: a held block shared, an evictable one taken back, a new
        one cached (:meth:`evict` makes its room)."""
        held, evictable = self._held, self._evictable
        for block in hashes:
            count = held.get(block)
            if count is None:
                evictable.pop(block, None)
                held[block] = 1
            else:
                held[block] = count + 1

    def release(self, hashes: Sequence[int]) -> None:
        """One holder fewer of each of ``hashes``; a block no one holds becomes evictable. Last block
        first, as vLLM frees a request's blocks, so that a prompt's tail is evicted before its head."""
        held, evictable = self._held, self._evictable
        for block in reversed(hashes):
            count = held[block] - 1
            if count:
                held[block] = count
            else:
                del held[block]
                evictable[block] = None

    def evict(self, own: int) -> None:
        """Evict the least recently freed blocks until the held, the evictable and ``own`` (the blocks
        running requests hold on their own) fit in the cache."""
        held, evictable = self._held, self._evictable
        while evictable and len(held) + len(evictable) + own > self.total:
            evictable.popitem(last=False)
            self.evictions += 1
