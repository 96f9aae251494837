"""Physical KV blocks: free list, reference counts and content hashes for prefix sharing."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

# A full block's identity: a digest of its parent's digest and its own token ids.
BlockHash = bytes

# The root of every hash chain: the parent of a sequence's first block.
ROOT_HASH: BlockHash = b""


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``: blocks for ``a`` tokens."""
    return -(-a // b)


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Chained content hash of one full block.

    A cryptographic digest (not Python's ``hash``) so that two different prefixes cannot
    collide by accident or on purpose: a collision would hand one request another's KV.
    """
    data = array("q", token_ids).tobytes()
    return hashlib.blake2b(parent + data, digest_size=16).digest()


class BlockPool:
    """Hands out physical block ids, counts their users and remembers what full ones hold.

    Free blocks sit in two ``OrderedDict`` LRU queues, each taken from the front: kept
    blocks (cached content an interactive request computed or reused, such as the voice
    system prompt) are taken only when the other queue is empty. A block whose last user
    leaves keeps its hash, so a later request with the same prefix can take it back; it
    is evicted (its hash forgotten) only when it is handed out for new data.
    """

    __slots__ = (
        "_block_size",
        "_cached",
        "_enable_caching",
        "_extra_refs",
        "_free",
        "_free_cached",
        "_free_kept",
        "_hashes",
        "_keep",
        "_num_blocks",
        "_ref_counts",
    )

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._enable_caching = enable_caching
        self._ref_counts = [0] * num_blocks
        self._hashes: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._free_kept: OrderedDict[int, None] = OrderedDict()
        self._keep = [False] * num_blocks
        self._extra_refs = 0
        # Free blocks that still hold a registered hash: counted as they move, not scanned.
        self._free_cached = 0

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def enable_caching(self) -> bool:
        """Whether full blocks are kept for prefix sharing."""
        return self._enable_caching

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached ones included: they can be reclaimed)."""
        return len(self._free) + len(self._free_kept)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with at least one user."""
        return self._num_blocks - self.num_free_blocks

    @property
    def num_extra_refs(self) -> int:
        """References beyond the first, over all blocks: how often a block is shared."""
        return self._extra_refs

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content is registered for prefix sharing, in use or not."""
        return len(self._cached)

    @property
    def num_free_cached_blocks(self) -> int:
        """Free blocks whose content is still registered: reclaimable, but a later hit."""
        return self._free_cached

    def ref_count(self, block_id: int) -> int:
        """How many block tables hold this block."""
        return self._ref_counts[block_id]

    def is_kept(self, block_id: int) -> bool:
        """Whether the block's content is evicted only after every other cached block."""
        return self._keep[block_id]

    def block_hash(self, block_id: int) -> BlockHash | None:
        """Return the registered content hash of a block, if any."""
        return self._hashes[block_id]

    def get_cached(self, block_hash: BlockHash) -> int | None:
        """Return the block holding this content; None if never cached or evicted since."""
        return self._cached.get(block_hash)

    def take(self, count: int) -> list[int]:
        """Take ``count`` free blocks for new data, each with one user; evicts their old hashes."""
        if count > self.num_free_blocks:
            raise RuntimeError(
                f"block pool exhausted: {count} blocks asked, {self.num_free_blocks} free"
            )
        taken: list[int] = []
        for _ in range(count):
            queue = self._free or self._free_kept
            block_id, _ = queue.popitem(last=False)
            old = self._hashes[block_id]
            if old is not None:
                # The data is about to be overwritten: a lookup must miss from now on.
                self._free_cached -= 1
                del self._cached[old]
                self._hashes[block_id] = None
                self._keep[block_id] = False
            self._ref_counts[block_id] = 1
            taken.append(block_id)
        return taken

    def touch(self, block_ids: Iterable[int], keep: bool = False) -> None:
        """Add one user to each (cached) block, taking it off the free list if it was idle.

        ``keep`` marks the blocks to be evicted last (an interactive request uses them).
        """
        for block_id in block_ids:
            if self._ref_counts[block_id] == 0:
                (self._free_kept if self._keep[block_id] else self._free).pop(block_id)
                if self._hashes[block_id] is not None:
                    self._free_cached -= 1
            else:
                self._extra_refs += 1
            self._ref_counts[block_id] += 1
            self._keep[block_id] |= keep

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one user from each block; blocks left unused join the free list in this order."""
        for block_id in block_ids:
            count = self._ref_counts[block_id]
            if count <= 0:
                raise RuntimeError(f"block {block_id} freed more often than taken")
            self._ref_counts[block_id] = count - 1
            if count > 1:
                self._extra_refs -= 1
                continue
            if self._hashes[block_id] is not None:
                self._free_cached += 1
            if self._keep[block_id]:
                self._free_kept[block_id] = None
            else:
                self._free[block_id] = None
                if self._hashes[block_id] is None:
                    # Nothing reusable in it: hand it out before any cached block.
                    self._free.move_to_end(block_id, last=False)

    def cache(self, block_id: int, block_hash: BlockHash, keep: bool = False) -> None:
        """Register a full, computed block's content so later requests can share it.

        ``keep`` marks it to be evicted after unmarked blocks (interactive content).
        """
        if not self._enable_caching or self._hashes[block_id] is not None:
            return
        if block_hash in self._cached:
            # Another block computed the same content first; keep that one, leave this
            # block unregistered so that one hash never names two blocks.
            return
        self._cached[block_hash] = block_id
        self._hashes[block_id] = block_hash
        self._keep[block_id] = keep
        if self._ref_counts[block_id] == 0:
            self._free_cached += 1

    def free_block_ids(self) -> list[int]:
        """List the free blocks in the order they will be taken (tests, diagnostics)."""
        return [*self._free, *self._free_kept]
