"""A compact picture of the KV pool: one byte per block saying who holds it, for live views."""

from __future__ import annotations

import base64
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from paged_llm.engine.core.kv.block_pool import BlockPool
from paged_llm.engine.core.sequence import Priority, Sequence

# Bit 3 of a cell: more than one sequence holds the block (a shared prompt prefix).
SHARED = 0x08
# The low three bits of a cell.
STATE_MASK = 0x07


class BlockState(enum.IntEnum):
    """What a block holds; a cell is this value, plus SHARED when several sequences hold it."""

    FREE = 0
    CACHED = 1  # nobody holds it, but it still holds a reusable prefix
    INTERACTIVE = 2
    AUTOMATION = 3
    BACKGROUND = 4

    @classmethod
    def for_priority(cls, priority: Priority) -> BlockState:
        """The in-use state of a block held by a sequence of this class."""
        return cls(cls.INTERACTIVE + int(priority))


class _Tables(Protocol):
    """What the block map reads from a KV manager (both allocators have it)."""

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        ...

    def has_blocks(self, seq: Sequence) -> bool:
        """Whether ``seq`` holds blocks."""
        ...

    def block_table(self, seq: Sequence) -> list[int]:
        """The physical blocks of ``seq``."""
        ...


@dataclass(slots=True, frozen=True)
class BlockMap:
    """The pool at one moment: ``cells[i]`` is block i's state, counts beside it.

    ``used + cached + free == num_blocks``; ``used`` equals the KV manager's
    ``num_used_blocks`` and ``cached + free`` its ``num_free_blocks``.
    """

    timestamp: float
    block_size: int
    cells: bytes
    used: int
    cached: int
    free: int
    shared: int
    used_by_class: dict[str, int]
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_preemptions: int = 0

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return len(self.cells)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form; the cells travel as base64 (4 characters per 3 blocks)."""
        return {
            "timestamp": self.timestamp,
            "num_blocks": len(self.cells),
            "block_size": self.block_size,
            "cells": base64.b64encode(self.cells).decode("ascii"),
            "used": self.used,
            "cached": self.cached,
            "free": self.free,
            "shared": self.shared,
            "used_by_class": dict(self.used_by_class),
            "num_requests_running": self.num_requests_running,
            "num_requests_waiting": self.num_requests_waiting,
            "num_preemptions": self.num_preemptions,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BlockMap:
        """Read ``as_dict``'s form back (raises ValueError naming a field that does not fit)."""
        try:
            cells = base64.b64decode(data["cells"], validate=True)
            block_map = cls(
                timestamp=float(data["timestamp"]),
                block_size=int(data["block_size"]),
                cells=cells,
                used=int(data["used"]),
                cached=int(data["cached"]),
                free=int(data["free"]),
                shared=int(data["shared"]),
                used_by_class={str(k): int(v) for k, v in dict(data["used_by_class"]).items()},
                num_requests_running=int(data.get("num_requests_running", 0)),
                num_requests_waiting=int(data.get("num_requests_waiting", 0)),
                num_preemptions=int(data.get("num_preemptions", 0)),
            )
        except KeyError as err:
            raise ValueError(f"block map lacks the field {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"block map has a malformed field: {err}") from None
        if int(data.get("num_blocks", len(cells))) != len(cells):
            raise ValueError("block map's num_blocks does not match its cells")
        if block_map.used + block_map.cached + block_map.free != len(cells):
            raise ValueError("block map's used + cached + free differs from num_blocks")
        return block_map


_CLASS_NAMES = {BlockState.for_priority(p): p.name.lower() for p in Priority}


def take_block_map(
    kv: _Tables,
    running: Iterable[Sequence],
    *,
    timestamp: float = 0.0,
    num_waiting: int = 0,
    num_preemptions: int = 0,
) -> BlockMap:
    """Paint every block of the pool; call from the thread that steps the engine.

    Cost is linear in the blocks held plus the free ones: one pass over each running
    sequence's block table, one over the free list when prefix caching is on.
    """
    num_blocks = kv.num_blocks
    cells = bytearray(num_blocks)
    pool = getattr(kv, "pool", None)
    if isinstance(pool, BlockPool) and pool.num_free_cached_blocks:
        block_hash = pool.block_hash
        cached = int(BlockState.CACHED)
        for block_id in pool.free_block_ids():
            if block_hash(block_id) is not None:
                cells[block_id] = cached
    # Plain ints in the loop: enum attribute lookups would double its cost.
    first_used = int(BlockState.INTERACTIVE)
    num_running = 0
    for seq in running:
        num_running += 1
        if not kv.has_blocks(seq):
            continue
        code = first_used + int(seq.priority)
        for block_id in kv.block_table(seq):
            old = cells[block_id]
            if old < first_used:
                cells[block_id] = code
            else:
                # Held twice: the better (lower) class wins the colour.
                cells[block_id] = min(old & STATE_MASK, code) | SHARED
    counts = [cells.count(state) for state in range(SHARED)]
    shared_counts = [cells.count(state | SHARED) for state in range(SHARED)]
    by_class = {name: counts[state] + shared_counts[state] for state, name in _CLASS_NAMES.items()}
    used = sum(by_class.values())
    return BlockMap(
        timestamp=timestamp,
        block_size=kv.block_size,
        cells=bytes(cells),
        used=used,
        cached=counts[BlockState.CACHED],
        free=counts[BlockState.FREE],
        shared=sum(shared_counts),
        used_by_class=by_class,
        num_requests_running=num_running,
        num_requests_waiting=num_waiting,
        num_preemptions=num_preemptions,
    )
