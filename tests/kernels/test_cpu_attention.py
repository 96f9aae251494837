"""The C decode attention kernel against the float64 oracle and the torch path it replaces."""

from __future__ import annotations

import pytest
import torch

from paged_llm.kernels import cpu_attention, reference

from kernel_cases import TOLERANCE, AttentionConfig, make_step, mixed_seqs, oracle, rel_err

pytestmark = pytest.mark.skipif(
    cpu_attention.unavailable() is not None,
    reason=f"no C attention kernel here: {cpu_attention.unavailable()}",
)

# Head sizes 16..256, groups of 1..8 query heads, blocks smaller and larger than the
# kernel's 16-key steps, and contexts over several of its 256-key spans.
CONFIGS = [
    AttentionConfig(torch.float32, 64, 16, 3, 3, "packed"),
    AttentionConfig(torch.float32, 128, 32, 8, 1, "fused"),
    AttentionConfig(torch.float32, 16, 8, 1, 2, "heads_first"),
    AttentionConfig(torch.float32, 256, 64, 2, 1, "packed"),
    AttentionConfig(torch.float32, 32, 16, 4, 2, "packed"),
]
LONG = [(1, 1), (255, 1), (256, 1), (257, 1), (1100, 1), (40, 40), (700, 12), (3, 1)]


def _both(step: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The same step on the C kernel and on the torch path."""
    native = reference.paged_attention(*step.args(), **step.kwargs(), **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_attention, "takes", lambda *args: False)
        torch_path = reference.paged_attention(*step.args(), **step.kwargs(), **kwargs)
    return native, torch_path


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_long_and_mixed_steps_match_float64_and_the_torch_path(config: AttentionConfig) -> None:
    step = config.step([*LONG, *mixed_seqs(config.block_size)], seed=11)
    native, torch_path = _both(step, out=step.nan_out())
    assert rel_err(native, oracle(step)) < TOLERANCE[torch.float32]
    assert rel_err(native, torch_path) < 1e-5


@pytest.mark.parametrize(("window", "softcap"), [(100, None), (300, 30.0), (None, 5.0)])
def test_windows_and_caps_match_float64(window: int | None, softcap: float | None) -> None:
    step = CONFIGS[0].step(LONG, seed=12)
    native, torch_path = _both(step, sliding_window=window, softcap=softcap)
    assert rel_err(native, oracle(step, window, softcap)) < TOLERANCE[torch.float32]
    assert rel_err(native, torch_path) < 1e-5


def test_a_strided_output_keeps_the_prefill_rows() -> None:
    step = CONFIGS[0].step(mixed_seqs(16), seed=13)
    tokens, heads, dim = step.query.shape
    out = torch.full((heads, tokens, dim), float("nan")).transpose(0, 1)
    result = reference.paged_attention(*step.args(), **step.kwargs(), out=out)
    assert result is out
    assert rel_err(out, oracle(step)) < TOLERANCE[torch.float32]


def test_the_kernel_takes_float32_cpu_heads_it_can_hold() -> None:
    cache = torch.zeros(2, 16, 1, 64)
    assert cpu_attention.takes(torch.zeros(1, 2, 64), cache, cache)
    assert not cpu_attention.takes(torch.zeros(1, 2, 64, dtype=torch.bfloat16), cache, cache)
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
    plan = cpu_attention.DecodePlan.of(step.block_tables, [0], [0], [0], [20])
    out = step.nan_out()
    assert not cpu_attention.decode(
        step.query, step.key_cache, step.value_cache, plan, step.scale, None, out
    )
    assert bool(out.isnan().all())


def test_without_the_kernel_the_torch_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_attention._LIBRARY, "_state", (None, "no C compiler here"))
    step = CONFIGS[0].step(LONG, seed=15)
    assert not cpu_attention.takes(step.query, step.key_cache, step.value_cache)
    result = reference.paged_attention(*step.args(), **step.kwargs())
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


def test_a_block_outside_the_pool_is_refused_before_anything_is_read() -> None:
    step = CONFIGS[0].step([(40, 1), (300, 1)], seed=16)
    step.block_tables[1, 5] = step.key_cache.shape[0]  # one past the pool's last block
    out = step.nan_out()
    with pytest.raises(IndexError, match=r"outside the pool of \d+ blocks"):
        reference.paged_attention(*step.args(), **step.kwargs(), out=out)
    assert bool(out.isnan().all())


def test_a_sequence_gets_the_same_bits_alone_or_beside_others() -> None:
    # Its spans and their merge do not depend on the other sequences of the step, so an
    # answer does not change with the load.
    step = CONFIGS[0].step([(300, 1), (1100, 1), (40, 1)], seed=17)
    together = reference.paged_attention(*step.args(), **step.kwargs())
    alone = reference.paged_attention(
        step.query[1:2],
        step.key_cache,
        step.value_cache,
        step.block_tables[1:2],
        step.context_lens[1:2],
        torch.tensor([0, 1], dtype=step.query_start_loc.dtype),
        step.scale,
        max_query_len=1,
        max_context_len=1100,
    )
    assert torch.equal(together[1:2], alone)
