"""Triton paged attention for one packed step, with a split-KV (flash-decoding) variant.

One program handles a block of one sequence's queries against one KV head: its rows are
(query token, query head of that KV head's group) pairs, so each K/V tile is loaded once
for the whole GQA group. Programs walk the sequence's KV through the block table in tiles
of TILE_N tokens with an online softmax in fp32. In split mode each program covers only a
slice of the tiles and writes a normalised partial output plus its log-sum-exp (base 2);
a second kernel merges the slices.

A sliding window starts each program's walk at the tile holding its first row's earliest
visible key, so out-of-window blocks are never loaded; soft-capping maps each scaled score
s to cap * tanh(s / cap) before the softmax.
"""

# Triton types a jitted kernel's parameters itself at launch; Python annotations there would
# be read by Triton as type hints, so the kernels' parameters stay unannotated.
# mypy: disable-error-code="no-untyped-def"

import math

import torch
import triton
import triton.language as tl

from paged_llm.kernels.inputs import AttentionCall, AttentionFn
from paged_llm.kernels.triton.config import choose_num_splits, tile_shape
from paged_llm.kernels.triton.support import is_interpreted, next_power_of_2


@triton.jit  # type: ignore[untyped-decorator]
def _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Binary-search the sequence whose query blocks include global block q_block."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        # Sequence s owns blocks from query_start_loc[s] // BLOCK_Q + s on (vLLM's numbering).
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["num_seqs", "num_splits", "window"])  # type: ignore[untyped-decorator]
def _attention_kernel(
    out_ptr,
    lse_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,
    score_scale,
    cap_log2e,
    window,
    num_seqs,
    num_splits,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GQA_RATIO: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Attend one block of a sequence's queries (one KV head's group) over a slice of its KV."""
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(context_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)
    q_idx = local_block * BLOCK_Q + rows // GQA_RATIO
    heads = kv_head * GQA_RATIO + rows % GQA_RATIO
    row_valid = (rows < BLOCK_Q * GQA_RATIO) & (q_idx < q_len)
    q_pos = ctx_len - q_len + q_idx
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_DIM
    tokens = (q_start + q_idx).to(tl.int64)
    row_mask = row_valid[:, None] & dim_valid[None, :]
    q_off = tokens[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :]
    q = tl.load(query_ptr + q_off, mask=row_mask, other=0.0)
    if DOT_UPCAST:
        q = q.to(tl.float32)

    # Keys after the block's last query position are invisible to all of its rows.
    kv_end = tl.minimum(ctx_len, ctx_len - q_len + (local_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE_N)
    first_tile = 0
    if WINDOWED:
        # Keys before the block's first query's window are invisible to all of its rows.
        first_pos = ctx_len - q_len + local_block * BLOCK_Q
        first_tile = tl.maximum(first_pos - window + 1, 0) // TILE_N
    tiles_per_split = tl.cdiv(num_tiles - first_tile, num_splits)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(tile_lo, tile_hi):
        kv_idx = tile * TILE_N + tl.arange(0, TILE_N)
        kv_valid = kv_idx < kv_end
        # Entries past the context may hold anything, so they are never read.
        block_ids = tl.load(block_table + kv_idx // BLOCK_SIZE, mask=kv_valid, other=0)
        block_ids = block_ids.to(tl.int64)
        in_block = kv_idx % BLOCK_SIZE
        k_off = block_ids * stride_kb + in_block * stride_kt + kv_head * stride_kh
        k_mask = dim_valid[:, None] & kv_valid[None, :]
        k = tl.load(key_cache_ptr + k_off[None, :] + dims[:, None], mask=k_mask, other=0.0)
        v_off = block_ids * stride_vb + in_block * stride_vt + kv_head * stride_vh
        v_mask = kv_valid[:, None] & dim_valid[None, :]
        v = tl.load(value_cache_ptr + v_off[:, None] + dims[None, :], mask=v_mask, other=0.0)
        if DOT_UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * score_scale
        if SOFTCAP:
            # tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends, where exp saturates.
            scores = (1.0 - 2.0 / (tl.exp(2.0 * scores) + 1.0)) * cap_log2e
        visible = (kv_idx[None, :] <= q_pos[:, None]) & kv_valid[None, :]
        if WINDOWED:
            visible = visible & (kv_idx[None, :] > q_pos[:, None] - window)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # A row that has seen no visible key yet keeps m = -inf; shift by 0 to avoid inf - inf.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if SPLIT:
        part_off = tokens[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + part_off + split * stride_os, out, mask=row_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + tokens * stride_lt + heads * stride_lh + split, lse, mask=row_valid)
    else:
        out_off = tokens[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit(do_not_specialize=["num_splits"])  # type: ignore[untyped-decorator]
def _merge_kernel(
    out_ptr,
    partial_ptr,
    lse_ptr,
    num_splits,
    stride_ot,
    stride_oh,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_lt,
    stride_lh,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Merge one (token, head)'s split partial outputs, weighting each by its log-sum-exp."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    lse_row = lse_ptr + token * stride_lt + head * stride_lh
    lse = tl.load(lse_row + splits, mask=splits < num_splits, other=float("-inf"))
    # Every query sees its own key, which one split holds, so the max is finite.
    weights = tl.exp2(lse - tl.max(lse, 0))
    used = (weights > 0)[:, None] & (dims < HEAD_DIM)[None, :]
    part_off = token * stride_pt + head * stride_ph + splits[:, None] * stride_ps + dims[None, :]
    parts = tl.load(partial_ptr + part_off, mask=used, other=0.0)
    out = tl.sum(parts * weights[:, None], 0) / tl.sum(weights, 0)
    out_ptrs = out_ptr + token * stride_ot + head * stride_oh + dims
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


INTERPRETED: bool = is_interpreted(_attention_kernel)


def paged_attention(call: AttentionCall, *, num_kv_splits: int | None = None) -> torch.Tensor:
    """Paged attention for a packed step; num_kv_splits forces the split-KV path (None: auto).

    ``call.inputs.plan_cache`` is not read: the kernel reads the tables on the device.
    """
    query, inputs, scale = call.query, call.inputs, call.scale
    key_cache, value_cache = call.key_cache, call.value_cache
    sliding_window, softcap, out = call.sliding_window, call.softcap, call.out
    max_query_len, max_context_len = inputs.max_query_len, inputs.max_context_len
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = inputs.context_lens.shape[0]
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("key_cache and value_cache need a unit-stride head_dim")
    query = query if query.stride(-1) == 1 else query.contiguous()
    target = out if out.stride(-1) == 1 else torch.empty_like(query)
    # One index dtype keeps one compiled variant; .to() is free when they already are int32.
    block_tables = inputs.block_tables.to(torch.int32)
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    context_lens = inputs.context_lens.to(torch.int32).contiguous()
    query_start_loc = inputs.query_start_loc.to(torch.int32).contiguous()

    ratio = num_heads // num_kv_heads
    head_pad = max(16, next_power_of_2(head_dim))
    block_m, block_q, tile_n = tile_shape(ratio, max_query_len, head_pad, query.element_size())
    # A window bounds how many keys any program walks, whatever the context length.
    span = max_context_len
    if sliding_window is not None:
        span = min(span, sliding_window + max_query_len - 1 + tile_n)
    if num_kv_splits is None:
        num_kv_splits = choose_num_splits(num_seqs, num_kv_heads, max_query_len, span, query.device)
    num_kv_splits = max(1, min(num_kv_splits, triton.cdiv(max(span, 1), tile_n)))
    split = num_kv_splits > 1
    if split:
        partial = torch.empty(
            (num_tokens, num_heads, num_kv_splits, head_dim),
            dtype=torch.float32,
            device=query.device,
        )
        lse = torch.empty(
            (num_tokens, num_heads, num_kv_splits), dtype=torch.float32, device=query.device
        )
        dest, dest_strides = partial, partial.stride()[:3]
        lse_strides = lse.stride()[:2]
    else:
        lse = target  # unused without SPLIT
        dest, dest_strides = target, (*target.stride()[:2], 0)
        lse_strides = (0, 0)

    grid = (num_tokens // block_q + num_seqs, num_kv_heads, num_kv_splits)
    _attention_kernel[grid](
        dest,
        lse,
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        query_start_loc,
        scale / softcap if softcap is not None else scale * math.log2(math.e),
        softcap * math.log2(math.e) if softcap is not None else 1.0,
        sliding_window if sliding_window is not None else 0,
        num_seqs,
        num_kv_splits,
        query.stride(0),
        query.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        block_tables.stride(0),
        *dest_strides,
        *lse_strides,
        HEAD_DIM=head_dim,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=block_size,
        GQA_RATIO=ratio,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        TILE_N=tile_n,
        SPLIT=split,
        # fp32 asks for fp32 accuracy; TF32 would miss the 1e-4 tolerance the tests hold.
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        # The interpreter multiplies bf16 tiles as raw uint16 bits; give it fp32 tiles.
        DOT_UPCAST=INTERPRETED and query.dtype == torch.bfloat16,
        WINDOWED=sliding_window is not None,
        SOFTCAP=softcap is not None,
        num_warps=4,
        num_stages=2,
    )
    if split:
        _merge_kernel[(num_tokens, num_heads)](
            target,
            partial,
            lse,
            num_kv_splits,
            target.stride(0),
            target.stride(1),
            *partial.stride()[:3],
            *lse.stride()[:2],
            HEAD_DIM=head_dim,
            HEAD_PAD=head_pad,
            SPLITS_PAD=next_power_of_2(num_kv_splits),
            num_warps=4,
        )
    if target is not out:
        out.copy_(target)
    return out


# Dispatch reaches this module through an import it cannot type, so mypy checks here that the
# kernel takes the one AttentionCall (inputs.AttentionFn).
_SIGNATURE: AttentionFn = paged_attention
