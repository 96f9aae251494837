"""Argument checks shared by every backend, so a bad call fails the same way everywhere."""

from __future__ import annotations

import math

import torch

from paged_llm.kernels.inputs import AttentionCall

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


def _fail(message: str) -> None:
    """Raise the error every check uses."""
    raise ValueError(message)


def _check_cache_pair(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Both caches are [num_blocks, block_size, num_kv_heads, head_dim] of one shape."""
    if key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        _fail(
            "key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_dim], got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )


def check_store_args(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Check shapes, dtypes and devices of a store_kv call (host-side metadata only)."""
    if key.dim() != 3 or value.shape != key.shape:
        _fail(
            "key and value must both be [num_tokens, num_kv_heads, head_dim], "
            f"got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    _check_cache_pair(key_cache, value_cache)
    if key.shape[1:] != key_cache.shape[2:]:
        _fail(
            f"key heads/dim {tuple(key.shape[1:])} do not match the cache's "
            f"{tuple(key_cache.shape[2:])}"
        )
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0]:
        _fail(f"slot_mapping must be [num_tokens={key.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in _INDEX_DTYPES:
        _fail(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    _same_device(key, value, key_cache, value_cache, slot_mapping)


def check_attention_args(call: AttentionCall) -> None:
    """Check a paged_attention call's shapes, dtypes, devices, window and soft-cap (host side)."""
    query, key_cache, value_cache, out = call.query, call.key_cache, call.value_cache, call.out
    block_tables = call.inputs.block_tables
    context_lens, query_start_loc = call.inputs.context_lens, call.inputs.query_start_loc
    if query.dim() != 3:
        _fail(f"query must be [num_tokens, num_heads, head_dim], got {tuple(query.shape)}")
    if query.dtype not in SUPPORTED_DTYPES:
        _fail(f"query dtype must be float16, bfloat16 or float32, got {query.dtype}")
    _check_cache_pair(key_cache, value_cache)
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        _fail(
            f"caches ({key_cache.dtype}, {value_cache.dtype}) must have query's dtype {query.dtype}"
        )
    if key_cache.shape[3] != head_dim:
        _fail(f"query head_dim {head_dim} differs from the cache's {key_cache.shape[3]}")
    if num_heads % num_kv_heads != 0:
        _fail(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    num_seqs = context_lens.shape[0] if context_lens.dim() == 1 else -1
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        _fail(
            "block_tables must be [num_seqs, max_blocks_per_seq] and context_lens [num_seqs], "
            f"got {tuple(block_tables.shape)} and {tuple(context_lens.shape)}"
        )
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] != num_seqs + 1:
        _fail(
            f"query_start_loc must be [num_seqs + 1 = {num_seqs + 1}], "
            f"got {tuple(query_start_loc.shape)}"
        )
    for name, tensor in (
        ("block_tables", block_tables),
        ("context_lens", context_lens),
        ("query_start_loc", query_start_loc),
    ):
        if tensor.dtype not in _INDEX_DTYPES:
            _fail(f"{name} must be int32 or int64, got {tensor.dtype}")
    if out is not None and (out.shape != query.shape or out.dtype != query.dtype):
        _fail(
            f"out must match query ({tuple(query.shape)}, {query.dtype}), "
            f"got {tuple(out.shape)}, {out.dtype}"
        )
    tensors = [query, key_cache, value_cache, block_tables, context_lens, query_start_loc]
    _same_device(*tensors, *([out] if out is not None else []))
    _check_score_args(call.sliding_window, call.softcap)


def _check_score_args(sliding_window: object, softcap: object) -> None:
    """A window is a positive integer and a soft-cap a positive finite number, or None."""
    if sliding_window is not None and (
        isinstance(sliding_window, bool)
        or not isinstance(sliding_window, int)
        or sliding_window < 1
    ):
        _fail(f"sliding_window must be a positive integer or None, got {sliding_window!r}")
    if softcap is not None and (
        isinstance(softcap, bool)
        or not isinstance(softcap, int | float)
        or not math.isfinite(softcap)
        or softcap <= 0
    ):
        _fail(f"softcap must be a positive finite number or None, got {softcap!r}")


def _same_device(*tensors: torch.Tensor) -> None:
    """Fail unless all tensors live on one device."""
    devices = {tensor.device for tensor in tensors}
    if len(devices) > 1:
        _fail(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
