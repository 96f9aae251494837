"""A Llama- or Gemma-family decoder's whole packed step on the CPU in one C call (cpu_forward.c).

The caller describes the model once (:class:`Layer` and :class:`Decoder`: addresses of
GGUF matrices, norm weights and KV pools, which must stay alive) and then calls
:meth:`Decoder.forward` per step with the step's token ids, positions, slots, block
tables, rotary cos/sin and the rows to keep. The products are gguf_kernels.c's and the
attention is cpu_attention.c's, built into one library with the step around them.

Everything crosses as numpy arrays and the module imports no torch: the CPU runner that
serves GGUF files without torch builds a Decoder from the mapped file directly, and the
torch path (engine/model/native_forward.py) hands over zero-copy views of its tensors.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels
from paged_llm.kernels.cpu import native_build
from paged_llm.kernels.cpu.attention import KINDS, MAX_DIM, kind_of

SOURCE = native_build.FORWARD_SOURCE
_PTR = ctypes.c_void_p
_I64 = ctypes.c_int64


class _Matrix(ctypes.Structure):
    """cf_matrix."""

    _fields_ = [
        ("w", _PTR),
        ("bias", _PTR),
        ("order", _PTR),
        ("type", _I64),
        ("n", _I64),
        ("k", _I64),
    ]


class _Layer(ctypes.Structure):
    """cf_layer."""

    _fields_ = [
        ("attn_norm", _PTR),
        ("ffn_norm", _PTR),
        ("q_norm", _PTR),
        ("k_norm", _PTR),
        ("post_attn_norm", _PTR),
        ("post_ffn_norm", _PTR),
        *((name, _Matrix) for name in ("q", "k", "v", "o", "gate", "up", "down")),
        ("k_cache", _PTR),
        ("v_cache", _PTR),
        ("window", _I64),
        ("local_rope", _I64),
    ]


class _Model(ctypes.Structure):
    """cf_model."""

    _fields_ = [
        ("layer", ctypes.POINTER(_Layer)),
        ("embed", _Matrix),
        ("head", _Matrix),
        ("final_norm", _PTR),
        *((name, _I64) for name in ("layers", "hidden", "heads", "kv_heads", "dim", "inter")),
        *((name, _I64) for name in ("kv_kind", "block_size", "num_blocks")),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("act", _I64),
        *((name, ctypes.c_float) for name in ("embed_scale", "softcap", "final_softcap")),
    ]


class _Step(ctypes.Structure):
    """cf_step."""

    _fields_ = [
        *((name, _PTR) for name in ("ids", "pos", "seq", "slot", "keep", "tables")),
        *((name, _PTR) for name in ("cos", "sin", "cos_local", "sin_local", "logits")),
        *((name, _I64) for name in ("rows", "table_width", "kept", "threads")),
    ]


@dataclass(slots=True)
class Linear:
    """A GGUF matrix with the extras transformers' layer adds: an output order and a bias."""

    matrix: gguf_kernels.Matrix
    bias: np.ndarray | None = None  # float32 [n]
    order: np.ndarray | None = None  # int64 [n]: output i is the matrix's row order[i]


@dataclass(slots=True)
class Layer:
    """One decoder layer's weights and KV pools, as cf_layer takes them.

    The pools are C-contiguous ``[blocks, block_size, kv_heads, head_dim]`` arrays of
    float32 or float16, or of uint16 holding bfloat16 bits (see Decoder's ``kv_dtype``).
    """

    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
    down: Linear
    key_cache: np.ndarray
    value_cache: np.ndarray
    window: int | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    # Gemma's norms of the attention's and the MLP's outputs (as 1 + w), before each adds.
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    local_rope: bool = False  # the step's local cos and sin (Gemma 3's sliding layers)


# The MLP activations cf_model takes (its ACT_ values).
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def unavailable(build_dir: Path | None = None) -> str | None:
    """Why the library cannot run here (no compiler, a failed build), or None when it can."""
    return _LIBRARY.unavailable(build_dir)


class Decoder:
    """A model's layers as the C step reads them; :meth:`forward` runs one packed step.

    Everything handed in is kept referenced here, so the addresses stay valid. ValueError
    when a shape, dtype or pool is beyond the kernel (the caller keeps its own path).
    """

    def __init__(
        self,
        embed: gguf_kernels.Matrix,
        layers: list[Layer],
        final_norm: np.ndarray,
        head: Linear,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        scale: float,
        activation: str = "silu",
        embed_scale: float | None = None,
        softcap: float | None = None,
        final_softcap: float | None = None,
        kv_dtype: str | None = None,
    ) -> None:
        """Check the shapes once and lay out the C structures.

        ``activation`` is a key of ACTIVATIONS; ``embed_scale`` multiplies the embedding's
        rows (Gemma), ``softcap`` and ``final_softcap`` cap the attention scores and the
        logits as ``tanh(x / cap) * cap`` (Gemma 2); None: not done. ``kv_dtype`` is what
        the pools hold, a key of KINDS: needed for "bfloat16" (numpy has no such dtype, so
        the pools are uint16 arrays of its bits), else taken from the pools' dtype.
        """
        if not layers:
            raise ValueError("a decoder needs at least one layer")
        pool = layers[0].key_cache
        kv_kind = _pool_kind(pool, kv_dtype)
        if head_dim % 16 or head_dim > MAX_DIM or heads % kv_heads:
            raise ValueError(f"heads of {head_dim} values ({heads}/{kv_heads}) are not supported")
        hidden, inter = embed.k, layers[0].gate.matrix.n
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        for cap in (softcap, final_softcap):
            if cap is not None and not cap > 0:
                raise ValueError(f"a soft-cap must be above 0, got {cap}")
        self.local_rope = any(layer.local_rope for layer in layers)
        self._keep: list[object] = [embed, layers, final_norm, head]
        structs = (_Layer * len(layers))()
        for i, layer in enumerate(layers):
            structs[i] = self._layer(layer, pool, hidden, heads, kv_heads, head_dim, inter)
        self._layers = structs
        self._model = _Model(
            structs,
            self._matrix(Linear(embed), embed.n, hidden),
            self._matrix(head, head.matrix.n, hidden),
            self._floats(final_norm, hidden),
            len(layers), hidden, heads, kv_heads, head_dim, inter,
            kv_kind, pool.shape[1], pool.shape[0],
            eps, scale, ACTIVATIONS[activation],
            embed_scale or 0.0, softcap or 0.0, final_softcap or 0.0,
        )  # fmt: skip
        self.vocab = head.matrix.n

    def forward(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        seqs: np.ndarray,
        slots: np.ndarray,
        tables: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        keep: np.ndarray,
        threads: int = 0,
        local: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Float32 logits ``[len(keep), vocab]`` of one packed step, on ``threads`` threads.

        Per query row: its token id, absolute position, sequence (a row of the block
        ``tables``) and KV slot (integer arrays; converted to int64 and the tables to int32
        where they are not); ``cos``/``sin`` ``[rows, head_dim]`` float32 rotary tables
        (the model's rotary module's, or engine/model/rope.py's); ``keep`` the rows whose
        logits are wanted; ``threads`` 0 (or above :func:`max_threads`) for that many; the
        logits are the same bits on any count; ``local`` the cos and sin of the layers with
        ``local_rope``. IndexError when an id is outside the vocabulary, a table or slot
        outside the pool or a kept row outside the step (nothing is changed then).
        """
        longs = [np.ascontiguousarray(a, dtype=np.int64).reshape(-1)
                 for a in (ids, positions, seqs, slots, keep)]  # fmt: skip
        rows = longs[0].size
        tables = np.ascontiguousarray(tables, dtype=np.int32)
        if self.local_rope and local is None:
            raise ValueError("layers with local_rope need the local cos and sin")
        rotary = [cos, sin, *(local if self.local_rope and local else ())]
        rotary = [np.ascontiguousarray(a, dtype=np.float32) for a in rotary]
        if tables.ndim != 2 or any(a.size != rows for a in longs[:4]):
            raise ValueError("ids, positions, sequences and slots must have a value per row")
        if any(a.shape != (rows, self._model.dim) for a in rotary):
            raise ValueError(f"cos and sin must be [{rows}, {self._model.dim}]")
        cos, sin, *rest = rotary
        cos_local, sin_local = rest if rest else (None, None)
        if rows and (int(longs[2].min()) < 0 or int(longs[2].max()) >= tables.shape[0]):
            raise IndexError("a row's sequence has no block table")
        kept = longs[4].size
        logits = np.empty((kept, self.vocab), dtype=np.float32)
        step = _Step(
            *(a.ctypes.data for a in (*longs, tables, cos, sin)),
            *(a.ctypes.data if a is not None else None for a in (cos_local, sin_local)),
            logits.ctypes.data, rows, tables.shape[1], kept, max(0, threads),
        )  # fmt: skip
        done = _LIBRARY.get().cf_forward(ctypes.byref(self._model), ctypes.byref(step))
        if done == -2:
            raise IndexError("a block table or slot names a block outside the KV pool")
        if done == -3:
            raise IndexError(f"a token id is outside the vocabulary of {self._model.embed.n}")
        if done == -4:
            raise IndexError(f"a kept row is not one of the step's {rows} rows")
        if done != 0:
            raise RuntimeError("the CPU forward found no memory for its step buffers")
        return logits

    def _layer(
        self,
        layer: Layer,
        first: np.ndarray,
        hidden: int,
        heads: int,
        kv_heads: int,
        dim: int,
        inter: int,
    ) -> _Layer:
        """The cf_layer of one layer, its shapes checked against the model's and first pool's."""
        pools = (layer.key_cache, layer.value_cache)
        expect = (*first.shape[:2], kv_heads, dim)
        for p in pools:
            if not isinstance(p, np.ndarray) or p.shape != expect or not p.flags.c_contiguous:
                raise ValueError(f"each KV pool must be a contiguous numpy array {expect}")
            # cf_model holds one kind and one pool size for every layer's pools
            if p.dtype != first.dtype:
                raise ValueError("every KV pool must share one dtype")
        return _Layer(
            self._floats(layer.attn_norm, hidden),
            self._floats(layer.ffn_norm, hidden),
            self._floats(layer.q_norm, dim) if layer.q_norm is not None else None,
            self._floats(layer.k_norm, dim) if layer.k_norm is not None else None,
            self._floats(layer.post_attn_norm, hidden)
            if layer.post_attn_norm is not None
            else None,
            self._floats(layer.post_ffn_norm, hidden) if layer.post_ffn_norm is not None else None,
            self._matrix(layer.q, heads * dim, hidden),
            self._matrix(layer.k, kv_heads * dim, hidden),
            self._matrix(layer.v, kv_heads * dim, hidden),
            self._matrix(layer.o, hidden, heads * dim),
            self._matrix(layer.gate, inter, hidden),
            self._matrix(layer.up, inter, hidden),
            self._matrix(layer.down, hidden, inter),
            layer.key_cache.ctypes.data,
            layer.value_cache.ctypes.data,
            layer.window or 0,
            int(layer.local_rope),
        )

    def _matrix(self, linear: Linear, n: int, k: int) -> _Matrix:
        """The cf_matrix of a linear whose weight must be ``[n, k]``."""
        m = linear.matrix
        if (m.n, m.k) != (n, k):
            raise ValueError(f"a weight is [{m.n}, {m.k}] where [{n}, {k}] was expected")
        bias = self._floats(linear.bias, n) if linear.bias is not None else None
        order = None
        if linear.order is not None:
            keep = np.ascontiguousarray(linear.order, dtype=np.int64)
            if keep.shape != (n,) or int(keep.min()) < 0 or int(keep.max()) >= n:
                raise ValueError(f"an output order must be a permutation of {n} rows")
            self._keep.append(keep)
            order = keep.ctypes.data
        return _Matrix(m.data.ctypes.data, bias, order, m.type_id, n, k)

    def _floats(self, values: np.ndarray, n: int) -> int:
        """The address of a ``[n]`` array as float32 (converted where it is not; kept here)."""
        values = np.ascontiguousarray(values, dtype=np.float32)
        if values.shape != (n,):
            raise ValueError(f"a norm or bias of shape {tuple(values.shape)} is not [{n}]")
        self._keep.append(values)
        address: int = values.ctypes.data
        return address


def _pool_kind(pool: np.ndarray, kv_dtype: str | None) -> int:
    """cf_model's kv_kind of the pools, checked against what ``kv_dtype`` says they hold."""
    if not isinstance(pool, np.ndarray):
        raise ValueError(f"the KV pool must be a numpy array, got {type(pool).__name__}")
    if kv_dtype is None:
        kind = kind_of(pool.dtype)
        if kind is None:
            raise ValueError(
                f"the KV pool must be float32 or float16 (or uint16 with kv_dtype='bfloat16'), "
                f"got {pool.dtype}"
            )
        return kind
    if kv_dtype not in KINDS:
        raise ValueError(f"kv_dtype {kv_dtype!r} is not one of {', '.join(KINDS)}")
    # bfloat16 bits travel as uint16, the others as themselves
    holds = np.dtype(np.uint16) if kv_dtype == "bfloat16" else np.dtype(kv_dtype)
    if pool.dtype != holds:
        raise ValueError(f"a {kv_dtype} KV pool must be a {holds} array, got {pool.dtype}")
    return KINDS[kv_dtype]


def load_library(build_dir: Path, source: Path = SOURCE) -> tuple[ctypes.CDLL | None, str | None]:
    """Build (once per source, compiler and CPU) and load the library; or say why not.

    The engine's own source is native_build's one forward library, shared with
    gguf_kernels.py and cpu_attention.py.
    """
    if source == SOURCE:
        lib, reason = native_build.forward(build_dir)
    else:
        lib, reason = native_build.load(build_dir, source, "cpu_forward")
    if lib is None:
        return None, reason
    lib.cf_forward.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Step)]
    lib.cf_forward.restype = ctypes.c_int
    lib.cf_max_threads.argtypes = []
    lib.cf_max_threads.restype = ctypes.c_int
    return lib, None


def max_threads() -> int:
    """The threads a step runs on by default (OMP_NUM_THREADS, else the usable cores).

    Asked of the library's OpenMP runtime from the calling thread, which should be the one
    that runs the steps. The library must be available.
    """
    return int(_LIBRARY.get().cf_max_threads())


# One build per process, by the first caller.
_LIBRARY = native_build.Library("CPU forward kernels", load_library)
