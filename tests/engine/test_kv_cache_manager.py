"""KV cache managers: block tables, prefix lookups, all-or-nothing allocate_slots, figures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_llm.engine.core.kv.block_pool import cdiv
from paged_llm.engine.core.kv.contiguous import ContiguousKVCacheManager
from paged_llm.engine.core.kv.manager import KVManager
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence


def make_seq(
    rid: str, prompt: list[int], max_tokens: int = 8, priority: Priority = Priority.INTERACTIVE
) -> Sequence:
    return Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens), priority, 0.0)


def admit(kv: KVManager, seq: Sequence, num_tokens: int, keep_free: int = 0) -> bool:
    """Look the prefix up once and allocate, as the scheduler admits a sequence."""
    return kv.allocate_slots(seq, num_tokens, kv.get_computed_blocks(seq), keep_free)


def compute(kv: KVCacheManager, seq: Sequence, num_tokens: int) -> None:
    """Allocate and mark ``num_tokens`` more tokens computed, as a step would."""
    if kv.has_blocks(seq):
        assert kv.allocate_slots(seq, num_tokens)
    else:
        assert admit(kv, seq, num_tokens)
    seq.num_computed_tokens += num_tokens
    kv.cache_blocks(seq)


def test_allocate_grows_the_live_table_block_by_block() -> None:
    kv = KVCacheManager(10, 4)
    seq = make_seq("a", list(range(10)))
    assert admit(kv, seq, 10)
    table = kv.block_table(seq)
    assert table == [0, 1, 2]
    seq.num_computed_tokens = 10
    assert kv.allocate_slots(seq, 1)  # position 10 still fits the third block
    assert kv.block_table(seq) is table
    assert table == [0, 1, 2]
    seq.num_computed_tokens = 12
    assert kv.allocate_slots(seq, 1)
    assert table == [0, 1, 2, 3]
    assert (kv.num_used_blocks, kv.num_free_blocks) == (4, 6)
    assert kv.usage == pytest.approx(0.4)
    assert kv.num_allocated_slots == 16
    assert kv.num_live_tokens == 12


def test_prefix_lookup_counts_tokens_once_per_admission_and_takes_no_reference() -> None:
    kv = KVCacheManager(20, 4)
    a = make_seq("a", list(range(12)))
    compute(kv, a, 12)
    b = make_seq("b", [*range(12), 99, 98])
    assert kv.get_computed_blocks(b).num_tokens == 12
    computed = kv.get_computed_blocks(b)  # lookups have no side effects: nothing counted
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (12, 0)
    assert [kv.pool.ref_count(x) for x in kv.block_table(a)] == [1, 1, 1]
    assert not kv.allocate_slots(b, 2, computed, keep_free=20)  # a failed try counts nothing
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (12, 0)
    assert kv.allocate_slots(b, 2, computed)
    assert (b.num_computed_tokens, b.num_cached_tokens) == (12, 12)
    assert kv.block_table(b)[:3] == kv.block_table(a)
    assert [kv.pool.ref_count(x) for x in kv.block_table(a)] == [2, 2, 2]
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (12 + 14, 12)
    # Shared tokens are stored once.
    assert kv.num_live_tokens == 12
    assert kv.num_allocated_slots == 4 * 4


def test_a_shared_block_one_holder_has_not_reached_the_end_of_counts_each_slot_once() -> None:
    """A token the runner gave nothing back for is computed again: its sequence then holds
    a cached full block it has computed only partly, which another sequence shares whole."""
    kv = KVCacheManager(20, 4)
    a = make_seq("a", list(range(12)))
    compute(kv, a, 12)
    a.num_computed_tokens = 11  # the last token's output was dropped: asked for again
    b = make_seq("b", [*range(12), 99])
    computed = kv.get_computed_blocks(b)
    assert computed.num_tokens == 12
    assert kv.allocate_slots(b, 1, computed)
    b.num_computed_tokens = 13
    assert kv.block_table(b)[:3] == kv.block_table(a)
    # Slots 0-11 once (b fills the block a reaches into only partly), and b's slot 12.
    assert kv.num_live_tokens == 13
    assert kv.num_allocated_slots == 4 * 4


def test_full_hit_leaves_the_last_token_to_compute() -> None:
    kv = KVCacheManager(20, 4)
    compute(kv, make_seq("a", list(range(8))), 8)
    assert kv.get_computed_blocks(make_seq("b", list(range(8)))).num_tokens == 4
    assert kv.get_computed_blocks(make_seq("c", list(range(9)))).num_tokens == 8


def test_partial_blocks_and_uncomputed_blocks_are_not_cached() -> None:
    kv = KVCacheManager(20, 4)
    a = make_seq("a", list(range(10)))
    assert admit(kv, a, 10)
    a.num_computed_tokens = 6  # only the first block is full and computed
    kv.cache_blocks(a)
    assert kv.get_computed_blocks(make_seq("b", list(range(10)))).num_tokens == 4


def test_allocate_slots_counts_idle_cached_hits_as_used_free_blocks() -> None:
    kv = KVCacheManager(8, 4)
    a = make_seq("a", list(range(16)))
    compute(kv, a, 16)
    kv.free(a)
    assert kv.num_free_blocks == 8
    b = make_seq("b", [*range(16), *range(100, 116)])
    computed = kv.get_computed_blocks(b)
    # One token more than 4 revived cached blocks + 4 fresh ones needs a ninth block ...
    assert not kv.allocate_slots(b, 17, computed)
    assert kv.num_free_blocks == 8  # a failed allocation changes nothing
    assert not kv.has_blocks(b)
    # ... 16 new tokens fill exactly the pool.
    assert kv.allocate_slots(b, 16, computed)
    assert b.num_computed_tokens == 16
    assert kv.num_free_blocks == 0


def test_free_is_idempotent_and_releases_tail_first() -> None:
    kv = KVCacheManager(6, 2)
    a = make_seq("a", list(range(6)))
    compute(kv, a, 6)
    table = list(kv.block_table(a))
    kv.free(a)
    kv.free(a)
    assert kv.num_used_blocks == 0
    assert kv.pool.free_block_ids()[-3:] == table[::-1]
    with pytest.raises(KeyError, match="holds no KV blocks"):
        kv.block_table(a)


def test_disabled_prefix_caching_never_hits() -> None:
    kv = KVCacheManager(10, 4, enable_prefix_caching=False)
    compute(kv, make_seq("a", list(range(12))), 12)
    b = make_seq("b", list(range(12)))
    assert kv.get_computed_blocks(b).num_tokens == 0
    assert admit(kv, b, 12)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (12 + 12, 0)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 24), st.integers(0, 30)),
        min_size=1,
        max_size=12,
    )
)
def test_allocate_slots_is_all_or_nothing(requests: list[tuple[int, int, int]]) -> None:
    """Whatever is cached and held, allocation succeeds exactly when the blocks are free."""
    kv = KVCacheManager(10, 4)
    prefixes = [[], [1] * 8, [1] * 8 + [2] * 8, [3] * 12]
    held: list[Sequence] = []
    for n, (prefix, extra, new_tokens) in enumerate(requests):
        seq = make_seq(f"r{n}", prefixes[prefix] + [n + 10] * extra)
        computed = kv.get_computed_blocks(seq)
        hits = computed.block_ids
        need = cdiv(computed.num_tokens + new_tokens, 4) - len(hits)
        idle = sum(1 for b in hits if kv.pool.ref_count(b) == 0)
        fits = max(0, need) + idle <= kv.num_free_blocks
        before = (kv.num_free_blocks, kv.num_used_blocks, kv.prefix_cache_queries)
        if not kv.allocate_slots(seq, new_tokens, computed):
            assert not fits
            assert (kv.num_free_blocks, kv.num_used_blocks, kv.prefix_cache_queries) == before
            if held:
                kv.free(held.pop(0))
            continue
        assert fits
        seq.num_computed_tokens = min(seq.num_tokens, seq.num_computed_tokens + new_tokens)
        kv.cache_blocks(seq)
        held.append(seq)
        if n % 3 == 2:
            kv.free(held.pop(0))


# --- contiguous baseline ------------------------------------------------------------


def test_contiguous_reserves_the_whole_request_at_once() -> None:
    kv = ContiguousKVCacheManager(20, 4, max_model_len=64)
    seq = make_seq("a", list(range(10)), max_tokens=10)  # 20 tokens: 5 blocks
    assert kv.max_blocks(seq) == 5
    assert kv.get_computed_blocks(seq).num_tokens == 0
    assert admit(kv, seq, 10)
    assert kv.block_table(seq) == [0, 1, 2, 3, 4]
    seq.num_computed_tokens = 10
    assert kv.allocate_slots(seq, 10)
    assert not kv.allocate_slots(seq, 11)
    assert (kv.num_used_blocks, kv.num_allocated_slots, kv.num_live_tokens) == (5, 20, 10)
    assert kv.prefix_cache_queries == 10
    assert kv.prefix_cache_hits == 0
    kv.free(seq)
    kv.free(seq)
    assert kv.free_extents == [(0, 20)]


def test_contiguous_max_model_len_reservation() -> None:
    kv = ContiguousKVCacheManager(40, 4, max_model_len=64, reserve="max_model_len")
    seq = make_seq("a", [1, 2, 3], max_tokens=2)
    assert kv.max_blocks(seq) == 16
    assert admit(kv, seq, 3)
    assert kv.num_used_blocks == 16
    assert kv.num_live_tokens == 0
    with pytest.raises(ValueError, match="reserve"):
        ContiguousKVCacheManager(4, 4, 16, reserve="bogus")


def test_contiguous_first_fit_fragments_and_coalesces() -> None:
    kv = ContiguousKVCacheManager(12, 4, max_model_len=64)
    a, b, c = (make_seq(r, [1] * 4, max_tokens=12) for r in "abc")  # 4 blocks each
    for s in (a, b, c):
        assert admit(kv, s, 4)
    kv.free(a)
    kv.free(c)
    assert kv.free_extents == [(0, 4), (8, 4)]
    big = make_seq("big", [1] * 4, max_tokens=28)  # 8 blocks: 8 free, but in two holes
    assert kv.num_free_blocks == 8
    assert not admit(kv, big, 4)
    assert kv.num_free_blocks == 8
    small = make_seq("small", [1] * 4, max_tokens=4)  # 2 blocks: first fit, the front hole
    assert not admit(kv, small, 4, keep_free=7)  # would leave 6 of the 7 kept free
    assert admit(kv, small, 4, keep_free=6)
    assert kv.block_table(small) == [0, 1]
    kv.free(b)
    kv.free(small)
    assert kv.free_extents == [(0, 12)]
    assert admit(kv, big, 4)


def test_keep_free_leaves_the_interactive_share_untouched() -> None:
    kv = KVCacheManager(10, 4)
    bg = make_seq("bg", list(range(100, 124)), priority=Priority.BACKGROUND)  # 6 blocks
    assert not admit(kv, bg, 24, keep_free=5)
    assert admit(kv, bg, 20, keep_free=5)  # 5 blocks, 5 left
    bg.num_computed_tokens = 20
    assert not kv.allocate_slots(bg, 4, keep_free=5)
    assert kv.allocate_slots(bg, 4, keep_free=4)
    assert kv.num_free_blocks == 4


def test_blocks_interactive_requests_use_are_evicted_last() -> None:
    kv = KVCacheManager(8, 4)
    voice = make_seq("voice", list(range(8)))  # the system prompt: 2 blocks
    compute(kv, voice, 8)
    doc = make_seq("doc", list(range(100, 108)), priority=Priority.BACKGROUND)
    compute(kv, doc, 8)
    voice_blocks, doc_blocks = list(kv.block_table(voice)), list(kv.block_table(doc))
    kv.free(voice)  # freed first: plain LRU would evict it first
    kv.free(doc)
    assert all(kv.pool.is_kept(b) for b in voice_blocks)
    assert not any(kv.pool.is_kept(b) for b in doc_blocks)
    # A new summary needs 6 blocks: the 4 uncached ones and the document's 2 go first.
    other = make_seq("other", list(range(200, 224)), priority=Priority.BACKGROUND)
    compute(kv, other, 24)
    assert kv.get_computed_blocks(make_seq("v2", [*range(8), 5])).num_tokens == 8
    assert kv.get_computed_blocks(make_seq("d2", [*range(100, 108), 5])).num_tokens == 0
    # Only when nothing else is left do the voice blocks go.
    kv.free(other)
    compute(kv, make_seq("big", list(range(300, 332)), priority=Priority.BACKGROUND), 32)
    assert kv.get_computed_blocks(make_seq("v3", [*range(8), 5])).num_tokens == 0
