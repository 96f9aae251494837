"""What only the C decode attention kernel has: its agreement with the torch path it
replaces, what it takes and refuses, its fallback, and batch invariance.

Queries are float32; the pool holds float32, float16 or bfloat16 (the ``kv_dtype``
fixture). The cases every backend shares, this kernel against the float64 oracle
included, are in test_attention_conformance.py.
"""

from __future__ import annotations

import pytest
import torch

from paged_llm.kernels import PagedAttentionInputs, reference
from paged_llm.kernels.cpu import attention as cpu_attention
from tests.helpers.kernel_cases import (
    LONG,
    LONG_CONFIGS,
    TOLERANCE,
    AttentionConfig,
    Step,
    in_pool,
    make_step,
    mixed_seqs,
    oracle,
    rel_err,
)

pytestmark = pytest.mark.skipif(
    cpu_attention.unavailable() is not None,
    reason=f"no C attention kernel here: {cpu_attention.unavailable()}",
)

CONFIGS = LONG_CONFIGS  # (kernel_cases.py says what they cover)


def _both(step: Step, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The same step on the C kernel and on the torch path.

    The kernel's result is copied first: both calls may write the same ``out``.
    """
    native = reference.paged_attention(step.call(**kwargs)).clone()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_attention, "takes", lambda *args: False)
        torch_path = reference.paged_attention(step.call(**kwargs))
    return native, torch_path


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_long_and_mixed_steps_agree_with_the_torch_path(
    config: AttentionConfig, kv_dtype: torch.dtype
) -> None:
    step = in_pool(config.step([*LONG, *mixed_seqs(config.block_size)], seed=11), kv_dtype)
    assert cpu_attention.takes(step.query, step.key_cache, step.value_cache)
    native, torch_path = _both(step, out=step.nan_out())
    assert rel_err(native, torch_path) < 1e-5


@pytest.mark.parametrize(("window", "softcap"), [(100, None), (300, 30.0), (None, 5.0)])
def test_windows_and_caps_agree_with_the_torch_path(
    window: int | None, softcap: float | None, kv_dtype: torch.dtype
) -> None:
    step = in_pool(CONFIGS[0].step(LONG, seed=12), kv_dtype)
    native, torch_path = _both(step, sliding_window=window, softcap=softcap)
    assert rel_err(native, torch_path) < 1e-5


def test_the_kernel_takes_float32_cpu_heads_it_can_hold() -> None:
    cache = torch.zeros(2, 16, 1, 64)
    assert cpu_attention.takes(torch.zeros(1, 2, 64), cache, cache)
    assert not cpu_attention.takes(torch.zeros(1, 2, 64, dtype=torch.bfloat16), cache, cache)
    half, brain = cache.half(), cache.bfloat16()
    # A 16-bit pool under float32 queries, both caches alike; not under 16-bit queries.
    assert cpu_attention.takes(torch.zeros(1, 2, 64), half, half)
    assert cpu_attention.takes(torch.zeros(1, 2, 64), brain, brain)
    assert not cpu_attention.takes(torch.zeros(1, 2, 64), half, brain)
    assert not cpu_attention.takes(torch.zeros(1, 2, 64, dtype=torch.float16), half, half)
    assert not cpu_attention.takes(torch.zeros(1, 2, 64), cache.double(), cache.double())
    wide = torch.zeros(2, 16, 1, 72)
    assert not cpu_attention.takes(torch.zeros(1, 2, 72), wide, wide)
    strided = torch.zeros(2, 16, 2, 64)[:, :, :1]
    assert not cpu_attention.takes(torch.zeros(1, 2, 64), strided, strided)


def test_a_head_the_kernel_refuses_is_left_to_the_caller() -> None:
    # Past takes(): the kernel itself refuses a head size that is not a multiple of 16.
    step = make_step(
        [(20, 1)], num_kv_heads=1, gqa_ratio=2, head_dim=72, block_size=16,
        dtype=torch.float32, seed=14,
    )  # fmt: skip
    plan = cpu_attention.DecodePlan.of(step.inputs.block_tables, [0], [0], [0], [20])
    out = step.nan_out()
    assert not cpu_attention.decode(
        step.query, step.key_cache, step.value_cache, plan, step.scale, None, out
    )
    assert bool(out.isnan().all())


def test_without_the_kernel_the_torch_path_runs(
    monkeypatch: pytest.MonkeyPatch, kv_dtype: torch.dtype
) -> None:
    monkeypatch.setattr(cpu_attention._LIBRARY, "_state", (None, "no C compiler here"))
    step = in_pool(CONFIGS[0].step(LONG, seed=15), kv_dtype)
    assert not cpu_attention.takes(step.query, step.key_cache, step.value_cache)
    result = reference.paged_attention(step.call())
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


def test_a_block_outside_the_pool_is_refused_before_anything_is_read(
    kv_dtype: torch.dtype,
) -> None:
    step = in_pool(CONFIGS[0].step([(40, 1), (300, 1)], seed=16), kv_dtype)
    step.inputs.block_tables[1, 5] = step.key_cache.shape[0]  # one past the pool's last block
    out = step.nan_out()
    with pytest.raises(IndexError, match=r"outside the pool of \d+ blocks"):
        reference.paged_attention(step.call(out=out))
    assert bool(out.isnan().all())


def test_a_sequence_gets_the_same_bits_alone_or_beside_others(kv_dtype: torch.dtype) -> None:
    # Its spans and their merge do not depend on the other sequences of the step, so an
    # answer does not change with the load.
    step = in_pool(CONFIGS[0].step([(300, 1), (1100, 1), (40, 1)], seed=17), kv_dtype)
    together = reference.paged_attention(step.call())
    inputs = step.inputs
    one = PagedAttentionInputs(
        inputs.block_tables[1:2],
        inputs.context_lens[1:2],
        torch.tensor([0, 1], dtype=inputs.query_start_loc.dtype),
        max_query_len=1,
        max_context_len=1100,
    )
    alone = reference.paged_attention(step.call(query=step.query[1:2], inputs=one))
    assert torch.equal(together[1:2], alone)


@pytest.mark.parametrize("kv", [torch.float16, torch.bfloat16], ids=str)
def test_the_bound_sees_the_pools_rounding(kv: torch.dtype) -> None:
    # The oracle on the unrounded float32 values is beyond the bound the tests above hold
    # the kernel to (float16 by 2.5x, bfloat16 by 20x; the kernel is within 1e-6 of the
    # pool's oracle): they would fail on a kernel that attended other values than the
    # pool's, such as the float32 ones it came from.
    step = CONFIGS[0].step(LONG, seed=18)
    pool = in_pool(step, kv)
    native = reference.paged_attention(pool.call())
    assert rel_err(native, oracle(pool)) < TOLERANCE[torch.float32]
    assert rel_err(oracle(pool), oracle(step)) > 2 * TOLERANCE[torch.float32]
