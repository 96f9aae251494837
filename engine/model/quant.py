"""Weight-only quantized linear layers for a dense model quantized at load (``q4``, ``q8``).

A 4-bit weight keeps groups of ``group_size`` input columns with one scale and one zero
each, in torch's convention ``w = (q - 8) * scale + zero`` with ``q`` in 0..15. An 8-bit
weight has one symmetric scale per output row (torch's ``_weight_int8pack_mm``). Both read
4-8x fewer bytes per token than bf16/fp32, which is what bounds CPU decode at one sequence.
In float32 the 4-bit layers run on the engine's own kernels (kernels/cpu/src/cpu_quant.c), which
form each weight exactly as the dense path's dequantized value. A GGUF file's own blocks
are not handled here: engine/model/gguf_model.py keeps them in place.

The bound, tested in tests/engine/test_quant.py: in float32 a 4-bit layer's output
equals ``x @ dequantize(weight).T`` up to summation order. In bfloat16 the scales and
zeros are rounded to bfloat16 (torch's int4 kernel's format), a rounding of the same size
as bf16 weights.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from paged_llm.kernels.cpu import quant as cpu_quant

# GGUF's block size, the one the engine's kernels are built for, and a group size torch's
# int4 kernel accepts.
GROUP_SIZE = cpu_quant.GROUP_SIZE


class WeightFormat(enum.StrEnum):
    """How linear weights are held: as loaded, or quantized for the CPU kernels."""

    AUTO = "auto"  # a GGUF file's blocks kept in place on the CPU kernels, else dense
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


class QuantLinear(torch.nn.Module):
    """What every weight-only quantized layer shares: flatten, multiply, add the bias, reshape."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None

    def __init__(self, shape: torch.Size, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        """Record the weight's ``[out, in]`` shape; keep the bias in the activation dtype."""
        super().__init__()
        self.out_features, self.in_features = int(shape[0]), int(shape[1])
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` through the layer's kernel, for any leading shape."""
        out = self.multiply(x.reshape(-1, self.in_features))
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def multiply(self, flat: torch.Tensor) -> torch.Tensor:
        """``flat @ W.T`` for ``flat [rows, in]``: each format's own kernel."""
        raise NotImplementedError


class Q4Linear(QuantLinear):
    """A linear layer whose weight stays 4-bit (torch's packed int4 CPU format)."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(self, q: Q4Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        """Pack the codes and lay scale/zero out as the kernel wants: ``[groups, out, 2]``."""
        super().__init__(q.codes.shape, bias, dtype)
        self.group_size = self.in_features // q.scale.shape[1]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.codes.to(torch.int32), 1)
        sz = torch.stack([q.scale.t(), q.zero.t()], dim=-1).to(dtype).contiguous()
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", sz)

    def multiply(self, flat: torch.Tensor) -> torch.Tensor:
        """Through torch's int4 kernel, in the scales' dtype."""
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat.to(self.scales_and_zeros.dtype),
            self.packed,
            self.group_size,
            self.scales_and_zeros,
        )
        return out

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"in={self.in_features}, out={self.out_features}, q4 group={self.group_size}"


class Q4Float32Linear(QuantLinear):
    """A linear layer whose weight stays 4-bit, multiplied in float32 (kernels/cpu/src/cpu_quant.c).

    It multiplies exactly the float32 weights ``dequantize()`` gives, so it answers as a
    dense float32 model would, up to summation order, while a decode step reads 6 bits per
    weight (4-bit codes, a float32 scale and zero per 32) instead of 32.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def __init__(self, q: Q4Weight, bias: torch.Tensor | None) -> None:
        """Pack two codes per byte; keep scale and zero ``[out, in/group]`` in float32."""
        super().__init__(q.codes.shape, bias, torch.float32)
        # Copies, not views: the codes may come from a mapped cache file, whose pages
        # would then stay resident as long as any tensor of it lives.
        self.register_buffer("codes", cpu_quant.pack_q4(q.codes))
        self.register_buffer("scale", q.scale.float().clone())
        self.register_buffer("zero", q.zero.float().clone())

    def multiply(self, flat: torch.Tensor) -> torch.Tensor:
        """Through the engine's 4-bit float32 kernel."""
        return _packed(self, "codes", "scale", "zero").linear(flat.float())

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"in={self.in_features}, out={self.out_features}, q4 float32 group={GROUP_SIZE}"


def _packed(layer: torch.nn.Module, *names: str) -> cpu_quant.Packed:
    """The layer's buffers as one checked kernel weight, made again if they were replaced.

    ``model.to()`` and friends swap a module's buffers for new tensors; the kept weight
    holds the tensors it was made from, so a replaced one is seen by identity.
    """
    buffers = layer._buffers
    packed: cpu_quant.Packed | None = layer.__dict__.get("_packed")
    if packed is not None:
        for tensor, name in zip(packed.tensors, names, strict=True):
            if tensor is not buffers[name]:
                break
        else:
            return packed
    tensors = [buffers[name] for name in names]
    if any(tensor is None for tensor in tensors):
        raise ValueError(f"{type(layer).__name__} lost one of its weight buffers {names}")
    packed = layer.__dict__["_packed"] = cpu_quant.Packed(*tensors)  # type: ignore[arg-type]
    return packed


class Q8Linear(QuantLinear):
    """A linear layer with an int8 weight and one scale per output row."""

    codes: torch.Tensor
    scales: torch.Tensor

    def __init__(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> None:
        """Keep the int8 codes and the scales in the activation dtype (the kernel's rule)."""
        super().__init__(codes.shape, bias, dtype)
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scales", scale.to(dtype))

    def multiply(self, flat: torch.Tensor) -> torch.Tensor:
        """Through torch's int8 weight-only kernel, in the scales' dtype."""
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(
            flat.to(self.scales.dtype), self.codes, self.scales
        )
        return out

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"in={self.in_features}, out={self.out_features}, q8 per-row"


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


def q4_linear(q: Q4Weight, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.nn.Module:
    """The 4-bit layer for dtype: the float32 kernel where it builds, else torch's int4 one."""
    if dtype == torch.float32 and cpu_quant.unavailable() is None:
        return Q4Float32Linear(q, bias)
    return Q4Linear(q, bias, dtype)


def quantize_model(model: Any, fmt: WeightFormat, dtype: torch.dtype) -> list[str]:
    """Swap a dense model's linear layers for quantized ones; return each swap's kind.

    Under Q4 every linear layer whose shape the kernel takes is rounded to 4-bit groups
    (``q4``); under Q8 every one to torch's per-row int8 (``q8-row``).
    """
    swapped: list[str] = []
    for name, linear in list(linear_modules(model)):
        new: torch.nn.Module | None = None
        kind = "q4"
        if fmt is WeightFormat.Q4 and can_quantize_q4(linear.weight):
            new = q4_linear(quantize_q4(linear.weight), linear.bias, dtype)
        elif fmt is WeightFormat.Q8:
            codes, scale = quantize_q8(linear.weight)
            new, kind = Q8Linear(codes, scale, linear.bias, dtype), "q8-row"
        if new is not None:
            set_module(model, name, new)
            swapped.append(kind)
    return swapped
