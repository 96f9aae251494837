"""One packed step's attention metadata, and the paged_attention signature built around it.

A step's metadata (block tables, lengths, where each sequence's queries start) is the same
in every layer, so the caller builds one ``PagedAttentionInputs`` per step and hands the
same object to each layer's call. What differs from layer to layer stays plain parameters
of ``paged_attention``: the queries, that layer's key/value caches, its scale, sliding
window and soft-cap. transformers passes those per call (Gemma 2 alternates windowed and
full layers), and bundling them would build an object per layer per step on the CPU
decode path, where a step's Python overhead is measured in microseconds.

The step's plan cache rides with the metadata it was worked out from: the torch path's
plans (slots, layout, decode chunks) hold for exactly these tables and lengths, so tying
the two together means a cache can never be reused with another step's tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

# What one step's layers share (the same block tables and lengths in every layer), worked
# out by the first layer and reused by the others: a dict the caller makes for each step.
PlanCache = dict[object, object]


@dataclass(frozen=True, slots=True, eq=False)
class PagedAttentionInputs:
    """Where a packed step's queries sit and which paged K/V each sequence reads.

    ``block_tables`` [num_seqs, max_blocks] maps each sequence's logical blocks to pool
    blocks; ``context_lens`` [num_seqs] counts its keys, this step's new tokens included;
    ``query_start_loc`` [num_seqs + 1] is where each one's queries start in the packed
    step (int32 or int64, on the queries' device). ``max_query_len`` and
    ``max_context_len`` are the largest of those lengths, known on the host, so a kernel
    can size its launch without reading the device. ``plan_cache``: a dict shared by the
    step's layers so the torch path plans once per step (None: plan on every call;
    Triton reads the tables on the device and ignores it).
    """

    # eq=False: tensors do not compare to a bool, so a step is equal only to itself.
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_context_len: int
    # Left out of repr: once the layers have run, it holds a step's worth of plans.
    plan_cache: PlanCache | None = field(default=None, repr=False)


class AttentionFn(Protocol):
    """The paged_attention signature every backend implements (dispatch adds ``backend``)."""

    def __call__(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        inputs: PagedAttentionInputs,
        scale: float,
        *,
        out: torch.Tensor | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Attend; see dispatch.paged_attention."""
        ...
