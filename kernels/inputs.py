"""One packed step's attention metadata, and one layer's attention call built around it.

A step's metadata (block tables, lengths, where each sequence's queries start) is the same
in every layer, so the caller builds one ``PagedAttentionInputs`` per step and hands the
same object to each layer. What differs from layer to layer (the queries, that layer's
key/value caches, its scale, sliding window and soft-cap; Gemma 2 alternates windowed and
full layers) goes with it into one ``AttentionCall`` per layer, which is the single
argument every paged_attention backend takes: the signature is written once, here, and
``AttentionFn`` holds each backend to it. That costs one small object per layer per step
(under a microsecond to build), and only on transformers' forward, whose layers already
spend far longer in Python and framework calls: the CPU's C forward (cpu_forward.py) runs
a step's layers, attention included, in native code and never builds one.

The step's plan cache rides with the metadata it was worked out from: the torch path's
plans (slots, layout, decode chunks) hold for exactly these tables and lengths, so tying
the two together means a cache can never be reused with another step's tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True, eq=False)
class AttentionCall:
    """One layer's paged attention in a packed step: what every backend's paged_attention takes.

    ``query`` [num_tokens, num_heads, head_dim] holds the step's packed queries;
    ``key_cache`` and ``value_cache`` [num_blocks, block_size, num_kv_heads, head_dim] are
    this layer's pool; ``inputs`` is the step's metadata, the same object in every layer.
    ``sliding_window`` (a layer's window, as transformers passes it) limits each query to
    keys less than that many positions back; ``softcap`` caps the scaled scores at
    +-softcap through tanh. ``out``: where to write the result (None: a new tensor).
    """

    # eq=False: tensors do not compare to a bool, so a call is equal only to itself.
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    inputs: PagedAttentionInputs
    scale: float
    sliding_window: int | None = None
    softcap: float | None = None
    out: torch.Tensor | None = None


# The paged_attention every backend implements (dispatch and Triton add keyword options).
AttentionFn = Callable[[AttentionCall], torch.Tensor]
