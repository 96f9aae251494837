"""Naive baseline allocator: one contiguous max-length KV region reserved per request."""

from __future__ import annotations

import bisect

from paged_llm.engine.core.kv.block_pool import cdiv
from paged_llm.engine.core.kv.manager import NO_HITS, ComputedBlocks, KVManager
from paged_llm.engine.core.sequence import Sequence

RESERVE_MODES = ("request", "max_model_len")


class ContiguousKVCacheManager(KVManager):
    """Reserves one run of consecutive blocks per sequence, first fit, no sharing.

    This is what a server without paging does: at admission a request gets the whole
    region it might ever use (prompt plus max_tokens, or the model's full context), so
    unused tail slots are wasted (internal fragmentation) and free memory splits into
    holes too small for the next request (external fragmentation). It has the same
    base class as :class:`KVCacheManager` so the benchmark can swap it in.
    """

    __slots__ = ("_free", "_max_model_len", "_num_used", "_reserve")

    def __init__(
        self, num_blocks: int, block_size: int, max_model_len: int, reserve: str = "request"
    ) -> None:
        super().__init__(num_blocks, block_size)
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        if reserve not in RESERVE_MODES:
            raise ValueError(f"reserve must be one of {RESERVE_MODES}, got {reserve!r}")
        self._max_model_len = max_model_len
        self._reserve = reserve
        # Free extents as (start, length), sorted by start and never adjacent.
        self._free: list[tuple[int, int]] = [(0, num_blocks)]
        self._num_used = 0

    @property
    def num_used_blocks(self) -> int:
        """Blocks reserved by sequences (the free rest may be split into unusable holes)."""
        return self._num_used

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
        return cdiv(self.reserve_tokens(seq), self._block_size)

    def _first_fit(self, count: int, keep_free: int) -> int | None:
        """Index of the first free extent holding ``count`` blocks, if ``keep_free`` stay free."""
        if count + keep_free > self.num_free_blocks:
            return None
        for i, (_, length) in enumerate(self._free):
            if length >= count:
                return i
        return None

    def allocate_slots(
        self,
        seq: Sequence,
        num_new_tokens: int,
        computed: ComputedBlocks = NO_HITS,
        keep_free: int = 0,
    ) -> bool:
        """Reserve the whole region at the first call; later calls only check it covers."""
        table = self._tables.get(seq.request_id)
        if table is not None:
            return seq.num_computed_tokens + num_new_tokens <= len(table) * self._block_size
        count = self.max_blocks(seq)
        if num_new_tokens > count * self._block_size:
            return False
        index = self._first_fit(count, keep_free)
        if index is None:
            return False
        start, length = self._free[index]
        if length == count:
            del self._free[index]
        else:
            self._free[index] = (start + count, length - count)
        self._num_used += count
        self._start(seq, list(range(start, start + count)), NO_HITS)
        return True

    def cache_blocks(self, seq: Sequence) -> None:
        """Nothing to register: this allocator shares nothing."""

    def free(self, seq: Sequence) -> None:
        """Return the reservation of ``seq`` as one free extent, merged with its neighbours."""
        table = self._forget(seq)
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
