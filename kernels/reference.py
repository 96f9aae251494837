"""Torch store_kv and paged_attention: the CPU path and what the Triton kernels are tested against.

CPU speed matters here: this is what every Home Assistant box without a GPU runs. In
float32 the decoding sequences go to the C kernel (cpu_attention.py), which reads the
blocks in place, where it builds. Otherwise they are sorted by context length and batched
in chunks whose gathered K/V stay about cache-sized, one SDPA call per chunk (faster than
one batch padded to the longest context, and than one call per sequence).
Each prefill chunk is one SDPA call with a causal mask offset by its starting position.
A sliding window (a key is visible while query position - key position < window, as in
transformers' masks) gathers only the blocks inside the window; soft-capping (Gemma 2:
cap * tanh(score / cap) before the softmax) replaces SDPA by the same steps written out.
A pool in a narrower dtype than the queries (a float16 or bfloat16 pool under float32
queries, on the CPU) is read in place by the C kernel for decodes; the torch path converts
the blocks it gathers to the queries' dtype, so prefill and the fallback attend in float32.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from paged_llm.kernels.cpu import attention as cpu_attention
from paged_llm.kernels.inputs import AttentionCall, PlanCache

# Bytes of gathered keys per decode chunk: about what a core's cache holds (the size tried
# fastest).
DECODE_CHUNK_BYTES = 2 << 20


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    plan_cache: PlanCache | None = None,
) -> None:
    """Write each token's K/V into its pool slot; a slot of -1 is skipped."""
    plan_key = ("store", key_cache.shape[1])
    plan = plan_cache.get(plan_key) if plan_cache is not None else None
    if plan is None:
        plan = _StorePlan.of(slot_mapping, key_cache.shape[1])
        if plan_cache is not None:
            plan_cache[plan_key] = plan
    assert isinstance(plan, _StorePlan)
    if plan.keep is not None:
        key, value = key[plan.keep], value[plan.keep]
    key_cache[plan.blocks, plan.offsets] = key.to(key_cache.dtype)
    value_cache[plan.blocks, plan.offsets] = value.to(value_cache.dtype)


@dataclass(slots=True, frozen=True)
class _StorePlan:
    """Where the step's tokens go: rows to keep (None: all), and each one's block and offset."""

    keep: torch.Tensor | None
    blocks: torch.Tensor
    offsets: torch.Tensor

    @staticmethod
    def of(slot_mapping: torch.Tensor, block_size: int) -> _StorePlan:
        """Split the slots once; a slot of -1 (padding) is dropped."""
        slots = slot_mapping.long()
        keep = slots >= 0
        if bool(keep.all()):
            return _StorePlan(None, slots // block_size, slots % block_size)
        slots = slots[keep]
        return _StorePlan(keep, slots // block_size, slots % block_size)


def paged_attention(call: AttentionCall) -> torch.Tensor:
    """Attend each packed query over its own sequence's paged K/V, causally, with GQA.

    ``call.inputs.plan_cache``, shared by the layers of one step, has the decode plan worked
    out once per step. The exact per-sequence lengths are read on the host, so the inputs'
    maxima go unused here.
    """
    query, inputs, scale = call.query, call.inputs, call.scale
    key_cache, value_cache = call.key_cache, call.value_cache
    sliding_window, softcap = call.sliding_window, call.softcap
    out = torch.empty_like(query) if call.out is None else call.out
    plan_cache, block_tables = inputs.plan_cache, inputs.block_tables
    layout = plan_cache.get("layout") if plan_cache is not None else None
    if layout is None:
        layout = _Layout.of(inputs.query_start_loc, inputs.context_lens)
        if plan_cache is not None:
            plan_cache["layout"] = layout
    assert isinstance(layout, _Layout)
    shape = _Shape(scale, sliding_window, softcap)
    for seq, chunk in layout.prefills:
        _prefill(
            query,
            key_cache,
            value_cache,
            block_tables,
            seq,
            chunk,
            layout.ctx_lens[seq],
            shape,
            out,
        )
    if layout.decodes and cpu_attention.takes(query, key_cache, value_cache):
        native_key = ("native", sliding_window)
        native = plan_cache.get(native_key) if plan_cache is not None else None
        if native is None:
            native = _native_plan(block_tables, layout, shape)
            if plan_cache is not None:
                plan_cache[native_key] = native
        assert isinstance(native, cpu_attention.DecodePlan)
        if cpu_attention.decode(query, key_cache, value_cache, native, scale, softcap, out):
            return out
    if layout.decodes:
        plan_key = ("decode", sliding_window, *key_cache.shape[1:], key_cache.element_size())
        plan = plan_cache.get(plan_key) if plan_cache is not None else None
        if plan is None:
            plan = _decode_plan(key_cache, block_tables, layout, shape)
            if plan_cache is not None:
                plan_cache[plan_key] = plan
        assert isinstance(plan, list)
        _decode(query, key_cache, value_cache, plan, shape, out)
    return out


@dataclass(slots=True, frozen=True)
class _Layout:
    """Where each sequence's queries are in the packed step, and its context length."""

    starts: list[int]
    ctx_lens: list[int]
    prefills: list[tuple[int, slice]]
    decodes: list[int]

    @staticmethod
    def of(query_start_loc: torch.Tensor, context_lens: torch.Tensor) -> _Layout:
        """Read the step's layout from the host (one copy for all layers)."""
        starts = query_start_loc.tolist()
        prefills: list[tuple[int, slice]] = []
        decodes: list[int] = []
        for seq, (start, end) in enumerate(itertools.pairwise(starts)):
            if end - start == 1:
                decodes.append(seq)
            elif end > start:
                prefills.append((seq, slice(start, end)))
        return _Layout(starts, context_lens.tolist(), prefills, decodes)


@dataclass(slots=True, frozen=True)
class _Shape:
    """How scores are formed and which keys a query may see, beyond plain causality."""

    scale: float
    window: int | None
    softcap: float | None

    def first_visible(self, position: int) -> int:
        """The earliest key position a query at ``position`` sees."""
        return 0 if self.window is None else max(0, position - self.window + 1)


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, shape: _Shape
) -> torch.Tensor:
    """Softmax attention of q [B, kv_heads, rows, d] over keys [B, kv_heads, n, d] under mask."""
    if shape.softcap is None:
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=shape.scale, enable_gqa=True
        )
    # SDPA has no soft-cap: the same steps written out, scores and softmax in fp32.
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2)) * shape.scale
    scores = torch.tanh(scores / shape.softcap) * shape.softcap
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.matmul(weights.to(values.dtype), values)


def _gather(
    cache: torch.Tensor, block_ids: torch.Tensor, num_seqs: int, dtype: torch.dtype
) -> torch.Tensor:
    """Copy the listed blocks into [num_seqs, num_kv_heads, tokens, head_dim] (a strided view).

    In ``dtype``: the queries', which a 16-bit pool under float32 queries is widened to.
    """
    num_kv_heads, head_dim = cache.shape[2:]
    blocks = cache.index_select(0, block_ids.reshape(-1)).to(dtype)
    return blocks.view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)


def _prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq: int,
    chunk: slice,
    ctx_len: int,
    shape: _Shape,
    out: torch.Tensor,
) -> None:
    """One attention call for one sequence's chunk of q_len > 1 new tokens (query rows chunk)."""
    q_len, block_size = chunk.stop - chunk.start, key_cache.shape[1]
    num_kv_heads = key_cache.shape[2]
    # Blocks wholly before the first query's window are never read.
    first_block = shape.first_visible(ctx_len - q_len) // block_size
    block_ids = block_tables[seq, first_block : -(-ctx_len // block_size)]
    offset = first_block * block_size
    keys = _gather(key_cache, block_ids, 1, query.dtype)[:, :, : ctx_len - offset]
    values = _gather(value_cache, block_ids, 1, query.dtype)[:, :, : ctx_len - offset]
    q = query[chunk].transpose(0, 1).unsqueeze(0)
    if q_len == ctx_len and shape.window is None and shape.softcap is None:
        # The chunk is the whole sequence, so SDPA's top-left causal mask is the right one.
        result = F.scaled_dot_product_attention(
            q, keys, values, is_causal=True, scale=shape.scale, enable_gqa=True
        )
        out[chunk] = result[0].transpose(0, 1)
        return
    positions = torch.arange(ctx_len - q_len, ctx_len, device=query.device)[:, None]
    key_positions = torch.arange(offset, ctx_len, device=query.device)
    mask = key_positions <= positions
    if shape.window is not None:
        mask &= key_positions > positions - shape.window
    if shape.softcap is None:
        result = _attend(q, keys, values, mask, shape)
    else:
        # A KV head's query heads become rows of one matmul, so K/V are never repeated.
        rows = q.reshape(1, num_kv_heads, -1, q.shape[-1])
        group = rows.shape[2] // q_len
        result = _attend(rows, keys, values, mask.repeat(group, 1), shape).view(q.shape)
    out[chunk] = result[0].transpose(0, 1)


def _native_plan(
    block_tables: torch.Tensor, layout: _Layout, shape: _Shape
) -> cpu_attention.DecodePlan:
    """The decoding sequences as the C kernel reads them: rows, first visible keys, lengths."""
    seqs = layout.decodes
    return cpu_attention.DecodePlan.of(
        block_tables,
        seqs,
        [layout.starts[seq] for seq in seqs],
        [shape.first_visible(layout.ctx_lens[seq] - 1) for seq in seqs],
        [layout.ctx_lens[seq] for seq in seqs],
    )


@dataclass(slots=True, frozen=True)
class _DecodeChunk:
    """Sequences of similar context length attended in one call: which blocks, which keys."""

    # Query rows of the chunk's sequences; None when they are rows 0..n-1 in order.
    rows: torch.Tensor | None
    size: int
    block_ids: torch.Tensor
    valid: torch.Tensor


def _decode_plan(
    key_cache: torch.Tensor, block_tables: torch.Tensor, layout: _Layout, shape: _Shape
) -> list[_DecodeChunk]:
    """Group the decoding sequences into chunks whose gathered K/V stay about cache-sized."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    bytes_per_token = num_kv_heads * head_dim * key_cache.element_size()
    dev = key_cache.device
    starts, ctx_lens, seqs = layout.starts, layout.ctx_lens, layout.decodes
    # Each sequence reads from the block holding its first visible key to its last block.
    first = {seq: shape.first_visible(ctx_lens[seq] - 1) // block_size for seq in seqs}
    spans = {seq: -(-ctx_lens[seq] // block_size) - first[seq] for seq in seqs}
    order = sorted(seqs, key=spans.__getitem__)
    plan: list[_DecodeChunk] = []
    begin = 0
    while begin < len(order):
        # Sorted ascending, so the chunk's last sequence sets its padded length.
        stop = begin + 1
        while (
            stop < len(order)
            and (stop + 1 - begin) * spans[order[stop]] * block_size * bytes_per_token
            <= DECODE_CHUNK_BYTES
        ):
            stop += 1
        chunk = order[begin:stop]
        begin = stop
        num_blocks = spans[chunk[-1]]
        chunk_index = torch.tensor(chunk, device=dev)
        row_list = [starts[seq] for seq in chunk]
        in_order = row_list == list(range(len(chunk)))
        rows = None if in_order else torch.tensor(row_list, device=dev)
        lens = torch.tensor([ctx_lens[seq] for seq in chunk], device=dev)[:, None]
        firsts = torch.tensor([first[seq] for seq in chunk], device=dev)[:, None]
        counts = torch.tensor([spans[seq] for seq in chunk], device=dev)[:, None]
        steps = torch.arange(num_blocks, device=dev)
        # Padding past a sequence's own blocks rereads its first block (masked out below).
        columns = firsts + torch.where(steps < counts, steps, 0)
        block_ids = block_tables.index_select(0, chunk_index).gather(1, columns)
        positions = firsts * block_size + torch.arange(num_blocks * block_size, device=dev)
        valid = positions < lens
        if shape.window is not None:
            valid &= positions >= lens - shape.window
        plan.append(_DecodeChunk(rows, len(chunk), block_ids, valid[:, None, None, :]))
    return plan


def _decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    plan: list[_DecodeChunk],
    shape: _Shape,
    out: torch.Tensor,
) -> None:
    """Batched single-query attention: one call per chunk of the step's decode plan."""
    num_kv_heads, head_dim = key_cache.shape[2:]
    num_heads = query.shape[1]
    for chunk in plan:
        keys = _gather(key_cache, chunk.block_ids, chunk.size, query.dtype)
        values = _gather(value_cache, chunk.block_ids, chunk.size, query.dtype)
        # A kv head's query heads become the query rows, so K/V are never repeated.
        rows = query[: chunk.size] if chunk.rows is None else query.index_select(0, chunk.rows)
        q = rows.reshape(chunk.size, num_kv_heads, -1, head_dim)
        result = _attend(q, keys, values, chunk.valid, shape)
        result = result.reshape(chunk.size, num_heads, head_dim)
        if chunk.rows is None:
            out[: chunk.size] = result
        else:
            out.index_copy_(0, chunk.rows, result)
