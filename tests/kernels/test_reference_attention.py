"""What only the torch reference path has: its per-step plans and the dispatch's checks.

The cases every backend shares (the reference included, with its float32 decodes on the C
kernel and off it) are in test_attention_conformance.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from paged_llm import kernels
from paged_llm.kernels import dispatch, reference
from paged_llm.kernels.inputs import PlanCache
from tests.helpers.kernel_cases import (
    TOLERANCE,
    AttentionConfig,
    in_pool,
    mixed_seqs,
    oracle,
    rel_err,
    window_seqs,
)


def test_a_plan_shared_by_the_layers_of_a_step_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, decode_path: str
) -> None:
    # Several decode chunks, prefills and decodes in one step, as a model's layers see it:
    # the same tables and lengths, layers with and without a window or a cap.
    monkeypatch.setattr(reference, "DECODE_CHUNK_BYTES", 4096)
    config = AttentionConfig(torch.float32, 64, 16, 2, 2)
    step = config.step([*window_seqs(16), (1, 1), (40, 1), (17, 1)], seed=6)
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


@pytest.mark.parametrize(
    ("window", "softcap", "message"),
    [(0, None, "sliding_window"), (2.5, None, "sliding_window"), (None, -1.0, "softcap")],
)
def test_dispatch_refuses_bad_window_or_cap(window: object, softcap: object, message: str) -> None:
    step = AttentionConfig(torch.float32, 64, 16, 1, 1).step([(5, 5)], seed=0)
    with pytest.raises(ValueError, match=message):
        kernels.paged_attention(step.call(sliding_window=window, softcap=softcap))


@pytest.mark.parametrize("kv", [torch.float16, torch.bfloat16], ids=str)
def test_dispatch_takes_a_16_bit_pool_under_float32_queries_on_the_torch_path_only(
    kv: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = in_pool(AttentionConfig(torch.float32, 64, 16, 3, 3).step(mixed_seqs(16), seed=19), kv)
    result = dispatch.paged_attention(step.call(), backend="torch")
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]
    # Other mixes stay refused, naming the dtypes.
    other = torch.bfloat16 if kv == torch.float16 else torch.float16
    pairs = [(step.query, step.value_cache.to(other)), (step.query.to(other), step.value_cache)]
    for query, values in pairs:
        mixed = dataclasses.replace(step, query=query, value_cache=values)
        with pytest.raises(ValueError, match="must have query's dtype"):
            dispatch.paged_attention(mixed.call(), backend="torch")
    # Triton reads the queries' dtype only: the same call is refused before it runs.
    monkeypatch.setattr(dispatch, "resolve_backend", lambda *args: "triton")
    with pytest.raises(ValueError, match="must have query's dtype"):
        dispatch.paged_attention(step.call())
