"""GGUF weight matrices times float32 activations on the CPU, in the file's own blocks.

Forming float32 weights from 4-bit codes and multiplying in float32 (cpu_quant.py) reads
few bytes but does a float multiply-add per weight, and decodes well below llama.cpp's
speed. These kernels (gguf_kernels.c) do what llama.cpp does: the weights stay in GGUF's
blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; F16, BF16 and F32 converted on the
fly), the activations are quantized per block to 8 bits, and each block's dot product is
an integer one (AVX2, AVX-VNNI or AVX-512 VNNI, NEON with or without dotprod). A decode
step then runs near the memory bandwidth. Every (row, output) value is summed in one fixed
order, the same on every path and whatever else shares the call, so a request gets the same
bits alone or in a batch. The C source is built with the machine's compiler as part of
the CPU forward's library (native_build.py; alone where that one does not build);
:func:`unavailable` says why it cannot be used.

The bindings take and return numpy arrays and import no torch, so the CPU runner that
serves GGUF files without torch drives them directly; the torch layers over them
(engine/model/gguf_layers.py) convert at their edge without copying.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from paged_llm.kernels.cpu import native_build

SOURCE = Path(__file__).parent / "src" / "gguf_kernels.c"
# GGML's type ids the kernels take.
TYPES: dict[str, int] = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "BF16": 30,
}
# Every GGML type's name, for errors about the ones the kernels do not take.
GGML_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}  # fmt: skip
# (values a block, bytes a block) of each type the kernels take.
_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210),
}  # fmt: skip
# Addresses go over as plain integers: cheaper per call than typed pointers (a decode step
# makes hundreds of calls).
_PTR = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int


def unavailable(build_dir: Path | None = None) -> str | None:
    """Why the kernels cannot run here (no compiler, a failed build), or None when they can.

    The first call builds and loads the library, in build_dir (the user's cache folder when
    None); later calls answer from that attempt.
    """
    return _LIBRARY.unavailable(build_dir)


def vector_path() -> str:
    """The kernels' path on this machine ("AVX2", "AVX-512 VNNI", "NEON dotprod", ...)."""
    path: bytes = _LIBRARY.get().gk_path()
    return path.decode()


def type_name(type_id: int) -> str:
    """GGML's name of a type id ("Q4_K"), or "type <id>" for an unknown one."""
    return GGML_NAMES.get(type_id, f"type {type_id}")


def _check_type(type_id: int) -> tuple[int, int]:
    """A supported type's (values a block, bytes a block), or a ValueError naming it."""
    if type_id not in _BLOCKS:
        raise ValueError(
            f"GGUF type {type_name(type_id)} is not supported by the CPU kernels "
            f"(supported: {', '.join(TYPES)})"
        )
    return _BLOCKS[type_id]


def block_size(type_id: int) -> int:
    """Values one block of the type holds (32 or 256; 1 for float types)."""
    return _check_type(type_id)[0]


def row_bytes(type_id: int, k: int) -> int:
    """Bytes one weight row of k values takes; a ValueError if k is not whole blocks."""
    values, size = _check_type(type_id)
    if k <= 0 or k % values:
        raise ValueError(
            f"a {type_name(type_id)} row of width {k} is not a whole number of "
            f"{values}-value blocks"
        )
    return k // values * size


def act_bytes(type_id: int, k: int) -> int:
    """Bytes one activation row of k values takes once prepared for the type."""
    row_bytes(type_id, k)
    size: int = _LIBRARY.get().gk_act_bytes(type_id, k)
    return size


class Matrix:
    """A GGUF weight matrix ``[n, k]`` in its file's blocks, checked once.

    A layer keeps one per weight and calls :meth:`linear` at every step: the kernels then
    get addresses worked out here, not checks per call. ``data`` (a 1-D uint8 array) may
    be a view over a memory-mapped file; it is kept (never copied), so the addresses stay
    valid.
    """

    __slots__ = ("_act_bytes", "_at", "_row_bytes", "data", "k", "n", "type_id")

    def __init__(self, data: np.ndarray, type_id: int, n: int, k: int) -> None:
        """Check the weight's bytes (uint8, contiguous, n rows of the type's row bytes)."""
        self._row_bytes = row_bytes(type_id, k)
        if n <= 0:
            raise ValueError(f"a weight needs at least one row, got n={n}")
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
            is_array = isinstance(data, np.ndarray)
            got = f"{data.ndim}-D {data.dtype}" if is_array else type(data).__name__
            raise ValueError(f"GGUF weight data must be a 1-D uint8 numpy array, got {got}")
        if not data.flags.c_contiguous:
            raise ValueError("GGUF weight data must be contiguous, got a strided view")
        if data.size != n * self._row_bytes:
            raise ValueError(
                f"a {type_name(type_id)} weight [{n}, {k}] takes {n} x {self._row_bytes} = "
                f"{n * self._row_bytes} bytes, got {data.size}"
            )
        self.data = data
        self.type_id = type_id
        self.n = n
        self.k = k
        self._at = data.ctypes.data
        # Float weights multiply x itself: no prepared activations, no scratch.
        self._act_bytes = 0 if _BLOCKS[type_id][0] == 1 else act_bytes(type_id, k)

    def linear(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` for float32 ``x [rows, k]``: a new float32 ``[rows, n]`` array."""
        x = _input(x, self.k)
        rows = x.shape[0]
        out = np.empty((rows, self.n), dtype=np.float32)
        if rows:
            scratch = _scratch(rows * self._act_bytes)
            _LIBRARY.get().gk_linear(
                self.type_id, self._at, self.n, self.k, x.ctypes.data, rows, out.ctypes.data,
                scratch,
            )  # fmt: skip
        return out

    def dequantize(self) -> np.ndarray:
        """The weight as float32 ``[n, k]`` (GGUF's dequantization, bit for bit)."""
        out = np.empty((self.n, self.k), dtype=np.float32)
        _LIBRARY.get().gk_dequantize(self.type_id, self._at, self.n, self.k, out.ctypes.data)
        return out

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """An embedding lookup: float32 ``[len(ids), k]``, row i the weight's row ids[i]."""
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
            got = f"{getattr(ids, 'dtype', type(ids).__name__)} {np.ndim(ids)}-D"
            raise ValueError(f"ids must be a 1-D int64 numpy array, got {got}")
        ids = np.ascontiguousarray(ids)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.n):
            raise ValueError(
                f"ids must lie in [0, {self.n}), got {int(ids.min())}..{int(ids.max())}"
            )
        out = np.empty((ids.size, self.k), dtype=np.float32)
        if ids.size:
            _LIBRARY.get().gk_get_rows(
                self.type_id, self._at, self.k, ids.ctypes.data, ids.size, out.ctypes.data
            )
        return out


def quantize_act(type_id: int, x: np.ndarray) -> np.ndarray:
    """The activation rows the kernels form from float32 ``x [rows, k]`` (uint8 rows)."""
    k = x.shape[1] if x.ndim == 2 else -1
    row_bytes(type_id, k)
    x = _input(x, k)
    out = np.empty((x.shape[0], act_bytes(type_id, k)), dtype=np.uint8)
    _LIBRARY.get().gk_quantize_act(type_id, x.ctypes.data, x.shape[0], k, out.ctypes.data)
    return out


def dequantize_act(type_id: int, xq: np.ndarray, k: int) -> np.ndarray:
    """The float32 ``[rows, k]`` values activation rows stand for (code times scale)."""
    size = act_bytes(type_id, k)
    if xq.dtype != np.uint8 or xq.ndim != 2 or xq.shape[1] != size or not xq.flags.c_contiguous:
        raise ValueError(f"activation rows must be contiguous uint8 [rows, {size}]")
    out = np.empty((xq.shape[0], k), dtype=np.float32)
    _LIBRARY.get().gk_dequantize_act(type_id, xq.ctypes.data, xq.shape[0], k, out.ctypes.data)
    return out


def _input(x: np.ndarray, k: int) -> np.ndarray:
    """The input checked to be a float32 ``[rows, k]`` numpy array, made contiguous."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"the GGUF CPU kernels take numpy inputs, not {type(x).__name__}")
    if x.ndim != 2 or x.shape[1] != k:
        # The kernels take the width from the weight: a wrong one would read past x.
        raise ValueError(f"the weight takes [rows, {k}] inputs, got {tuple(x.shape)}")
    if x.dtype != np.float32:
        raise ValueError(f"the GGUF CPU kernels take float32 inputs, not {x.dtype}")
    return np.ascontiguousarray(x)


_local = threading.local()


def _scratch(size: int) -> int:
    """The address of a per-thread scratch buffer of at least ``size`` bytes (kept, grown)."""
    buffer: np.ndarray | None = getattr(_local, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _local.buffer = np.empty(max(size, 1 << 16), dtype=np.uint8)
    address: int = buffer.ctypes.data
    return address


def load_library(build_dir: Path, source: Path = SOURCE) -> tuple[ctypes.CDLL | None, str | None]:
    """Load the kernels (from the forward library where it builds); or say why not.

    Built once per source, compiler and CPU (native_build.load_part).
    """
    lib, reason = native_build.load_part(build_dir, source, "gguf_kernels")
    if lib is None:
        return None, reason
    lib.gk_path.restype = ctypes.c_char_p
    lib.gk_path.argtypes = []
    for fn in (lib.gk_row_bytes, lib.gk_act_bytes):
        fn.restype = _I64
        fn.argtypes = [_INT, _I64]
    lib.gk_quantize_act.argtypes = [_INT, _PTR, _I64, _I64, _PTR]
    lib.gk_dequantize_act.argtypes = [_INT, _PTR, _I64, _I64, _PTR]
    lib.gk_matmul.argtypes = [_INT, _PTR, _I64, _I64, _PTR, _I64, _PTR]
    lib.gk_linear.argtypes = [_INT, _PTR, _I64, _I64, _PTR, _I64, _PTR, _PTR]
    lib.gk_dequantize.argtypes = [_INT, _PTR, _I64, _I64, _PTR]
    lib.gk_get_rows.argtypes = [_INT, _PTR, _I64, _PTR, _I64, _PTR]
    for fn in (lib.gk_quantize_act, lib.gk_dequantize_act, lib.gk_matmul, lib.gk_linear,
               lib.gk_dequantize, lib.gk_get_rows):  # fmt: skip
        fn.restype = None
    for name, type_id in TYPES.items():  # the source and this table must agree
        values, size = _BLOCKS[type_id]
        if lib.gk_row_bytes(type_id, values) != size:
            return None, f"{source.name} sizes {name} rows differently from gguf_kernels.py"
    return lib, None


# One build per process, by the first caller.
_LIBRARY = native_build.Library("GGUF CPU kernels", load_library)
