"""Weight-only quantized linear layers on torch's packed CPU kernels, and GGUF Q4 unpacking.

A 4-bit weight keeps groups of ``group_size`` input columns with one scale and one zero
each, in torch's convention ``w = (q - 8) * scale + zero`` with ``q`` in 0..15. GGUF's
Q4_0 (``d * (q - 8)``) and Q4_1 (``d * q + m``) map onto it without loss, so the file's
weights are used as they are. An 8-bit weight has one symmetric scale per output row
(torch's ``_weight_int8pack_mm``). Both read 4-8x fewer bytes per token than bf16/fp32,
which is what bounds CPU decode at one sequence.

The bound, tested in tests/engine/test_quant.py: in float32 a quantized layer's output
equals ``x @ dequantize(weight).T`` up to summation order; so greedy tokens equal
transformers' running the dequantized weights. In bfloat16 the scales and zeros are
rounded to bfloat16 (the kernel's format), a rounding of the same size as bf16 weights.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

GROUP_SIZE = 32  # GGUF's block size, and a group size torch's int4 kernel accepts


class WeightFormat(enum.StrEnum):
    """How linear weights are held: as loaded, or quantized for the CPU kernels."""

    AUTO = "auto"  # dense for now (see loader.apply_weights)
    FLOAT = "float"  # dense weights in the engine's dtype
    Q4 = "q4"  # 4-bit groups of 32 (a float model is quantized at load)
    Q8 = "q8"  # 8-bit, one scale per output row


@dataclass(slots=True)
class Q4Weight:
    """A 4-bit weight unpacked: codes ``[out, in]`` in 0..15, scale/zero ``[out, in/group]``."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these codes stand for."""
        group = self.codes.shape[1] // self.scale.shape[1]
        scale = self.scale.float().repeat_interleave(group, dim=1)
        zero = self.zero.float().repeat_interleave(group, dim=1)
        return (self.codes.float() - 8) * scale + zero


def can_quantize_q4(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> bool:
    """Whether torch's int4 CPU kernel takes this [out, in] weight's shape."""
    return weight.dim() == 2 and weight.shape[1] % group_size == 0 and weight.shape[0] % 8 == 0


def quantize_q4(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> Q4Weight:
    """Round a float weight to 4 bits per value, min/max affine per group of input columns."""
    w = weight.detach().float()
    groups = w.reshape(w.shape[0], -1, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    return Q4Weight(codes.to(torch.uint8).reshape(w.shape), scale, low + 8 * scale)


def quantize_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round a float weight to int8 with one symmetric scale per output row."""
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


class Q4Linear(torch.nn.Module):
    """A linear layer whose weight stays 4-bit (torch's packed int4 CPU format)."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, q: Q4Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        """Pack the codes and lay scale/zero out as the kernel wants: ``[groups, out, 2]``."""
        super().__init__()
        self.out_features, self.in_features = q.codes.shape
        self.group_size = self.in_features // q.scale.shape[1]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.codes.to(torch.int32), 1)
        sz = torch.stack([q.scale.t(), q.zero.t()], dim=-1).to(dtype).contiguous()
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", sz)
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` through the int4 kernel, for any leading shape."""
        flat = x.reshape(-1, self.in_features).to(self.scales_and_zeros.dtype)
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat, self.packed, self.group_size, self.scales_and_zeros
        )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"in={self.in_features}, out={self.out_features}, q4 group={self.group_size}"


class Q8Linear(torch.nn.Module):
    """A linear layer with an int8 weight and one scale per output row."""

    codes: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> None:
        """Keep the int8 codes and the scales in the activation dtype (the kernel's rule)."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scales", scale.to(dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` through the int8 weight-only kernel."""
        flat = x.reshape(-1, self.in_features).to(self.scales.dtype)
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(flat, self.codes, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"in={self.in_features}, out={self.out_features}, q8 per-row"


def unpack_gguf_q4(data: np.ndarray, kind: str) -> Q4Weight:
    """GGUF Q4_0/Q4_1 blocks ``[rows, blocks * bytes]`` as codes, scale and zero.

    A block is 32 values: fp16 ``d`` (and for Q4_1 fp16 ``m``), then 16 bytes whose low
    nibbles are values 0..15 and high nibbles 16..31.
    """
    header = {"Q4_0": 2, "Q4_1": 4}[kind]
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, header + 16)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., header:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, -1)
    if kind == "Q4_0":
        zero = np.zeros_like(d)
    else:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8 * d  # d*q + m == d*(q-8) + (m + 8d)
    return Q4Weight(torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(zero))


def linear_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Linear]]:
    """Every nn.Linear of a model with its dotted name."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            yield name, module


def set_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    """Replace the submodule at a dotted name."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def quantize_model(
    model: Any, fmt: WeightFormat, dtype: torch.dtype, given: dict[str, Q4Weight] | None = None
) -> int:
    """Swap linear layers for quantized ones; return how many were swapped.

    ``given`` holds 4-bit weights read from a file by parameter name (``x.weight``); those
    layers take them as they are. Under Q4/Q8 every other linear layer whose shape the
    kernel takes is quantized from its float weight; under AUTO only ``given`` ones are.
    The output projection stays float under AUTO: it is tied to the embedding and GGUF
    keeps it in 8 bits with per-block scales, which torch's per-row int8 kernel cannot
    hold exactly.
    """
    given = given or {}
    swapped = 0
    for name, linear in list(linear_modules(model)):
        q4 = given.get(f"{name}.weight")
        new: torch.nn.Module | None = None
        if q4 is not None and fmt in (WeightFormat.AUTO, WeightFormat.Q4):
            new = Q4Linear(q4, linear.bias, dtype)
        elif fmt is WeightFormat.Q4 and can_quantize_q4(linear.weight):
            new = Q4Linear(quantize_q4(linear.weight), linear.bias, dtype)
        elif fmt is WeightFormat.Q8:
            codes, scale = quantize_q8(linear.weight)
            new = Q8Linear(codes, scale, linear.bias, dtype)
        if new is not None:
            set_module(model, name, new)
            swapped += 1
    return swapped
