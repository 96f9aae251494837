"""Paged KV cache manager: per-sequence block tables over a shared block pool."""

from __future__ import annotations

from typing import Protocol

from .block_pool import ROOT_HASH, BlockHash, BlockPool, hash_block
from .sequence import Sequence


class KVManager(Protocol):
    """What the scheduler and the model runner need from a KV allocator."""

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        ...

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds."""
        ...

    @property
    def usage(self) -> float:
        """Used blocks over all blocks, 0 to 1."""
        ...

    @property
    def num_live_tokens(self) -> int:
        """Tokens whose K/V is stored."""
        ...

    @property
    def num_allocated_slots(self) -> int:
        """Token slots in blocks held by sequences."""
        ...

    @property
    def prefix_cache_queries(self) -> int:
        """Tokens looked up in the prefix cache."""
        ...

    @property
    def prefix_cache_hits(self) -> int:
        """Tokens found in the prefix cache."""
        ...

    def max_blocks(self, seq: Sequence) -> int:
        """Return the most blocks ``seq`` can hold at once (admission compares it to the pool)."""
        ...

    def get_computed_tokens(self, seq: Sequence) -> int:
        """Leading tokens of a new sequence already cached, leaving at least one to compute."""
        ...

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether ``allocate(seq, num_new_tokens)`` would succeed now."""
        ...

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make the block table cover the computed tokens plus ``num_new_tokens``."""
        ...

    def cache_blocks(self, seq: Sequence) -> None:
        """Register the newly computed full blocks of ``seq`` for prefix sharing."""
        ...

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq``."""
        ...

    def block_table(self, seq: Sequence) -> list[int]:
        """Return the physical block ids of ``seq`` in logical order (the live list)."""
        ...


class PrefixStats:
    """Prefix-cache query and hit counters in tokens, counted once per admission.

    The scheduler may look a waiting request up on every step until it fits; only the
    latest lookup before its admission counts, so retries do not inflate the figures.
    """

    __slots__ = ("_pending", "hits", "queries")

    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0
        self._pending: dict[str, tuple[int, int]] = {}

    def record(self, request_id: str, queries: int, hits: int) -> None:
        """Count a lookup, replacing an earlier one for the same not-yet-admitted request."""
        old_queries, old_hits = self._pending.get(request_id, (0, 0))
        self.queries += queries - old_queries
        self.hits += hits - old_hits
        self._pending[request_id] = (queries, hits)

    def settle(self, request_id: str) -> None:
        """Keep the request's last lookup for good (it was admitted, or it went away)."""
        self._pending.pop(request_id, None)


class KVCacheManager:
    """Block tables over a :class:`BlockPool`, with prefix sharing through block hashes."""

    __slots__ = ("_block_size", "_hashes", "_num_cached", "_pool", "_seqs", "_stats", "_tables")

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self._pool = BlockPool(num_blocks, block_size, enable_prefix_caching)
        self._block_size = block_size
        self._tables: dict[str, list[int]] = {}
        self._seqs: dict[str, Sequence] = {}
        # Content hashes of each sequence's full blocks, computed once and extended.
        self._hashes: dict[str, list[BlockHash]] = {}
        # How many leading blocks of each table are registered in the pool already.
        self._num_cached: dict[str, int] = {}
        self._stats = PrefixStats()

    @property
    def pool(self) -> BlockPool:
        """The underlying block pool."""
        return self._pool

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._pool.num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self._pool.num_used_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, cached ones included."""
        return self._pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Used blocks over all blocks, 0 to 1."""
        return self._pool.num_used_blocks / self._pool.num_blocks

    @property
    def num_live_tokens(self) -> int:
        """Tokens whose K/V is stored, a token in a shared block counted once."""
        b = self._block_size
        per_seq = sum(
            min(len(self._tables[rid]) * b, seq.num_computed_tokens)
            for rid, seq in self._seqs.items()
        )
        # Shared blocks are full and computed in every table holding them.
        return per_seq - self._pool.num_extra_refs * b

    @property
    def num_allocated_slots(self) -> int:
        """Token slots in blocks held by sequences, a shared block counted once."""
        return self._pool.num_used_blocks * self._block_size

    @property
    def prefix_cache_queries(self) -> int:
        """Tokens looked up in the prefix cache."""
        return self._stats.queries

    @property
    def prefix_cache_hits(self) -> int:
        """Tokens found in the prefix cache."""
        return self._stats.hits

    def max_blocks(self, seq: Sequence) -> int:
        """Blocks for prompt plus max_tokens: what ``seq`` may hold at its longest."""
        return -(-seq.max_total_tokens // self._block_size)

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

    def _lookup(self, seq: Sequence) -> list[int]:
        """Find cached blocks holding the leading full blocks of ``seq``, leaving a token out."""
        if not self._pool.enable_caching:
            return []
        # A full hit still recomputes the last token: its logits are needed to sample.
        limit = (seq.num_tokens - 1) // self._block_size
        hits: list[int] = []
        for block_hash in self._block_hashes(seq, limit)[:limit]:
            block_id = self._pool.get_cached(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def get_computed_tokens(self, seq: Sequence) -> int:
        """Leading tokens of a new sequence already in cached blocks, in whole blocks.

        Takes no reference. Counts ``num_tokens`` queries and the hit in tokens; a repeated
        lookup of a request not admitted yet replaces its earlier count.
        """
        hit = len(self._lookup(seq)) * self._block_size
        self._stats.record(seq.request_id, seq.num_tokens, hit)
        return hit

    def _blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self._block_size)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether ``allocate(seq, num_new_tokens)`` would succeed now."""
        table = self._tables.get(seq.request_id)
        if table is not None:
            need = self._blocks_for(seq.num_computed_tokens + num_new_tokens) - len(table)
            return need <= self._pool.num_free_blocks
        return self._fits(seq, num_new_tokens, self._lookup(seq))

    def _fits(self, seq: Sequence, num_new_tokens: int, hits: list[int]) -> bool:
        """Whether the free list covers the hits it must give up plus the fresh blocks."""
        pool = self._pool
        hit_tokens = len(hits) * self._block_size
        fresh = max(0, self._blocks_for(hit_tokens + num_new_tokens) - len(hits))
        # Reviving a cached block that nobody holds takes it off the free list too.
        idle_hits = sum(1 for block_id in hits if pool.ref_count(block_id) == 0)
        return fresh + idle_hits <= pool.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow the table of ``seq`` to cover its computed tokens plus ``num_new_tokens``.

        A sequence without a table first takes the cached blocks of its prefix and
        starts with ``num_computed_tokens`` at the hit.
        """
        rid = seq.request_id
        table = self._tables.get(rid)
        if table is None:
            hits = self._lookup(seq)
            if not self._fits(seq, num_new_tokens, hits):
                raise RuntimeError(
                    f"cannot allocate {num_new_tokens} tokens for request {rid!r}: "
                    f"{self._pool.num_free_blocks} blocks free; call can_allocate first"
                )
            hit_tokens = len(hits) * self._block_size
            self._stats.record(rid, seq.num_tokens, hit_tokens)
            self._stats.settle(rid)
            self._pool.touch(hits)
            table = hits
            self._tables[rid] = table
            self._seqs[rid] = seq
            self._num_cached[rid] = len(hits)
            seq.num_computed_tokens = hit_tokens
            seq.num_cached_tokens = hit_tokens
        need = self._blocks_for(seq.num_computed_tokens + num_new_tokens) - len(table)
        if need > 0:
            if need > self._pool.num_free_blocks:
                raise RuntimeError(
                    f"cannot allocate {need} blocks for request {rid!r}: "
                    f"{self._pool.num_free_blocks} free; call can_allocate first"
                )
            table.extend(self._pool.take(need))

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
        for i in range(done, full):
            self._pool.cache(table[i], hashes[i])
        self._num_cached[rid] = full

    def free(self, seq: Sequence) -> None:
        """Release the blocks of ``seq``, tail first so its tail is evicted first."""
        rid = seq.request_id
        table = self._tables.pop(rid, None)
        if table is not None:
            self._pool.free(reversed(table))
        self._seqs.pop(rid, None)
        self._hashes.pop(rid, None)
        self._num_cached.pop(rid, None)
        self._stats.settle(rid)

    def block_table(self, seq: Sequence) -> list[int]:
        """Return the physical block ids of ``seq`` in logical order: the live list."""
        try:
            return self._tables[seq.request_id]
        except KeyError:
            raise KeyError(f"request {seq.request_id!r} holds no KV blocks") from None

    def has_blocks(self, seq: Sequence) -> bool:
        """Whether ``seq`` holds a block table."""
        return seq.request_id in self._tables
