"""Weight-only quantized linear layers on CPU kernels, and GGUF Q4_0/Q4_1/Q8_0 unpacking.

A 4-bit weight keeps groups of ``group_size`` input columns with one scale and one zero
each, in torch's convention ``w = (q - 8) * scale + zero`` with ``q`` in 0..15. GGUF's
Q4_0 (``d * (q - 8)``) and Q4_1 (``d * q + m``) map onto it without loss, so the file's
weights are used as they are. An 8-bit weight has one symmetric scale per output row
(torch's ``_weight_int8pack_mm``). Both read 4-8x fewer bytes per token than bf16/fp32,
which is what bounds CPU decode at one sequence.

GGUF's Q8_0 (``d * q`` per group of 32) is kept as int8 codes with a float32 scale per
group. In float32 both run on the engine's own kernels (kernels/cpu_quant.c), which form
each weight exactly as the dense path's dequantized value.

The bound, tested in tests/engine/test_quant.py: in float32 a quantized layer's output
equals ``x @ dequantize(weight).T`` up to summation order; so greedy tokens equal
transformers' running the dequantized weights. In bfloat16 the scales and zeros are
rounded to bfloat16 (torch's int4 kernel's format), a rounding of the same size as bf16
weights.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paged_llm.kernels import cpu_quant

# GGUF's block size, the one the engine's kernels are built for, and a group size torch's
# int4 kernel accepts.
GROUP_SIZE = cpu_quant.GROUP_SIZE


class WeightFormat(enum.StrEnum):
    """How linear weights are held: as loaded, or quantized for the CPU kernels."""

    AUTO = "auto"  # a file's 4/8-bit weights on the float32 kernels, else dense (loader)
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


@dataclass(slots=True)
class Q8Weight:
    """An 8-bit weight in groups (GGUF's Q8_0): int8 codes ``[out, in]``, scale ``[out, in/32]``."""

    codes: torch.Tensor
    scale: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these codes stand for."""
        group = self.codes.shape[1] // self.scale.shape[1]
        return self.codes.float() * self.scale.float().repeat_interleave(group, dim=1)


GroupWeight = Q4Weight | Q8Weight


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
    """A linear layer whose weight stays 4-bit, multiplied in float32 (kernels/cpu_quant.c).

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


class Q8Float32Linear(QuantLinear):
    """A linear layer whose weight stays 8-bit in groups (Q8_0), multiplied in float32.

    The same rule as Q4Float32Linear: each weight is ``q * scale`` exactly as the dense
    path forms it; 9 bits per weight are read instead of 32.
    """

    codes: torch.Tensor
    scale: torch.Tensor

    def __init__(self, q: Q8Weight, bias: torch.Tensor | None) -> None:
        """Keep the int8 codes and the float32 scales (shared with a tied embedding)."""
        super().__init__(q.codes.shape, bias, torch.float32)
        # Copies, as in Q4Float32Linear: no view of a mapped cache file stays alive.
        self.register_buffer("codes", q.codes.clone())
        self.register_buffer("scale", q.scale.float().clone())

    def multiply(self, flat: torch.Tensor) -> torch.Tensor:
        """Through the engine's 8-bit float32 kernel."""
        return _packed(self, "codes", "scale").linear(flat.float())

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"in={self.in_features}, out={self.out_features}, q8 float32 group={GROUP_SIZE}"


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


class Q8Float32Embedding(torch.nn.Module):
    """A token embedding kept 8-bit (Q8_0); the rows looked up are formed as float32.

    Tied to the output projection, it shares that layer's codes, so the model holds the
    matrix once, in 8 bits.
    """

    codes: torch.Tensor
    scale: torch.Tensor

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor) -> None:
        """Keep (or share) the int8 codes ``[vocab, dim]`` and scales ``[vocab, dim/group]``."""
        super().__init__()
        self.num_embeddings, self.embedding_dim = codes.shape
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``ids``, for any shape of ids."""
        flat = ids.reshape(-1)
        rows = cpu_quant.q8_dequantize(
            self.codes.index_select(0, flat), self.scale.index_select(0, flat)
        )
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        """Shown by print(model)."""
        return f"{self.num_embeddings}, {self.embedding_dim}, q8 float32 group={GROUP_SIZE}"


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


def unpack_gguf_q8(data: np.ndarray) -> Q8Weight:
    """GGUF Q8_0 blocks ``[rows, blocks * 34]`` as int8 codes and a float32 scale per block.

    A block is 32 values: fp16 ``d``, then 32 signed bytes ``q``; the value is ``d * q``.
    """
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
    return Q8Weight(torch.from_numpy(codes), torch.from_numpy(d))


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


def quantize_model(
    model: Any, fmt: WeightFormat, dtype: torch.dtype, given: dict[str, GroupWeight] | None = None
) -> list[str]:
    """Swap linear layers (and a tied embedding) for quantized ones; return what was swapped.

    ``given`` holds weights read from a file by parameter name (``x.weight``); those layers
    take them as they are (4-bit ones always, 8-bit ones where the float32 kernels run).
    Under Q4/Q8 every other linear layer whose shape the kernel takes is quantized from its
    float weight; under AUTO only ``given`` ones are. The returned list names each swap's
    kind: ``q4``, ``q8`` (given 8-bit groups), ``q8-row`` (torch's per-row int8) and
    ``embedding``.
    """
    given = given or {}
    float32_kernels = dtype == torch.float32 and cpu_quant.unavailable() is None
    embedding = model.get_input_embeddings()
    embedding_name = next(n for n, m in model.named_modules() if m is embedding)
    swapped: list[str] = []
    tied_head: Q8Float32Linear | None = None
    for name, linear in list(linear_modules(model)):
        q = given.get(f"{name}.weight")
        tied = linear.weight is getattr(embedding, "weight", None)
        if q is None and tied:
            q = given.get(f"{embedding_name}.weight")  # the file holds a tied matrix once
        new: torch.nn.Module | None = None
        kind = "q4"
        if isinstance(q, Q4Weight) and fmt in (WeightFormat.AUTO, WeightFormat.Q4):
            new = q4_linear(q, linear.bias, dtype)
        elif isinstance(q, Q8Weight) and fmt is not WeightFormat.Q8 and float32_kernels:
            new, kind = Q8Float32Linear(q, linear.bias), "q8"
            if tied:
                tied_head = new
        elif fmt is WeightFormat.Q4 and can_quantize_q4(linear.weight):
            new = q4_linear(quantize_q4(linear.weight), linear.bias, dtype)
        elif fmt is WeightFormat.Q8:
            codes, scale = quantize_q8(linear.weight)
            new, kind = Q8Linear(codes, scale, linear.bias, dtype), "q8-row"
        if new is not None:
            set_module(model, name, new)
            swapped.append(kind)
    q = given.get(f"{embedding_name}.weight")
    # Only a plain lookup: subclasses (Gemma scales its embeddings) keep their own forward.
    plain = type(embedding) is torch.nn.Embedding and embedding.max_norm is None
    if isinstance(q, Q8Weight) and plain and float32_kernels:
        head = tied_head
        codes, scale = (
            (head.codes, head.scale) if head else (q.codes.clone(), q.scale.float().clone())
        )
        set_module(model, embedding_name, Q8Float32Embedding(codes, scale))
        swapped.append("embedding")
    return swapped
