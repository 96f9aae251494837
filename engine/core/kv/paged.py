"""Paged KV cache manager: per-sequence block tables over a shared block pool."""

from __future__ import annotations

from paged_llm.engine.core.kv.block_pool import ROOT_HASH, BlockHash, BlockPool, cdiv, hash_block
from paged_llm.engine.core.kv.manager import NO_HITS, ComputedBlocks, KVManager
from paged_llm.engine.core.sequence import Priority, Sequence


class KVCacheManager(KVManager):
    """Block tables over a :class:`BlockPool`, with prefix sharing through block hashes.

    Blocks that interactive sequences compute or reuse are marked in the pool so they are
    evicted after every other cached block: a summary cannot push the voice system prompt
    out of the cache.
    """

    __slots__ = ("_hashes", "_num_cached", "_pool")

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        super().__init__(num_blocks, block_size)
        self._pool = BlockPool(num_blocks, block_size, enable_prefix_caching)
        # Content hashes of each sequence's full blocks, computed once and extended.
        self._hashes: dict[str, list[BlockHash]] = {}
        # How many leading blocks of each table are registered in the pool already.
        self._num_cached: dict[str, int] = {}

    @property
    def pool(self) -> BlockPool:
        """The underlying block pool."""
        return self._pool

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self._pool.num_used_blocks

    @property
    def num_free_cached_blocks(self) -> int:
        """Free blocks that still hold a cached prefix."""
        return self._pool.num_free_cached_blocks

    @property
    def num_live_tokens(self) -> int:
        """Tokens whose K/V is stored, a slot of a shared block counted once.

        A block shared through its hash is full, but a holder may not have reached its end
        (a token the runner gave back nothing for is computed again), so each block counts
        the slots of the holder that reaches furthest into it.
        """
        if not self._pool.num_extra_refs:
            return super().num_live_tokens  # nothing shared: the per-sequence sum
        b = self._block_size
        filled: dict[int, int] = {}
        for rid, seq in self._seqs.items():
            done = seq.num_computed_tokens
            for i, block in enumerate(self._tables[rid][: -(-done // b)]):
                filled[block] = max(filled.get(block, 0), min(b, done - i * b))
        return sum(filled.values())

    def _block_hashes(self, seq: Sequence, count: int) -> list[BlockHash]:
        """Return the hashes of the first ``count`` full blocks of ``seq``, memoised."""
        hashes = self._hashes.setdefault(seq.request_id, [])
        b = self._block_size
        tokens = seq.token_ids
        while len(hashes) < count:
            i = len(hashes)
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.append(hash_block(parent, tokens[i * b : (i + 1) * b]))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> ComputedBlocks:
        """Cached blocks holding the leading full blocks of ``seq``, leaving a token out."""
        if not self._pool.enable_caching:
            return NO_HITS
        # A full hit still recomputes the last token: its logits are needed to sample.
        limit = (seq.num_tokens - 1) // self._block_size
        if seq.next_scored < seq.num_prompt_tokens:
            # Prompt log probabilities: the row before each scored token must be computed,
            # so only blocks wholly before it may come from the cache.
            limit = min(limit, (seq.next_scored - 1) // self._block_size)
        hits: list[int] = []
        for block_hash in self._block_hashes(seq, limit)[:limit]:
            block_id = self._pool.get_cached(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return ComputedBlocks(hits, len(hits) * self._block_size) if hits else NO_HITS

    def allocate_slots(
        self,
        seq: Sequence,
        num_new_tokens: int,
        computed: ComputedBlocks = NO_HITS,
        keep_free: int = 0,
    ) -> bool:
        """Grow (or start) the table of ``seq``; False, changing nothing, when it does not fit."""
        pool = self._pool
        table = self._tables.get(seq.request_id)
        if table is None:
            hits = computed.block_ids
            fresh = max(0, cdiv(computed.num_tokens + num_new_tokens, self._block_size) - len(hits))
            # Reviving a cached block that nobody holds takes it off the free list too.
            idle_hits = sum(1 for block_id in hits if pool.ref_count(block_id) == 0)
            if fresh + idle_hits + keep_free > pool.num_free_blocks:
                return False
            keep = seq.priority is Priority.INTERACTIVE
            pool.touch(hits, keep)
            table = list(hits)
            self._start(seq, table, computed)
            self._num_cached[seq.request_id] = len(hits)
            table.extend(pool.take(fresh))
            return True
        need = cdiv(seq.num_computed_tokens + num_new_tokens, self._block_size) - len(table)
        if need + keep_free > pool.num_free_blocks and need > 0:
            return False
        if need > 0:
            table.extend(pool.take(need))
        return True

    def cache_blocks(self, seq: Sequence) -> None:
        """Register the full blocks of ``seq`` whose every token is computed."""
        rid = seq.request_id
        table = self._tables.get(rid)
        if table is None or not self._pool.enable_caching:
            return
        done = self._num_cached[rid]
        full = min(seq.num_computed_tokens // self._block_size, len(table))
        if full <= done:
            return
        hashes = self._block_hashes(seq, full)
        keep = seq.priority is Priority.INTERACTIVE
        for i in range(done, full):
            self._pool.cache(table[i], hashes[i], keep)
        self._num_cached[rid] = full

    def free(self, seq: Sequence) -> None:
        """Release the blocks of ``seq``, tail first so its tail is evicted first."""
        table = self._forget(seq)
        if table is not None:
            self._pool.free(reversed(table))
        self._hashes.pop(seq.request_id, None)
        self._num_cached.pop(seq.request_id, None)
