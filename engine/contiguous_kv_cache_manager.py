"""Naive baseline allocator: one contiguous max-length KV region reserved per request."""

from __future__ import annotations

import bisect

from .kv_cache_manager import PrefixStats
from .sequence import Sequence

RESERVE_MODES = ("request", "max_model_len")


class ContiguousKVCacheManager:
    """Reserves one run of consecutive blocks per sequence, first fit, no sharing.

    This is what a server without paging does: at admission a request gets the whole
    region it might ever use (prompt plus max_tokens, or the model's full context), so
    unused tail slots are wasted (internal fragmentation) and free memory splits into
    holes too small for the next request (external fragmentation). It has the same
    interface as :class:`KVCacheManager` so the benchmark can swap it in.
    """

    __slots__ = (
        "_block_size",
        "_free",
        "_max_model_len",
        "_num_blocks",
        "_num_used",
        "_reserve",
        "_seqs",
        "_stats",
        "_tables",
    )

    def __init__(
        self, num_blocks: int, block_size: int, max_model_len: int, reserve: str = "request"
    ) -> None:
        if num_blocks < 1 or block_size < 1 or max_model_len < 1:
            raise ValueError(
                "num_blocks, block_size and max_model_len must be >= 1, got "
                f"{num_blocks}, {block_size}, {max_model_len}"
            )
        if reserve not in RESERVE_MODES:
            raise ValueError(f"reserve must be one of {RESERVE_MODES}, got {reserve!r}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._max_model_len = max_model_len
        self._reserve = reserve
        # Free extents as (start, length), sorted by start and never adjacent.
        self._free: list[tuple[int, int]] = [(0, num_blocks)]
        self._num_used = 0
        self._tables: dict[str, list[int]] = {}
        self._seqs: dict[str, Sequence] = {}
        self._stats = PrefixStats()

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def num_used_blocks(self) -> int:
        """Blocks reserved by sequences."""
        return self._num_used

    @property
    def num_free_blocks(self) -> int:
        """Blocks not reserved (possibly split into unusable holes)."""
        return self._num_blocks - self._num_used

    @property
    def usage(self) -> float:
        """Reserved blocks over all blocks, 0 to 1."""
        return self._num_used / self._num_blocks

    @property
    def num_live_tokens(self) -> int:
        """Tokens whose K/V is stored, over all sequences holding a reservation."""
        b = self._block_size
        return sum(
            min(len(self._tables[rid]) * b, seq.num_computed_tokens)
            for rid, seq in self._seqs.items()
        )

    @property
    def num_allocated_slots(self) -> int:
        """Token slots in reserved blocks."""
        return self._num_used * self._block_size

    @property
    def prefix_cache_queries(self) -> int:
        """Tokens looked up (this allocator never finds any)."""
        return self._stats.queries

    @property
    def prefix_cache_hits(self) -> int:
        """Always 0: nothing is shared."""
        return self._stats.hits

    @property
    def free_extents(self) -> list[tuple[int, int]]:
        """Free runs as (first block, length), in block order (a copy)."""
        return list(self._free)

    def reserve_tokens(self, seq: Sequence) -> int:
        """Tokens reserved for ``seq`` at its first allocation."""
        if self._reserve == "max_model_len":
            return self._max_model_len
        return seq.max_total_tokens

    def max_blocks(self, seq: Sequence) -> int:
        """Blocks of the reservation ``seq`` needs in one piece."""
        return -(-self.reserve_tokens(seq) // self._block_size)

    def get_computed_tokens(self, seq: Sequence) -> int:
        """Return 0 (no prefix sharing), still counting the query."""
        self._stats.record(seq.request_id, seq.num_tokens, 0)
        return 0

    def _first_fit(self, count: int) -> int | None:
        """Index of the first free extent holding ``count`` blocks."""
        for i, (_, length) in enumerate(self._free):
            if length >= count:
                return i
        return None

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether the reservation exists and covers the tokens, or one can be made."""
        table = self._tables.get(seq.request_id)
        if table is not None:
            return seq.num_computed_tokens + num_new_tokens <= len(table) * self._block_size
        count = self.max_blocks(seq)
        if num_new_tokens > count * self._block_size:
            return False
        return self._first_fit(count) is not None

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Reserve the whole region at the first call; later calls only check it covers."""
        rid = seq.request_id
        table = self._tables.get(rid)
        if table is not None:
            if seq.num_computed_tokens + num_new_tokens > len(table) * self._block_size:
                raise RuntimeError(
                    f"request {rid!r} outgrew its reservation of {len(table)} blocks"
                )
            return
        count = self.max_blocks(seq)
        index = self._first_fit(count) if num_new_tokens <= count * self._block_size else None
        if index is None:
            raise RuntimeError(
                f"cannot reserve {count} contiguous blocks for request {rid!r}: "
                f"{self.num_free_blocks} free in {len(self._free)} pieces; "
                "call can_allocate first"
            )
        start, length = self._free[index]
        if length == count:
            del self._free[index]
        else:
            self._free[index] = (start + count, length - count)
        self._num_used += count
        self._tables[rid] = list(range(start, start + count))
        self._seqs[rid] = seq
        self._stats.record(rid, seq.num_tokens, 0)
        self._stats.settle(rid)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0

    def cache_blocks(self, seq: Sequence) -> None:
        """Nothing to register: this allocator shares nothing."""

    def free(self, seq: Sequence) -> None:
        """Return the reservation of ``seq`` as one free extent, merged with its neighbours."""
        rid = seq.request_id
        self._stats.settle(rid)
        self._seqs.pop(rid, None)
        table = self._tables.pop(rid, None)
        if not table:
            return
        start, length = table[0], len(table)
        self._num_used -= length
        free = self._free
        i = bisect.bisect_left(free, (start, 0))
        if i < len(free) and free[i][0] == start + length:
            length += free[i][1]
            del free[i]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == start:
            start, length = free[i - 1][0], free[i - 1][1] + length
            i -= 1
            del free[i]
        free.insert(i, (start, length))

    def block_table(self, seq: Sequence) -> list[int]:
        """Return the reserved block ids of ``seq`` in order: the live list, not a copy."""
        try:
            return self._tables[seq.request_id]
        except KeyError:
            raise KeyError(f"request {seq.request_id!r} holds no KV blocks") from None

    def has_blocks(self, seq: Sequence) -> bool:
        """Whether ``seq`` holds a reservation."""
        return seq.request_id in self._tables
