"""GGUF's 4-bit and 8-bit weights times float32 activations on the CPU (cpu_quant.c).

torch's own int4 CPU kernel is fast only with bf16 activations (far slower than dense
float32 otherwise), and bf16 changes the model's answers. These kernels multiply the very
float32 weights a dense model holds, formed group by group from their codes, so only the
summation order differs, while a decode step reads 6 (or 9) bits per weight instead of
32. The C source is built with the machine's C compiler (native_build.py); :func:`unavailable`
says why it cannot be used. Nothing here is needed where it cannot build: the engine stays
dense.

Why two quantized matmuls: this one serves a dense model quantized at load
(engine/model/quant.py's ``q4`` layers in float32) and keeps their promise, the dense float32
product of exactly the dequantized weights up to summation order. gguf_matmul.py reads a
GGUF file's own blocks, with fp16 block scales and the activations quantized to 8 bits as
llama.cpp does, so it cannot give those float32 weights' product bit for bit (its float
types could, at 32 bits a weight); the two become one only if the at-load format moves to
GGUF's blocks and llama.cpp's numerics, a change of answers rather than a move.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from paged_llm.kernels.cpu import native_build

GROUP_SIZE = 32
MAX_ROWS = 64  # rows the kernels take per call (cpu_quant.c)
# Above this many rows (a prefill chunk, a large batch) forming the dense weight and running
# torch's product is as fast or faster (measured: docs/performance.md).
DENSE_ROWS = 64
assert DENSE_ROWS <= MAX_ROWS
DENSE_SLICE_VALUES = 1 << 20  # weights formed at a time on that path (4 MiB in float32)
SOURCE = Path(__file__).parent / "src" / "cpu_quant.c"
# Addresses go over as plain integers: cheaper per call than typed pointers (a decode step
# makes over 200 calls).
_PTR = ctypes.c_void_p
_I64 = ctypes.c_int64


def unavailable(build_dir: Path | None = None) -> str | None:
    """Why the kernels cannot run here (no compiler, a failed build), or None when they can.

    The first call builds and loads the library, in build_dir (the user's cache folder when
    None); later calls answer from that attempt.
    """
    return _LIBRARY.unavailable(build_dir)


class Packed:
    """A 4-bit (codes, scale, zero) or 8-bit (codes, scale) weight, checked once.

    A layer keeps one per weight and calls :meth:`linear` at every step: the kernels then
    get addresses worked out at load, not checks of three tensors per call (a decode step
    makes over 200 calls). It holds the tensors, so the addresses stay valid.
    """

    __slots__ = ("_addresses", "_q4", "in_features", "out_features", "tensors")

    def __init__(
        self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None = None
    ) -> None:
        """Check the tensors the kernels will read as flat arrays; keep their addresses."""
        self.tensors = (codes, scale) if zero is None else (codes, scale, zero)
        self._addresses = _addresses(*self.tensors)
        self._q4 = zero is not None
        self.out_features = codes.shape[0]
        self.in_features = codes.shape[1] * (2 if self._q4 else 1)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for float32 ``x [rows, in]``."""
        if x.dim() != 2 or x.shape[1] != self.in_features:
            # The kernels take the width from x: a wrong one would read past the weights.
            raise ValueError(
                f"the weight takes [rows, {self.in_features}] inputs, got {tuple(x.shape)}"
            )
        if x.shape[0] > DENSE_ROWS:
            return _dense(x, q4_dequantize if self._q4 else q8_dequantize, *self.tensors)
        lib = _LIBRARY.get()
        kernel = lib.q4_linear if self._q4 else lib.q8_linear
        return _in_one_call(kernel, x, self.out_features, self._addresses)


def vector_path() -> str:
    """The kernels' vector path on this machine ("AVX-512", "AVX2" or "portable C")."""
    path: bytes = _LIBRARY.get().quant_path()
    return path.decode()


def q4_linear(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
) -> torch.Tensor:
    """``x @ W.T`` for float32 ``x [rows, in]`` and a packed 4-bit ``W [out, in]``."""
    return Packed(codes, scale, zero).linear(x)


def q8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` for float32 ``x [rows, in]`` and an 8-bit ``W [out, in]`` (int8 codes)."""
    return Packed(codes, scale).linear(x)


def q4_dequantize(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The dense float32 weight ``[out, in]`` of packed 4-bit codes with scales and zeros."""
    n, k = codes.shape[0], codes.shape[1] * 2
    out = _output(out, n, k)
    _LIBRARY.get().q4_dequantize(*_addresses(codes, scale, zero), n, k, out.data_ptr())
    return out


def q8_dequantize(
    codes: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The dense float32 weight ``[out, in]`` of int8 codes with one scale per group."""
    n, k = codes.shape
    out = _output(out, n, k)
    _LIBRARY.get().q8_dequantize(*_addresses(codes, scale), n, k, out.data_ptr())
    return out


def _output(out: torch.Tensor | None, n: int, k: int) -> torch.Tensor:
    """A new ``[n, k]`` float32 tensor, or ``out`` checked to be one."""
    if out is None:
        return torch.empty(n, k, dtype=torch.float32)
    if out.shape != (n, k) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 [{n}, {k}] tensor")
    return out


def pack_q4(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``[out, in]`` in 0..15 as bytes ``[out, in/2]``; a group's values 0..15 go low."""
    out_features, in_features = codes.shape
    if in_features % GROUP_SIZE:
        raise ValueError(f"4-bit weights need inputs in groups of {GROUP_SIZE}, got {in_features}")
    halves = codes.to(torch.uint8).reshape(out_features, -1, 2, GROUP_SIZE // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(out_features, -1).contiguous()


def _dense(x: torch.Tensor, dequantize: Any, *weight: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` by torch's dense product, W formed in slices of outputs that stay in cache.

    The slices go into one scratch buffer per thread: a fresh tensor for every layer of a
    step cost more in page faults than forming the weights (a 49152-row output projection
    formed whole is 113 MB, and reading it back costs more than the product).
    """
    out_features, k = weight[0].shape[0], x.shape[1]
    step = min(out_features, max(1, DENSE_SLICE_VALUES // max(k, 1)))
    scratch = _scratch(step * k)
    if step == out_features:
        return F.linear(x, dequantize(*weight, out=scratch.view(step, k)))
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    for start in range(0, out_features, step):
        part = [w[start : start + step] for w in weight]
        rows = part[0].shape[0]
        out[:, start : start + rows] = F.linear(
            x, dequantize(*part, out=scratch[: rows * k].view(rows, k))
        )
    return out


_local = threading.local()


def _scratch(values: int) -> torch.Tensor:
    """A float32 scratch buffer of at least ``values`` values, one per thread."""
    buffer: torch.Tensor | None = getattr(_local, "buffer", None)
    if buffer is None or buffer.numel() < values:
        buffer = _local.buffer = torch.empty(max(values, DENSE_SLICE_VALUES), dtype=torch.float32)
    return buffer[:values]


def _in_one_call(
    kernel: Any, x: torch.Tensor, out_features: int, weights: list[int]
) -> torch.Tensor:
    """Run a kernel over all of x's rows (at most DENSE_ROWS) into a new [rows, out] tensor."""
    if x.dtype != torch.float32:
        raise ValueError(f"the quantized CPU kernels take float32 activations, not {x.dtype}")
    (x_at,) = _addresses(x.contiguous())
    rows, k = x.shape
    out = torch.empty(rows, out_features, dtype=torch.float32)
    kernel(x_at, rows, k, *weights, out_features, out.data_ptr())
    return out


def _addresses(*tensors: torch.Tensor) -> list[int]:
    """The data addresses of contiguous CPU tensors (the kernels read them as flat arrays)."""
    for tensor in tensors:
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError("the quantized CPU kernels need contiguous CPU tensors")
    return [tensor.data_ptr() for tensor in tensors]


def load_library(build_dir: Path, source: Path = SOURCE) -> tuple[ctypes.CDLL | None, str | None]:
    """Build (once per source, compiler and CPU) and load a library; or say why not.

    The engine loads SOURCE once through :func:`unavailable`; a benchmark may load another
    version of the source beside it.
    """
    lib, reason = native_build.load(build_dir, source, "cpu_quant")
    if lib is None:
        return None, reason
    lib.q4_linear.argtypes = [_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR]
    lib.q8_linear.argtypes = [_PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR]
    lib.q4_dequantize.argtypes = [_PTR, _PTR, _PTR, _I64, _I64, _PTR]
    lib.q8_dequantize.argtypes = [_PTR, _PTR, _I64, _I64, _PTR]
    for fn in (lib.q4_linear, lib.q8_linear, lib.q4_dequantize, lib.q8_dequantize):
        fn.restype = None
    lib.quant_max_rows.restype = ctypes.c_int
    if hasattr(lib, "quant_path"):  # older sources a benchmark may load lack it
        lib.quant_path.restype = ctypes.c_char_p
    if lib.quant_max_rows() != MAX_ROWS:
        return None, f"{source.name} takes {lib.quant_max_rows()} rows per call, not {MAX_ROWS}"
    return lib, None


# One build per process, by the first caller.
_LIBRARY = native_build.Library("quantized float32 CPU kernels", load_library)
