"""Builders for kernel tests: a shuffled paged pool, a packed step, and a float64 oracle."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from paged_llm.kernels import AttentionCall, PagedAttentionInputs

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


@dataclass(frozen=True)
class Step:
    """One layer's packed attention step: its queries and pool, and the step's metadata."""

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    inputs: PagedAttentionInputs
    scale: float

    def call(self, **overrides: Any) -> AttentionCall:
        """This step as one paged_attention call; overrides set its other fields (out, ...)."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return AttentionCall(**(fields | overrides))

    def nan_out(self) -> torch.Tensor:
        """An output buffer full of NaN, so any element a kernel forgets to write fails."""
        return torch.full_like(self.query, float("nan"))


def make_step(
    seqs: list[tuple[int, int]],
    *,
    num_kv_heads: int,
    gqa_ratio: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    spare_blocks: int = 3,
    layout: str = "packed",
    index_dtype: torch.dtype = torch.int32,
) -> Step:
    """Build a step from (context_len, query_len) per sequence over a shuffled block pool.

    Physical blocks are a random permutation, unused block-table entries hold -1 or a random
    block. layout "fused" makes the query a strided view (as from a fused QKV projection),
    "heads_first" a transposed one (as transformers hands it: [heads, tokens, dim]).
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-ctx // block_size) for ctx, _ in seqs]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    width = max(blocks_per_seq) + 2
    block_tables = torch.randint(0, num_blocks, (len(seqs), width), generator=gen)
    block_tables[:, -1] = -1
    physical = torch.randperm(num_blocks, generator=gen)
    used = 0
    for seq, count in enumerate(blocks_per_seq):
        block_tables[seq, :count] = physical[used : used + count]
        used += count
    q_lens = [q_len for _, q_len in seqs]
    num_tokens, num_heads = sum(q_lens), num_kv_heads * gqa_ratio
    if layout == "fused":
        fused = torch.randn(num_tokens, num_heads + 2, head_dim, generator=gen).to(dtype)
        query = fused[:, 1 : num_heads + 1]
    elif layout == "heads_first":
        query = torch.randn(num_heads, num_tokens, head_dim, generator=gen).to(dtype)
        query = query.transpose(0, 1)
    else:
        query = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    inputs = PagedAttentionInputs(
        block_tables=block_tables.to(index_dtype),
        context_lens=torch.tensor([ctx for ctx, _ in seqs], dtype=index_dtype),
        query_start_loc=torch.tensor(starts, dtype=index_dtype),
        max_query_len=max(q_lens),
        max_context_len=max(ctx for ctx, _ in seqs),
    )
    return Step(query, key_cache, value_cache, inputs, scale=head_dim**-0.5)


@dataclass(frozen=True)
class AttentionConfig:
    """The shape and dtype axes a test case picks one value of each from."""

    dtype: torch.dtype
    head_dim: int
    block_size: int
    gqa_ratio: int
    num_kv_heads: int
    layout: str = "packed"

    def __str__(self) -> str:
        """Short pytest id."""
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"{dtype}-d{self.head_dim}-b{self.block_size}-r{self.gqa_ratio}"
            f"-kv{self.num_kv_heads}-{self.layout}"
        )

    def step(self, seqs: list[tuple[int, int]], seed: int) -> Step:
        """A packed step of these sequences with this config's shapes."""
        return make_step(
            seqs,
            num_kv_heads=self.num_kv_heads,
            gqa_ratio=self.gqa_ratio,
            head_dim=self.head_dim,
            block_size=self.block_size,
            dtype=self.dtype,
            seed=seed + self.head_dim + self.block_size + self.gqa_ratio,
            layout=self.layout,
        )


def oracle(
    step: Step, sliding_window: int | None = None, softcap: float | None = None
) -> torch.Tensor:
    """Plain per-sequence causal softmax attention in float64, keys gathered token by token.

    A window keeps keys with query position - key position < window (transformers' rule);
    a soft-cap maps each scaled score s to softcap * tanh(s / softcap).
    """
    num_tokens, num_heads, head_dim = step.query.shape
    block_size, num_kv_heads = step.key_cache.shape[1], step.key_cache.shape[2]
    ratio = num_heads // num_kv_heads
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float64)
    starts = step.inputs.query_start_loc.tolist()
    for seq, ctx_len in enumerate(step.inputs.context_lens.tolist()):
        start, end = starts[seq], starts[seq + 1]
        table = step.inputs.block_tables[seq].tolist()
        slots = [(table[pos // block_size], pos % block_size) for pos in range(ctx_len)]
        keys = torch.stack([step.key_cache[b, o] for b, o in slots]).double()
        values = torch.stack([step.value_cache[b, o] for b, o in slots]).double()
        for i in range(end - start):
            position = ctx_len - (end - start) + i
            q = step.query[start + i].double()  # [heads, dim]
            low = 0 if sliding_window is None else max(0, position - sliding_window + 1)
            k = keys[low : position + 1].repeat_interleave(ratio, dim=1)  # [keys, heads, dim]
            v = values[low : position + 1].repeat_interleave(ratio, dim=1)
            scores = torch.einsum("khd,hd->hk", k, q) * step.scale
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            weights = torch.softmax(scores, dim=1)
            out[start + i] = torch.einsum("hk,khd->hd", weights, v)
    return out


def poison_outside_window(step: Step, sliding_window: int) -> int:
    """Fill with NaN every block wholly before each sequence's first window; return how many.

    Only blocks ending before a 64-aligned position are poisoned: kernels read whole tiles
    (at most 64 keys, aligned), so the tile holding the first visible key may start earlier.
    A kernel that reads a poisoned block returns NaN even where it masks the scores.
    """
    block_size = step.key_cache.shape[1]
    starts = step.inputs.query_start_loc.tolist()
    poisoned = 0
    for seq, ctx_len in enumerate(step.inputs.context_lens.tolist()):
        first_query = ctx_len - (starts[seq + 1] - starts[seq])
        boundary = max(0, first_query - sliding_window + 1) // 64 * 64
        for logical in range(boundary // block_size):
            block = int(step.inputs.block_tables[seq, logical])
            step.key_cache[block] = float("nan")
            step.value_cache[block] = float("nan")
            poisoned += 1
    return poisoned


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative Frobenius error, computed in float64."""
    expected = expected.double()
    return float((actual.double() - expected).norm() / expected.norm())


def mixed_seqs(block_size: int, long_ctx: int = 300) -> list[tuple[int, int]]:
    """Decodes at the edge lengths, a long decode, a fresh prefill and a mid-sequence chunk."""
    b = block_size
    return [
        (1, 1),
        (b - 1, 1),
        (long_ctx, 1),
        (b + 5, b + 5),  # whole prompt in one chunk
        (b, 1),
        (long_ctx // 2 + 3, 19),  # chunk starting mid-sequence, mid-block
        (b + 1, 1),
    ]


def window_seqs(block_size: int) -> list[tuple[int, int]]:
    """Mixed decodes and prefills plus chunks that start mid-sequence across a window edge."""
    return [*mixed_seqs(block_size, long_ctx=260), (200, 45), (131, 2), (70, 70)]


def in_pool(step: Step, kv_dtype: torch.dtype) -> Step:
    """The step with its pool rounded to ``kv_dtype``; the queries keep their dtype.

    The oracle then reads the pool's own values, widened to float64: rounding to 16 bits
    is the pool's choice, and a kernel must add nothing beyond its own arithmetic to it.
    """
    keys, values = step.key_cache.to(kv_dtype), step.value_cache.to(kv_dtype)
    return dataclasses.replace(step, key_cache=keys, value_cache=values)


# float32 queries over long contexts: head sizes 16..256, groups of 1..40 query heads, blocks
# smaller and larger than the C kernel's 16-key steps, contexts over several of its 256-key
# spans. Its work items take up to 32 query heads: 48 heads in groups of 4 split between
# items, a group of 40 within one.
LONG_CONFIGS = [
    AttentionConfig(torch.float32, 64, 16, 3, 3, "packed"),
    AttentionConfig(torch.float32, 128, 32, 8, 1, "fused"),
    AttentionConfig(torch.float32, 16, 8, 1, 2, "heads_first"),
    AttentionConfig(torch.float32, 256, 64, 2, 1, "packed"),
    AttentionConfig(torch.float32, 32, 16, 4, 2, "packed"),
    AttentionConfig(torch.float32, 64, 16, 4, 12, "packed"),
    AttentionConfig(torch.float32, 32, 16, 40, 1, "packed"),
]
# Decodes around the C kernel's 256-key spans and over several, and prefill chunks.
LONG = [(1, 1), (255, 1), (256, 1), (257, 1), (1100, 1), (40, 40), (700, 12), (3, 1)]
