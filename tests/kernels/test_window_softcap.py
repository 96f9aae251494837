"""Sliding windows and soft-capping in both backends against the float64 oracle.

Blocks wholly outside every window are filled with NaN, so a kernel that reads them
instead of skipping them fails, as does any output element left unwritten.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from paged_llm import kernels
from paged_llm.kernels import reference
from paged_llm.kernels.inputs import PlanCache

from kernel_cases import (
    TOLERANCE,
    AttentionConfig,
    mixed_seqs,
    oracle,
    poison_outside_window,
    rel_err,
)

try:
    from paged_llm.kernels.triton import attention as triton_attention

    INTERPRETED = bool(triton_attention.INTERPRETED)
except ImportError:  # pragma: no cover - triton is pinned in the dev requirements
    INTERPRETED = False
needs_interpreter = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 (scripts/test sets it)"
)

# (config, window, softcap): windows smaller than, equal to and larger than a block.
CASES = [
    (AttentionConfig(torch.float32, 64, 16, 2, 2, "packed"), 7, None),
    (AttentionConfig(torch.float32, 64, 16, 1, 2, "heads_first"), 16, 50.0),
    (AttentionConfig(torch.float32, 32, 32, 4, 1, "fused"), 70, None),
    (AttentionConfig(torch.bfloat16, 64, 16, 2, 1, "packed"), 40, 30.0),
    (AttentionConfig(torch.float16, 80, 32, 2, 2, "packed"), 32, None),
    (AttentionConfig(torch.float32, 16, 8, 2, 1, "packed"), None, 2.0),
    (AttentionConfig(torch.float32, 64, 64, 1, 1, "packed"), 1, 5.0),
]
IDS = [f"{c}-w{w}-cap{cap}" for c, w, cap in CASES]


def _seqs(block_size: int) -> list[tuple[int, int]]:
    """Mixed decodes and prefills plus chunks that start mid-sequence across a window edge."""
    return [*mixed_seqs(block_size, long_ctx=260), (200, 45), (131, 2), (70, 70)]


def _step(config: AttentionConfig, window: int | None, seqs: list[tuple[int, int]], seed: int):
    """A step with out-of-window blocks poisoned (none when there is no window)."""
    step = config.step(seqs, seed=seed)
    if window is not None:
        assert poison_outside_window(step, window) > 0, "the case must have blocks to skip"
    return step


@pytest.mark.usefixtures("decode_path")
@pytest.mark.parametrize(("config", "window", "softcap"), CASES, ids=IDS)
def test_reference_matches_oracle(
    config: AttentionConfig, window: int | None, softcap: float | None
) -> None:
    step = _step(config, window, _seqs(config.block_size), seed=3)
    out = reference.paged_attention(
        step.call(out=step.nan_out(), sliding_window=window, softcap=softcap)
    )
    assert rel_err(out, oracle(step, window, softcap)) < TOLERANCE[config.dtype]


@pytest.mark.usefixtures("decode_path")
@pytest.mark.parametrize("window", [5, 16, 100])
def test_reference_decode_chunks_skip_outside_blocks(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny chunk budget gives several decode chunks of sequences with different spans.
    monkeypatch.setattr(reference, "DECODE_CHUNK_BYTES", 4096)
    config = AttentionConfig(torch.float32, 64, 16, 2, 2)
    lengths = [1, 15, 16, 17, 90, 3, 250, 33, 64, 200, 129]
    step = _step(config, window, [(ctx, 1) for ctx in lengths], seed=4)
    assert poison_outside_window(step, window) > 0
    out = reference.paged_attention(
        step.call(out=step.nan_out(), sliding_window=window, softcap=20.0)
    )
    assert rel_err(out, oracle(step, window, 20.0)) < TOLERANCE[torch.float32]


def test_a_plan_shared_by_the_layers_of_a_step_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, decode_path: str
) -> None:
    # Several decode chunks, prefills and decodes in one step, as a model's layers see it:
    # the same tables and lengths, layers with and without a window or a cap.
    monkeypatch.setattr(reference, "DECODE_CHUNK_BYTES", 4096)
    config = AttentionConfig(torch.float32, 64, 16, 2, 2)
    step = config.step([*_seqs(16), (1, 1), (40, 1), (17, 1)], seed=6)
    plans: PlanCache = {}
    planned = dataclasses.replace(step, inputs=dataclasses.replace(step.inputs, plan_cache=plans))
    for window, softcap in [(None, None), (5, None), (None, 30.0), (5, None), (None, None)]:
        shared = reference.paged_attention(planned.call(sliding_window=window, softcap=softcap))
        alone = reference.paged_attention(step.call(sliding_window=window, softcap=softcap))
        assert torch.equal(shared, alone)
    # One layout, one decode plan per window: worked out once, not once per layer.
    per_window = (
        ["('native', 5)", "('native', None)"]
        if decode_path == "native"
        else ["('decode', 5, 16, 2, 64, 4)", "('decode', None, 16, 2, 64, 4)"]
    )
    assert sorted(str(key) for key in plans) == [*per_window, "layout"]


@pytest.mark.usefixtures("decode_path")
def test_a_window_past_the_context_changes_nothing() -> None:
    config = AttentionConfig(torch.float32, 64, 16, 2, 2)
    step = config.step(_seqs(16), seed=5)
    plain = reference.paged_attention(step.call())
    wide = reference.paged_attention(step.call(sliding_window=10_000))
    assert torch.equal(plain, wide)


@pytest.mark.parametrize(
    ("window", "softcap", "message"),
    [(0, None, "sliding_window"), (2.5, None, "sliding_window"), (None, -1.0, "softcap")],
)
def test_dispatch_refuses_bad_window_or_cap(window: object, softcap: object, message: str) -> None:
    step = AttentionConfig(torch.float32, 64, 16, 1, 1).step([(5, 5)], seed=0)
    with pytest.raises(ValueError, match=message):
        kernels.paged_attention(step.call(sliding_window=window, softcap=softcap))


@needs_interpreter
@pytest.mark.parametrize(("config", "window", "softcap"), CASES, ids=IDS)
def test_triton_matches_oracle(
    config: AttentionConfig, window: int | None, softcap: float | None
) -> None:
    step = _step(config, window, _seqs(config.block_size), seed=6)
    out = triton_attention.paged_attention(
        step.call(out=step.nan_out(), sliding_window=window, softcap=softcap)
    )
    assert rel_err(out, oracle(step, window, softcap)) < TOLERANCE[config.dtype]


@needs_interpreter
@pytest.mark.parametrize(("window", "softcap"), [(9, None), (64, 50.0), (150, 3.0)])
@pytest.mark.parametrize("splits", [1, 3])
def test_triton_decode_and_split_kv(window: int, softcap: float | None, splits: int) -> None:
    config = AttentionConfig(torch.float32, 64, 16, 2, 2)
    seqs = [(1, 1), (300, 1), (17, 1), (129, 1), (640, 1), (200, 9)]
    step = _step(config, window, seqs, seed=7)
    out = triton_attention.paged_attention(
        step.call(out=step.nan_out(), sliding_window=window, softcap=softcap), num_kv_splits=splits
    )
    assert rel_err(out, oracle(step, window, softcap)) < TOLERANCE[torch.float32]
