"""Every attention backend against the float64 oracle, case for case.

The backends (the ``backend`` fixture): ``torch``, the reference in torch, with its float32
decodes kept off the C kernel; ``cpu``, the same path as the engine runs it on a CPU, the
float32 decodes on the C kernel (kernels/cpu/src/cpu_attention.c) where it builds; and
``triton``, the Triton kernels under Triton's CPU interpreter (TRITON_INTERPRET=1, which
scripts/test sets). A backend that cannot run here is skipped with the reason. What only
one backend has (the C kernel's refusals and batch invariance, the reference's plans,
Triton's split-KV choices) is tested in its own file: test_cpu_attention.py,
test_reference_attention.py, test_triton_attention.py.

Blocks wholly outside every window are filled with NaN, so a kernel that reads them instead
of skipping them fails, as does any output element left unwritten (outputs start as NaN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from paged_llm.kernels import AttentionCall, PagedAttentionInputs, reference
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
    poison_outside_window,
    rel_err,
    window_seqs,
)

try:
    from paged_llm.kernels.triton import attention as triton_attention
except ImportError:  # pragma: no cover - triton is pinned in the dev requirements
    triton_attention = None


@dataclass(frozen=True)
class Backend:
    """One way to run a paged_attention call."""

    name: str
    attend: Callable[[AttentionCall], torch.Tensor]

    def reads_pool(self, step: Step) -> None:
        """Skip where the backend cannot read this step's pool (a dtype not the queries')."""
        if self.name == "triton" and step.key_cache.dtype != step.query.dtype:
            pytest.skip("Triton reads the pool in the queries' dtype (16-bit pools are the CPU's)")


@pytest.fixture(params=["torch", "cpu", "triton"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """Each backend in turn, or a skip saying why it cannot run here."""
    name = str(request.param)
    if name == "torch":
        monkeypatch.setattr(cpu_attention, "takes", lambda *args: False)
        return Backend(name, reference.paged_attention)
    if name == "cpu":
        if (reason := cpu_attention.unavailable()) is not None:
            pytest.skip(f"no C attention kernel here: {reason}")
        return Backend(name, reference.paged_attention)
    if triton_attention is None:
        pytest.skip("triton does not import here")
    if not triton_attention.INTERPRETED:
        pytest.skip("run with TRITON_INTERPRET=1 (scripts/test sets it)")
    return Backend(name, triton_attention.paged_attention)


def windowed(
    config: AttentionConfig, window: int | None, seqs: list[tuple[int, int]], seed: int
) -> Step:
    """A step with the blocks outside every window poisoned (none when there is no window)."""
    step = config.step(seqs, seed=seed)
    if window is not None:
        assert poison_outside_window(step, window) > 0, "the case must have blocks to skip"
    return step


# Every listed value of each axis appears at least once, without the full cross product.
CONFIGS = [
    AttentionConfig(torch.float32, 64, 16, 1, 2, "packed"),
    AttentionConfig(torch.bfloat16, 80, 32, 2, 2, "fused"),
    AttentionConfig(torch.float16, 96, 64, 4, 1, "heads_first"),
    AttentionConfig(torch.float32, 128, 8, 8, 1, "fused"),
    AttentionConfig(torch.bfloat16, 128, 16, 3, 2, "packed"),
    AttentionConfig(torch.bfloat16, 128, 16, 3, 1, "packed"),
    AttentionConfig(torch.float16, 64, 32, 8, 1, "packed"),
    AttentionConfig(torch.float32, 96, 64, 2, 2, "heads_first"),
    AttentionConfig(torch.bfloat16, 16, 16, 2, 2, "heads_first"),
    AttentionConfig(torch.float32, 16, 16, 2, 2, "heads_first"),
]

# (config, window, softcap): windows smaller than, equal to and larger than a block.
WINDOW_CASES = [
    (AttentionConfig(torch.float32, 64, 16, 2, 2, "packed"), 7, None),
    (AttentionConfig(torch.float32, 64, 16, 1, 2, "heads_first"), 16, 50.0),
    (AttentionConfig(torch.float32, 32, 32, 4, 1, "fused"), 70, None),
    (AttentionConfig(torch.bfloat16, 64, 16, 2, 1, "packed"), 40, 30.0),
    (AttentionConfig(torch.float16, 80, 32, 2, 2, "packed"), 32, None),
    (AttentionConfig(torch.float32, 16, 8, 2, 1, "packed"), None, 2.0),
    (AttentionConfig(torch.float32, 64, 64, 1, 1, "packed"), 1, 5.0),
]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_mixed_step(backend: Backend, config: AttentionConfig) -> None:
    step = config.step(mixed_seqs(config.block_size), seed=1)
    out = step.nan_out()
    result = backend.attend(step.call(out=out))
    assert result is out
    assert result.dtype == config.dtype
    assert rel_err(result, oracle(step)) < TOLERANCE[config.dtype]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_decode_only_step(backend: Backend, config: AttentionConfig) -> None:
    # max_query_len == 1: Triton's decode tile shape, the C kernel for every row.
    lengths = [ctx for ctx, _ in mixed_seqs(config.block_size)]
    step = config.step([(ctx, 1) for ctx in lengths], seed=11)
    result = backend.attend(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[config.dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decodes_of_many_lengths_in_chunks(
    backend: Backend, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny chunk budget gives the torch path several length-sorted decode chunks.
    monkeypatch.setattr(reference, "DECODE_CHUNK_BYTES", 4096)
    lengths = [1, 15, 16, 17, 90, 3, 250, 33, 64, 200]
    step = make_step(
        [(ctx, 1) for ctx in lengths],
        num_kv_heads=2, gqa_ratio=2, head_dim=64, block_size=16, dtype=dtype, seed=7,
    )  # fmt: skip
    result = backend.attend(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[dtype]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_prefill_chunks_at_every_offset(backend: Backend, index_dtype: torch.dtype) -> None:
    # Chunks that start at 0, mid-block, on a block boundary and near the end.
    seqs = [(40, 40), (40, 23), (48, 16), (47, 2), (3, 3), (90, 70)]
    step = make_step(
        seqs, num_kv_heads=1, gqa_ratio=4, head_dim=64, block_size=16, dtype=torch.float32,
        seed=3, index_dtype=index_dtype,
    )  # fmt: skip
    result = backend.attend(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


def test_mixed_step_with_int64_metadata(backend: Backend) -> None:
    step = make_step(
        mixed_seqs(16, long_ctx=120), num_kv_heads=2, gqa_ratio=2, head_dim=64, block_size=16,
        dtype=torch.float32, seed=5, index_dtype=torch.int64,
    )  # fmt: skip
    result = backend.attend(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


def test_allocates_output_when_none_given(backend: Backend) -> None:
    step = make_step(
        [(5, 2)], num_kv_heads=1, gqa_ratio=1, head_dim=64, block_size=16,
        dtype=torch.float32, seed=0,
    )  # fmt: skip
    result = backend.attend(step.call())
    assert result.shape == step.query.shape
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


def test_an_empty_step_returns_an_empty_output(backend: Backend) -> None:
    step = make_step(
        [(5, 1)], num_kv_heads=1, gqa_ratio=1, head_dim=64, block_size=16,
        dtype=torch.float32, seed=0,
    )  # fmt: skip
    inputs = step.inputs
    no_seqs = PagedAttentionInputs(
        inputs.block_tables[:0],
        inputs.context_lens[:0],
        inputs.query_start_loc[:1],
        max_query_len=0,
        max_context_len=0,
    )
    result = backend.attend(step.call(query=torch.empty(0, 1, 64), inputs=no_seqs))
    assert result.shape == (0, 1, 64)


@pytest.mark.parametrize("layout", ["heads_first", "every_other"])
def test_a_strided_output_is_written_in_place(
    backend: Backend, layout: str, kv_dtype: torch.dtype
) -> None:
    step = in_pool(
        AttentionConfig(torch.float32, 64, 16, 3, 3).step(mixed_seqs(16), seed=13), kv_dtype
    )
    backend.reads_pool(step)
    tokens, heads, dim = step.query.shape
    if layout == "heads_first":  # as transformers hands it on: [heads, tokens, dim]
        buffer = torch.full((heads, tokens, dim), float("nan"))
        out = buffer.transpose(0, 1)
    else:  # head_dim stride 2: Triton writes a temporary, then copies
        buffer = torch.full((tokens, heads, dim, 2), float("nan"))
        out = buffer[..., 0]
    result = backend.attend(step.call(out=out))
    assert result is out
    assert rel_err(out, oracle(step)) < TOLERANCE[torch.float32]
    if layout == "every_other":
        assert buffer[..., 1].isnan().all()


@pytest.mark.parametrize("config", LONG_CONFIGS, ids=str)
def test_long_and_mixed_steps(
    backend: Backend, config: AttentionConfig, kv_dtype: torch.dtype
) -> None:
    step = in_pool(config.step([*LONG, *mixed_seqs(config.block_size)], seed=11), kv_dtype)
    backend.reads_pool(step)
    result = backend.attend(step.call(out=step.nan_out()))
    assert rel_err(result, oracle(step)) < TOLERANCE[torch.float32]


@pytest.mark.parametrize(
    ("config", "window", "softcap"),
    WINDOW_CASES,
    ids=[f"{c}-w{w}-cap{cap}" for c, w, cap in WINDOW_CASES],
)
def test_windows_and_caps(
    backend: Backend, config: AttentionConfig, window: int | None, softcap: float | None
) -> None:
    step = windowed(config, window, window_seqs(config.block_size), seed=3)
    out = backend.attend(step.call(out=step.nan_out(), sliding_window=window, softcap=softcap))
    assert rel_err(out, oracle(step, window, softcap)) < TOLERANCE[config.dtype]


@pytest.mark.parametrize(("window", "softcap"), [(100, None), (300, 30.0), (None, 5.0)])
def test_windows_and_caps_over_long_contexts(
    backend: Backend, window: int | None, softcap: float | None, kv_dtype: torch.dtype
) -> None:
    step = in_pool(LONG_CONFIGS[0].step(LONG, seed=12), kv_dtype)
    backend.reads_pool(step)
    out = backend.attend(step.call(sliding_window=window, softcap=softcap))
    assert rel_err(out, oracle(step, window, softcap)) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("window", [5, 16, 100])
def test_decodes_skip_the_blocks_outside_their_window(
    backend: Backend, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny chunk budget gives the torch path decode chunks of sequences with different spans.
    monkeypatch.setattr(reference, "DECODE_CHUNK_BYTES", 4096)
    config = AttentionConfig(torch.float32, 64, 16, 2, 2)
    lengths = [1, 15, 16, 17, 90, 3, 250, 33, 64, 200, 129]
    step = windowed(config, window, [(ctx, 1) for ctx in lengths], seed=4)
    out = backend.attend(step.call(out=step.nan_out(), sliding_window=window, softcap=20.0))
    assert rel_err(out, oracle(step, window, 20.0)) < TOLERANCE[torch.float32]


def test_a_window_past_the_context_changes_nothing(backend: Backend) -> None:
    step = AttentionConfig(torch.float32, 64, 16, 2, 2).step(window_seqs(16), seed=5)
    plain = backend.attend(step.call())
    wide = backend.attend(step.call(sliding_window=10_000))
    assert torch.equal(plain, wide)
