"""store_kv writes exactly the given slots, on both backends."""

from __future__ import annotations

import pytest
import torch

from paged_llm.kernels import store_kv

try:
    from paged_llm.kernels.triton import store as triton_store
except ImportError:  # triton missing: only the torch backend can be checked
    triton_store = None

BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            triton_store is None or not triton_store.INTERPRETED,
            reason="needs triton and TRITON_INTERPRET=1 (scripts/test sets it)",
        ),
    ),
]

# (dtype, head_dim, block_size, num_kv_heads, strided input, slot dtype)
CASES = [
    (torch.float32, 64, 16, 2, False, torch.int64),
    (torch.bfloat16, 80, 32, 3, True, torch.int64),
    (torch.float16, 96, 64, 1, False, torch.int32),
    (torch.bfloat16, 128, 8, 4, True, torch.int64),
    # More heads than one program's tile holds: a token's heads span several programs.
    (torch.float32, 128, 16, 40, False, torch.int64),
]


def _pool(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "head_dim", "block_size", "kv_heads", "strided", "slot_dtype"),
    CASES,
    ids=[f"{str(c[0]).removeprefix('torch.')}-d{c[1]}-b{c[2]}-kv{c[3]}" for c in CASES],
)
def test_writes_exactly_the_given_slots(
    backend: str,
    dtype: torch.dtype,
    head_dim: int,
    block_size: int,
    kv_heads: int,
    strided: bool,
    slot_dtype: torch.dtype,
) -> None:
    gen = torch.Generator().manual_seed(head_dim + block_size + kv_heads)
    num_blocks, num_tokens = 5, 9
    shape = (num_blocks, block_size, kv_heads, head_dim)
    key_cache, value_cache = _pool(shape, dtype, gen), _pool(shape, dtype, gen)
    key_before, value_before = key_cache.clone(), value_cache.clone()
    if strided:
        # K and V as views into one fused projection output, like a model's QKV split.
        fused = _pool((num_tokens, 2 * kv_heads + 1, head_dim), dtype, gen)
        key, value = fused[:, :kv_heads], fused[:, kv_heads + 1 :]
    else:
        key = _pool((num_tokens, kv_heads, head_dim), dtype, gen)
        value = _pool((num_tokens, kv_heads, head_dim), dtype, gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[1, 4, 8]] = -1  # padding tokens: skipped
    store_kv(key, value, key_cache, value_cache, slots.to(slot_dtype), backend=backend)

    for slot, k, v in zip(slots.tolist(), key, value, strict=True):
        if slot >= 0:
            key_before[slot // block_size, slot % block_size] = k
            value_before[slot // block_size, slot % block_size] = v
    assert torch.equal(key_cache, key_before)
    assert torch.equal(value_cache, value_before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_skipped_or_no_tokens_leaves_pool_alone(backend: str) -> None:
    gen = torch.Generator().manual_seed(0)
    key_cache = _pool((3, 16, 2, 64), torch.float32, gen)
    value_cache = _pool((3, 16, 2, 64), torch.float32, gen)
    before = key_cache.clone(), value_cache.clone()
    key = _pool((4, 2, 64), torch.float32, gen)
    store_kv(key, key, key_cache, value_cache, torch.full((4,), -1), backend=backend)
    store_kv(
        key[:0], key[:0], key_cache, value_cache, torch.zeros(0, dtype=torch.int64), backend=backend
    )
    assert torch.equal(key_cache, before[0])
    assert torch.equal(value_cache, before[1])
