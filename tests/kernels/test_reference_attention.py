"""The torch reference attention against a float64 per-sequence softmax written out plainly."""

from __future__ import annotations

import pytest
import torch

from paged_llm.kernels import reference

from kernel_cases import TOLERANCE, AttentionConfig, make_step, mixed_seqs, oracle, rel_err

# float32 decodes take the C kernel where it builds: every case runs on both paths.
pytestmark = pytest.mark.usefixtures("decode_path")

# Every listed value of each axis appears at least once, without the full cross product.
CONFIGS = [
    AttentionConfig(torch.float32, 64, 16, 1, 2, "packed"),
    AttentionConfig(torch.bfloat16, 80, 32, 2, 2, "fused"),
    AttentionConfig(torch.float16, 96, 64, 4, 1, "heads_first"),
    AttentionConfig(torch.float32, 128, 8, 8, 1, "fused"),
    AttentionConfig(torch.bfloat16, 128, 16, 3, 2, "packed"),
    AttentionConfig(torch.float16, 64, 32, 8, 1, "packed"),
    AttentionConfig(torch.float32, 96, 64, 2, 2, "heads_first"),
    AttentionConfig(torch.bfloat16, 16, 16, 2, 2, "heads_first"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_mixed_step_matches_float64(config: AttentionConfig) -> None:
    step = config.step(mixed_seqs(config.block_size), seed=1)
    out = step.nan_out()
    result = reference.paged_attention(step.call(out=out))
    assert result is out
    assert result.dtype == config.dtype
    assert rel_err(result, oracle(step)) < TOLERANCE[config.dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_chunks_match_float64(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tiny chunk budget forces several length-sorted decode chunks in one step.
    monkeypatch.setattr(reference, "DECODE_CHUNK_BYTES", 4096)
    lengths = [1, 15, 16, 17, 90, 3, 250, 33, 64, 200]
    step = make_step(
        [(ctx, 1) for ctx in lengths],
        num_kv_heads=2,
        gqa_ratio=2,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        seed=7,
    )
    result = reference.paged_attention(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[dtype]


def test_prefill_chunks_at_every_offset_match_float64_with_int64_metadata() -> None:
    # Chunks that start at 0, mid-block, on a block boundary and near the end.
    seqs = [(40, 40), (40, 23), (48, 16), (47, 2), (3, 3)]
    step = make_step(
        seqs,
        num_kv_heads=1,
        gqa_ratio=4,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        seed=3,
        index_dtype=torch.int64,
    )
    result = reference.paged_attention(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


def test_allocates_output_when_none_given() -> None:
    step = make_step(
        [(5, 2)],
        num_kv_heads=1,
        gqa_ratio=1,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        seed=0,
    )
    result = reference.paged_attention(step.call())
    assert result.shape == step.query.shape
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]
