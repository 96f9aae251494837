"""What only the Triton kernels have: splitting a sequence's keys (split-KV) among programs.

They run under Triton's CPU interpreter (TRITON_INTERPRET=1, which scripts/test sets). The
cases every backend shares, Triton against the float64 oracle included, are in
test_attention_conformance.py.
"""

from __future__ import annotations

import pytest
import torch

from paged_llm.kernels import reference
from paged_llm.kernels.triton.config import tile_shape
from tests.helpers.kernel_cases import (
    TOLERANCE,
    AttentionConfig,
    oracle,
    poison_outside_window,
    rel_err,
)

triton_attention = pytest.importorskip("paged_llm.kernels.triton.attention")
if not triton_attention.INTERPRETED:
    pytest.skip("run with TRITON_INTERPRET=1 (scripts/test sets it)", allow_module_level=True)

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


@pytest.mark.parametrize(("window", "softcap"), [(9, None), (64, 50.0), (150, 3.0)])
@pytest.mark.parametrize("splits", [1, 3])
def test_windows_and_caps_with_split_kv(window: int, softcap: float | None, splits: int) -> None:
    # Blocks wholly outside every window are NaN: a split that reads them fails.
    config = AttentionConfig(torch.float32, 64, 16, 2, 2)
    step = config.step([(1, 1), (300, 1), (17, 1), (129, 1), (640, 1), (200, 9)], seed=7)
    assert poison_outside_window(step, window) > 0, "the case must have blocks to skip"
    out = triton_attention.paged_attention(
        step.call(out=step.nan_out(), sliding_window=window, softcap=softcap), num_kv_splits=splits
    )
    assert rel_err(out, oracle(step, window, softcap)) < TOLERANCE[torch.float32]
