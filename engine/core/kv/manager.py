"""What every KV allocator shares: the scheduler's protocol, block tables and the figures.

The scheduler admits a waiting sequence in two calls, as vLLM does: ``get_computed_blocks``
looks its prefix up once (no side effects), then ``allocate_slots`` either takes the hits
plus fresh blocks and returns True, or changes nothing and returns False. A running
sequence grows with ``allocate_slots`` alone. Prefix-cache figures are counted when an
admission succeeds, so retries of a request that did not fit are never counted.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from paged_llm.engine.core.kv.block_pool import cdiv
from paged_llm.engine.core.sequence import Sequence


@dataclass(slots=True)
class ComputedBlocks:
    """The result of one prefix lookup: cached blocks holding a sequence's leading tokens."""

    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0


# The lookup of an allocator without prefix sharing, or of a sequence that shares nothing.
NO_HITS = ComputedBlocks()


class KVManager(abc.ABC):
    """Block tables per sequence over ``num_blocks`` blocks of ``block_size`` tokens."""

    __slots__ = (
        "_block_size",
        "_num_blocks",
        "_seqs",
        "_tables",
        "prefix_cache_hits",
        "prefix_cache_queries",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._tables: dict[str, list[int]] = {}
        self._seqs: dict[str, Sequence] = {}
        # Tokens looked up and found, counted once per admission (vLLM's names).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # Figures --------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    @abc.abstractmethod
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds (cached ones included: they can be reclaimed)."""
        return self._num_blocks - self.num_used_blocks

    @property
    def num_free_cached_blocks(self) -> int:
        """Free blocks that still hold a cached prefix (none without prefix caching)."""
        return 0

    @property
    def usage(self) -> float:
        """Used blocks over all blocks, 0 to 1."""
        return self.num_used_blocks / self._num_blocks

    @property
    def num_live_tokens(self) -> int:
        """Tokens whose K/V is stored (a manager that shares blocks counts a slot once)."""
        b = self._block_size
        return sum(
            min(len(self._tables[rid]) * b, seq.num_computed_tokens)
            for rid, seq in self._seqs.items()
        )

    @property
    def num_allocated_slots(self) -> int:
        """Token slots in blocks held by sequences, a shared block counted once."""
        return self.num_used_blocks * self._block_size

    # Per sequence -----------------------------------------------------------------------

    def max_blocks(self, seq: Sequence) -> int:
        """Blocks ``seq`` holds at its longest (admission compares it to the pool)."""
        return cdiv(seq.max_total_tokens, self._block_size)

    def block_table(self, seq: Sequence) -> list[int]:
        """Return the physical block ids of ``seq`` in logical order: the live list."""
        try:
            return self._tables[seq.request_id]
        except KeyError:
            raise KeyError(f"request {seq.request_id!r} holds no KV blocks") from None

    def has_blocks(self, seq: Sequence) -> bool:
        """Whether ``seq`` holds a block table."""
        return seq.request_id in self._tables

    def _start(self, seq: Sequence, table: list[int], computed: ComputedBlocks) -> None:
        """Record a newly admitted sequence's table and count its lookup."""
        self._tables[seq.request_id] = table
        self._seqs[seq.request_id] = seq
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += computed.num_tokens
        seq.num_computed_tokens = computed.num_tokens
        seq.num_cached_tokens = computed.num_tokens

    def _forget(self, seq: Sequence) -> list[int] | None:
        """Drop the sequence's bookkeeping; return its table, None if it held none."""
        self._seqs.pop(seq.request_id, None)
        return self._tables.pop(seq.request_id, None)

    # What each allocator decides --------------------------------------------------------

    def get_computed_blocks(self, seq: Sequence) -> ComputedBlocks:
        """Cached blocks holding the leading tokens of a new sequence (no side effects).

        At least one token is left to compute: its logits are needed to sample.
        """
        return NO_HITS

    @abc.abstractmethod
    def allocate_slots(
        self,
        seq: Sequence,
        num_new_tokens: int,
        computed: ComputedBlocks = NO_HITS,
        keep_free: int = 0,
    ) -> bool:
        """Cover the computed tokens plus ``num_new_tokens``, leaving ``keep_free`` blocks free.

        A sequence without a table first takes ``computed`` (its lookup) and starts with
        ``num_computed_tokens`` at the hit. False, with nothing changed, when it does not fit.
        """

    def cache_blocks(self, seq: Sequence) -> None:  # noqa: B027 (sharing is optional)
        """Register the newly computed full blocks of ``seq`` for prefix sharing (no-op here)."""

    @abc.abstractmethod
    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq`` (a no-op when it holds none)."""
