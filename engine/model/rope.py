"""Rotary cos/sin tables in numpy, laid out and valued as transformers' rotary modules give them.

The engine's C forward takes, for each position, ``cos`` and ``sin`` rows of ``head_dim``
float32 values: ``cat(freqs, freqs)`` with ``freqs = position * inv_freq``, as every
transformers rotary embedding of the families it runs returns them. The kinds here are the
ones whose table depends on the position alone (default, linear, llama3); a kind that
changes with the sequence length (dynamic NTK, LongRoPE) or that no supported family's GGUF
file can carry into transformers' config (YaRN) is refused, and the torch path runs it.
Measured against torch (tests/engine/test_gguf_config.py states the bounds): the inverse
frequencies match bit for bit except where torch's vectorized ``pow`` (SLEEF, 1-ulp) rounds
the other way from the correctly rounded value used here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paged_llm.engine.errors import UnsupportedModelError

# The rotary kinds this module computes: each position's values fixed whatever the length.
KINDS = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class Rope:
    """One rotary embedding's settings, named as transformers' ``rope_parameters`` name them."""

    rope_theta: float
    head_dim: int
    rope_type: str = "default"
    # linear and llama3: positions are stretched by this factor
    factor: float = 1.0
    # llama3 only: the band of wavelengths that is interpolated, and the training context
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        """Refuse a kind this module does not compute, naming the path that runs it."""
        if self.rope_type not in KINDS:
            raise UnsupportedModelError(
                f"rotary embedding type {self.rope_type!r} is not run without torch (this path "
                f"runs {', '.join(KINDS)}); `paged-llm[engine]` (the torch path) runs it",
                f"{self.rope_type} rotary embeddings",
            )
        if self.rope_type == "llama3" and None in (
            self.low_freq_factor,
            self.high_freq_factor,
            self.original_max_position_embeddings,
        ):
            raise UnsupportedModelError(
                "llama3 rotary embeddings need low_freq_factor, high_freq_factor and "
                "original_max_position_embeddings",
                "llama3 rotary embeddings without their parameters",
            )


def inverse_frequencies(rope: Rope) -> np.ndarray:
    """The ``head_dim // 2`` float32 inverse frequencies, as transformers' rope init has them."""
    dim = rope.head_dim
    # transformers: arange in int64, then float32, divided by dim in float32
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    # base ** exponent with the base cast to float32, as torch casts the scalar. Evaluated in
    # float64 and rounded once: the correctly rounded float32 power (torch's scalar path and
    # glibc's powf agree; its SLEEF vector path is off by one ulp for a few exponents).
    power = (np.float64(np.float32(rope.rope_theta)) ** exponent.astype(np.float64)).astype(
        np.float32
    )
    inv_freq = np.float32(1.0) / power
    if rope.rope_type == "linear":
        inv_freq = inv_freq / np.float32(rope.factor)
    elif rope.rope_type == "llama3":
        inv_freq = _llama3(inv_freq, rope)
    return inv_freq


def _llama3(inv_freq: np.ndarray, rope: Rope) -> np.ndarray:
    """Llama 3's band-wise scaling, in float32 step by step as transformers writes it."""
    assert rope.low_freq_factor is not None
    assert rope.high_freq_factor is not None
    assert rope.original_max_position_embeddings is not None
    factor = np.float32(rope.factor)
    low, high = np.float32(rope.low_freq_factor), np.float32(rope.high_freq_factor)
    old_context = rope.original_max_position_embeddings
    # Python scalars meet float32 tensors as float32 values in torch: cast each the same way.
    low_wavelen = np.float32(old_context / rope.low_freq_factor)
    high_wavelen = np.float32(old_context / rope.high_freq_factor)
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (np.float32(old_context) / wavelen - low) / (high - low)
    smoothed = (np.float32(1.0) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def cos_sin(rope: Rope, positions: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float32 cos and sin ``[positions, head_dim]`` of 0..n-1 (an int) or of each position."""
    return tables(inverse_frequencies(rope), positions)


def tables(inv_freq: np.ndarray, positions: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cos and sin of ``cat(freqs, freqs)``, ``freqs = position * inv_freq``, in float32."""
    if isinstance(positions, int):
        positions = np.arange(positions, dtype=np.int64)
    # One float32 product per entry, as transformers' matmul of inv_freq by positions gives.
    freqs = np.multiply.outer(np.asarray(positions).astype(np.float32), inv_freq)
    # float64 cos/sin rounded once: the correctly rounded float32, within 1 ulp of torch's
    # own float32 kernels everywhere (numpy's float32 ones are off by 2 ulp in places).
    wide = np.concatenate((freqs, freqs), axis=-1).astype(np.float64)
    return np.cos(wide).astype(np.float32), np.sin(wide).astype(np.float32)


# Tables are grown in powers of two from this many positions.
_FIRST_TABLE = 1024


class RotaryTables:
    """A Rope's cos and sin per position, worked out once and grown as positions grow.

    Both CPU forwards look their rows up here (the numpy runner, and the torch path's
    NativeForward for the kinds this module computes), so both hand the C forward the same
    bits; each position's row is the same whatever else is looked up with it.
    """

    def __init__(self, settings: Rope) -> None:
        """Compute the first table."""
        self._inv_freq = inverse_frequencies(settings)
        self._cos, self._sin = tables(self._inv_freq, _FIRST_TABLE)

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each position's ``[rows, head_dim]`` float32 cos and sin."""
        need = int(positions.max()) + 1 if positions.size else 1
        if need > len(self._cos):
            size = 1 << (need - 1).bit_length()
            self._cos, self._sin = tables(self._inv_freq, size)
        return self._cos[positions], self._sin[positions]
