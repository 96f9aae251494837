"""The Triton paged-attention kernels (run by Triton's CPU interpreter) against the reference."""

from __future__ import annotations

import pytest
import torch

from paged_llm.kernels import PagedAttentionInputs, reference
from paged_llm.kernels.triton.config import tile_shape

from kernel_cases import TOLERANCE, AttentionConfig, make_step, mixed_seqs, oracle, rel_err

triton_attention = pytest.importorskip("paged_llm.kernels.triton.attention")
if not triton_attention.INTERPRETED:
    pytest.skip("run with TRITON_INTERPRET=1 (scripts/test sets it)", allow_module_level=True)

# Every listed value of each axis appears at least once, without the full cross product.
CONFIGS = [
    AttentionConfig(torch.float32, 64, 16, 1, 2, "packed"),
    AttentionConfig(torch.bfloat16, 80, 32, 2, 2, "fused"),
    AttentionConfig(torch.float16, 96, 64, 4, 1, "heads_first"),
    AttentionConfig(torch.float32, 128, 8, 8, 1, "fused"),
    AttentionConfig(torch.bfloat16, 128, 16, 3, 1, "packed"),
    AttentionConfig(torch.float32, 16, 16, 2, 2, "heads_first"),
]


def _check_against_reference(step_seqs: list[tuple[int, int]], config: AttentionConfig) -> None:
    step = config.step(step_seqs, seed=11)
    expected = reference.paged_attention(step.call())
    out = step.nan_out()
    result = triton_attention.paged_attention(step.call(out=out))
    assert result is out
    assert rel_err(result, expected) < TOLERANCE[config.dtype]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_mixed_prefill_and_decode_step(config: AttentionConfig) -> None:
    _check_against_reference(mixed_seqs(config.block_size, long_ctx=260), config)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_decode_only_step(config: AttentionConfig) -> None:
    # max_query_len == 1 selects the decode tile shape.
    lengths = [ctx for ctx, _ in mixed_seqs(config.block_size, long_ctx=300)]
    _check_against_reference([(ctx, 1) for ctx in lengths], config)


def test_prefill_chunks_at_every_offset() -> None:
    config = AttentionConfig(torch.float32, 64, 16, 4, 1)
    _check_against_reference([(40, 40), (40, 23), (48, 16), (47, 2), (3, 3), (90, 70)], config)


def test_matches_float64_oracle_with_int64_metadata() -> None:
    step = make_step(
        mixed_seqs(16, long_ctx=120),
        num_kv_heads=2,
        gqa_ratio=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        seed=5,
        index_dtype=torch.int64,
    )
    result = triton_attention.paged_attention(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


SPLIT_CASES = [
    # (config, sequences, splits)
    (AttentionConfig(torch.float32, 64, 16, 2, 2), [(1, 1), (300, 1), (17, 1), (129, 1)], 3),
    (AttentionConfig(torch.bfloat16, 128, 32, 4, 1), [(1500, 1), (65, 1)], 8),
    (AttentionConfig(torch.float16, 80, 64, 1, 2), [(640, 1), (64, 1), (63, 1)], 4),
    (AttentionConfig(torch.float32, 96, 8, 8, 1), [(200, 1), (9, 1)], 2),
    # Splitting also holds for a step with a prefill chunk (not chosen by the heuristic).
    (AttentionConfig(torch.float32, 64, 16, 1, 1), [(150, 7), (100, 1)], 3),
]


@pytest.mark.parametrize(
    ("config", "seqs", "splits"), SPLIT_CASES, ids=[str(c[0]) for c in SPLIT_CASES]
)
def test_split_kv_matches_single_pass(
    config: AttentionConfig, seqs: list[tuple[int, int]], splits: int
) -> None:
    step = config.step(seqs, seed=2)
    head_pad = max(16, 1 << (config.head_dim - 1).bit_length())
    element_size = step.query.element_size()
    _, _, tile_n = tile_shape(config.gqa_ratio, step.inputs.max_query_len, head_pad, element_size)
    assert splits <= -(-step.inputs.max_context_len // tile_n), "the case must really split"
    single = triton_attention.paged_attention(step.call(out=step.nan_out()), num_kv_splits=1)
    split = triton_attention.paged_attention(step.call(out=step.nan_out()), num_kv_splits=splits)
    tolerance = 1e-6 if config.dtype == torch.float32 else TOLERANCE[config.dtype] / 4
    assert rel_err(split, single) < tolerance
    assert rel_err(split, reference.paged_attention(step.call())) < TOLERANCE[config.dtype]


def test_empty_step_returns_untouched_output() -> None:
    step = make_step(
        [(5, 1)],
        num_kv_heads=1,
        gqa_ratio=1,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        seed=0,
    )
    empty = torch.empty(0, 1, 64)
    inputs = step.inputs
    no_seqs = PagedAttentionInputs(
        inputs.block_tables[:0],
        inputs.context_lens[:0],
        inputs.query_start_loc[:1],
        max_query_len=0,
        max_context_len=0,
    )
    result = triton_attention.paged_attention(step.call(query=empty, inputs=no_seqs))
    assert result.shape == (0, 1, 64)


def test_strided_output_is_written_in_place() -> None:
    config = AttentionConfig(torch.float32, 64, 16, 2, 1)
    step = config.step([(20, 4), (7, 1)], seed=4)
    buffer = torch.full((*step.query.shape, 2), float("nan"))
    out = buffer[..., 0]  # head_dim stride 2: the kernel writes a temporary, then copies
    result = triton_attention.paged_attention(step.call(out=out))
    assert result is out
    expected = reference.paged_attention(step.call())
    assert rel_err(buffer[..., 0], expected) < TOLERANCE[torch.float32]
    assert buffer[..., 1].isnan().all()
