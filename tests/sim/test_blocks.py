"""The cached blocks: held once however many hold them, evictable when none does (and free for a new
request), evicted least recently freed first and a prompt's tail before its head."""

from __future__ import annotations

from pipeline.sim.blocks import BlockCache


def test_a_block_held_by_several_is_held_once_and_evictable_when_the_last_lets_go() -> None:
    cache = BlockCache(10)
    cache.hold((1, 2, 3))
    assert cache.taking((1, 2, 3, 4)) == 1  # only the block not held yet takes a free one
    cache.hold((1, 2, 3, 4))
    assert (cache.held, cache.evictable) == (4, 0)
    cache.release((1, 2, 3))
    assert (cache.held, cache.evictable) == (4, 0)
    cache.release((1, 2, 3, 4))
    assert (cache.held, cache.evictable) == (0, 4)
    assert cache.cached_run((1, 2, 3, 4, 5)) == 4  # still cached: a later request finds them
    assert cache.taking((1, 2)) == 2  # held again, an evictable block is no longer free


def test_the_longest_hit_stops_at_the_first_block_not_cached() -> None:
    cache = BlockCache(10)
    cache.hold((1, 2))
    cache.hold((9,))
    assert cache.cached_run((1, 2, 3, 9)) == 2
    assert cache.cached_run((5, 1, 2)) == 0


def test_eviction_takes_the_least_recently_freed_and_a_prompts_tail_first() -> None:
    cache = BlockCache(6)
    cache.hold((1, 2, 3))
    cache.release((1, 2, 3))  # freed last-first: 3, 2, 1
    cache.hold((7, 8))
    cache.release((7, 8))  # then 8, 7
    cache.evict(own=0)
    assert cache.evictions == 0  # 5 cached blocks fit in 6
    cache.evict(own=3)  # 3 blocks a running request holds on its own: 2 cached must go
    assert cache.evictions == 2
    assert cache.cached_run((1, 2, 3)) == 1  # 3 and 2 went, the prompt's tail first
    assert cache.cached_run((7, 8)) == 2
    cache.hold((1,))  # taken back: the most recently used
    cache.release((1,))
    cache.evict(own=5)  # 2 more must go: 8 and 7, freed before 1 was
    assert (cache.cached_run((1,)), cache.cached_run((7, 8))) == (1, 0)
