"""Launch-shape choices for the Triton attention kernels (plain Python, no Triton import)."""

from __future__ import annotations

import functools

import torch

from paged_llm.kernels.triton.support import next_power_of_2

# Split-KV only pays when the context is long enough that each slice still streams a lot.
SPLIT_MIN_CONTEXT = 1024
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64
_STAGE_BYTES = 32 << 10


def tile_shape(
    gqa_ratio: int, max_query_len: int, head_pad: int, element_size: int
) -> tuple[int, int, int]:
    """Return (BLOCK_M, BLOCK_Q, TILE_N): rows per program, queries per program, KV tile."""
    group = next_power_of_2(gqa_ratio)
    if max_query_len == 1:
        # Decode: one query per sequence; 16 rows is tl.dot's minimum. Longer KV tiles keep
        # more loads in flight, up to 32 KiB of K+V per pipeline stage so two stages fit the
        # ~100 KiB of shared memory consumer GPUs give a program.
        block_m = max(16, group)
        tile_n = max(16, min(64, _STAGE_BYTES // (2 * head_pad * element_size)))
    else:
        block_m = max(64 if max_query_len * gqa_ratio > 16 else 16, group)
        tile_n = max(16, min(32, _STAGE_BYTES // (2 * head_pad * element_size)))
    return block_m, max(1, block_m // gqa_ratio), tile_n


def choose_num_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_query_len: int,
    max_context_len: int,
    device: torch.device,
) -> int:
    """How many KV slices a decode step uses: >1 only when few programs face long contexts."""
    if max_query_len != 1 or max_context_len < SPLIT_MIN_CONTEXT:
        return 1
    programs = num_seqs * num_kv_heads
    units = multiprocessor_count(device)
    if programs >= units:
        return 1
    wanted = -(-2 * units // programs)  # about two waves of programs over the device
    return max(1, min(wanted, max_context_len // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


@functools.cache
def _cuda_multiprocessors(index: int) -> int:
    """Streaming multiprocessors of one CUDA device (cached: the query is not free)."""
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def multiprocessor_count(device: torch.device) -> int:
    """Parallel units to fill; 1 off CUDA, where splitting only adds work."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_multiprocessors(index)
