"""Triton kernel that writes a step's new K and V into the paged pool in one launch."""

# Triton types a jitted kernel's parameters itself at launch; Python annotations there would
# be read by Triton as type hints, so the kernel's parameters stay unannotated.
# mypy: disable-error-code="no-untyped-def"

import torch
import triton
import triton.language as tl

from paged_llm.kernels.triton.support import is_interpreted, next_power_of_2

# Elements per program; above this a token's heads are split over several programs.
_MAX_TILE = 4096


@triton.jit  # type: ignore[untyped-decorator]
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    num_kv_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Copy one token's K and V (a tile of its heads) to its slot, unless the slot is -1."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_PAD)
    mask = (heads < num_kv_heads)[:, None] & (dims < HEAD_DIM)[None, :]
    src = heads[:, None] * stride_kh + dims[None, :]
    k = tl.load(key_ptr + token * stride_kt + src, mask=mask)
    src = heads[:, None] * stride_vh + dims[None, :]
    v = tl.load(value_ptr + token * stride_vt + src, mask=mask)
    dst = block * stride_kcb + offset * stride_kct + heads[:, None] * stride_kch + dims[None, :]
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    dst = block * stride_vcb + offset * stride_vct + heads[:, None] * stride_vch + dims[None, :]
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


INTERPRETED: bool = is_interpreted(_store_kv_kernel)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's K/V into its pool slot with one launch; a slot of -1 is skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    # The kernel addresses the head dimension as unit-stride; views from a fused QKV are.
    key, value = _unit_last_stride(key), _unit_last_stride(value)
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("key_cache and value_cache need a unit-stride head_dim")
    head_pad = next_power_of_2(head_dim)
    block_h = min(next_power_of_2(num_kv_heads), max(1, _MAX_TILE // head_pad))
    grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
    _store_kv_kernel[grid](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        num_kv_heads,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        HEAD_DIM=head_dim,
        HEAD_PAD=head_pad,
        BLOCK_H=block_h,
        BLOCK_SIZE=key_cache.shape[1],
    )


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    """Return the tensor, copied only if its last dimension is not unit-stride."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()
