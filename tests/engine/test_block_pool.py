"""Block pool: free list order, reference counts, content hashes and eviction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_llm.engine.core.kv.block_pool import ROOT_HASH, BlockPool, hash_block


def test_fresh_pool_is_all_free_in_order() -> None:
    pool = BlockPool(4, 16)
    assert (pool.num_blocks, pool.block_size) == (4, 16)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (4, 0)
    assert pool.take(2) == [0, 1]
    assert (pool.num_free_blocks, pool.num_used_blocks) == (2, 2)
    assert [pool.ref_count(b) for b in range(4)] == [1, 1, 0, 0]


def test_chained_hash_depends_on_parent_and_tokens() -> None:
    first = hash_block(ROOT_HASH, [1, 2, 3, 4])
    assert hash_block(ROOT_HASH, [1, 2, 3, 4]) == first
    assert hash_block(ROOT_HASH, [1, 2, 3, 5]) != first
    assert hash_block(first, [1, 2, 3, 4]) != first
    assert hash_block(first, [9, 9, 9, 9]) != hash_block(ROOT_HASH, [9, 9, 9, 9])


def test_freed_cached_blocks_wait_in_lru_order_and_uncached_go_first() -> None:
    pool = BlockPool(4, 2)
    blocks = pool.take(4)
    pool.cache(blocks[0], b"h0")
    pool.cache(blocks[1], b"h1")
    pool.free([blocks[1], blocks[0], blocks[2]])
    # Block 2 holds nothing reusable, so it is handed out before the cached ones.
    assert pool.free_block_ids() == [2, 1, 0]
    assert pool.get_cached(b"h0") == 0
    pool.free([blocks[3]])
    assert pool.free_block_ids() == [3, 2, 1, 0]


def test_taking_a_cached_block_evicts_its_hash() -> None:
    pool = BlockPool(2, 2)
    a, b = pool.take(2)
    pool.cache(a, b"old")
    pool.free([a, b])
    assert pool.get_cached(b"old") == a
    assert pool.take(1) == [b]  # uncached first
    assert pool.get_cached(b"old") == a
    assert pool.take(1) == [a]
    assert pool.get_cached(b"old") is None
    assert pool.block_hash(a) is None
    assert pool.num_cached_blocks == 0


def test_touch_revives_a_cached_free_block_and_counts_sharing() -> None:
    pool = BlockPool(3, 2)
    (a,) = pool.take(1)
    pool.cache(a, b"h")
    pool.touch([a])
    assert pool.ref_count(a) == 2
    assert pool.num_extra_refs == 1
    pool.free([a])
    pool.free([a])
    assert pool.num_free_blocks == 3
    assert pool.num_extra_refs == 0
    pool.touch([a])  # a hit on an idle cached block takes it off the free list
    assert pool.num_free_blocks == 2
    assert pool.ref_count(a) == 1
    assert a not in pool.free_block_ids()


def test_one_hash_never_names_two_blocks() -> None:
    pool = BlockPool(2, 2)
    a, b = pool.take(2)
    pool.cache(a, b"same")
    pool.cache(b, b"same")
    assert pool.get_cached(b"same") == a
    assert pool.block_hash(b) is None


def test_caching_disabled_registers_nothing() -> None:
    pool = BlockPool(2, 2, enable_caching=False)
    (a,) = pool.take(1)
    pool.cache(a, b"h")
    assert pool.get_cached(b"h") is None


def test_misuse_raises() -> None:
    pool = BlockPool(2, 2)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.take(3)
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([0])
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("tfch"), st.integers(0, 7)), max_size=60))
def test_random_operations_keep_counts_consistent(ops: list[tuple[str, int]]) -> None:
    pool = BlockPool(8, 2)
    held: list[int] = []  # one entry per reference, as block tables would hold them
    for op, arg in ops:
        if op == "t" and arg <= pool.num_free_blocks:
            held += pool.take(arg)
        elif op == "f" and held:
            pool.free([held.pop(arg % len(held))])
        elif op == "c" and held:
            pool.cache(held[arg % len(held)], bytes([arg]))
        elif op == "h":
            block = pool.get_cached(bytes([arg]))
            if block is not None:
                pool.touch([block])
                held.append(block)
        for block in range(8):
            assert pool.ref_count(block) == held.count(block)
            block_hash = pool.block_hash(block)
            if block_hash is not None:
                assert pool.get_cached(block_hash) == block
        assert pool.num_used_blocks == len(set(held))
        assert pool.num_free_blocks + pool.num_used_blocks == 8
        assert sorted(pool.free_block_ids()) == [b for b in range(8) if b not in held]
        assert pool.num_extra_refs == len(held) - len(set(held))
        free_cached = [b for b in pool.free_block_ids() if pool.block_hash(b) is not None]
        assert pool.num_free_cached_blocks == len(free_cached)
