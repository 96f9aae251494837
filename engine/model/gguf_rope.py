"""A GGUF file's rope scaling, stated as the model's own config states it (no torch).

llama.cpp's converter keeps a model's rope scaling in two forms: ``{arch}.rope.scaling.type``
and ``.factor`` for linear scaling (Gemma 3 4B's global layers, factor 8), and for Llama 3's
band-wise scaling a ``rope_freqs.weight`` tensor of per-dimension divisors (Llama 3.1-3.3).
transformers' GGUF loader reads neither, so a model loaded from the file would run with
rotary embeddings it was not trained on. Both engine paths apply the scaling instead, as
``rope_parameters`` of the model's own config (the oracle in the tests: transformers on that
config). A factor table is recognised as Llama 3's published parameters; a table or a type
that cannot be stated exactly as transformers' parameters is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from paged_llm.engine.errors import UnsupportedModelError

# The tensor in which llama.cpp's converter writes Llama 3's per-dimension rope divisors.
FACTORS_TENSOR = "rope_freqs.weight"
# Llama 3's band limits and training context (every Llama 3.x config, and the converter's
# defaults); only the factor differs between releases (8 for 3.1 and 3.3, 32 for 3.2).
LLAMA3_BANDS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
LLAMA3_CONTEXT = 8192
# A table written by the converter matches its recomputation to float32 rounding (torch's
# vectorized pow may round an inverse frequency 1 ulp the other way).
_TABLE_RTOL = 1e-5


def scaling(
    metadata: Mapping[str, Any],
    architecture: str,
    rope_theta: float,
    head_dim: int,
    factors: np.ndarray | None,
) -> dict[str, Any] | None:
    """The scaled layers' ``rope_parameters`` (theta included), or None for no scaling.

    ``factors`` is the file's rope_freqs tensor as float32 (None when it has none).
    """
    kind = str(metadata.get(f"{architecture}.rope.scaling.type", "none") or "none")
    if factors is not None:
        if kind != "none":
            raise _refusal(f"a {FACTORS_TENSOR} table beside {kind!r} rope scaling")
        return _llama3(factors, rope_theta, head_dim)
    if kind == "none":
        return None
    if kind == "linear":
        factor = float(metadata.get(f"{architecture}.rope.scaling.factor", 1.0))
        if factor == 1.0:
            return None
        return {"rope_type": "linear", "rope_theta": rope_theta, "factor": factor}
    raise _refusal(f"{kind!r} rope scaling in a GGUF file")


def llama3_factors(
    rope_theta: float, head_dim: int, factor: float, context: int = LLAMA3_CONTEXT
) -> np.ndarray:
    """The rope_freqs table llama.cpp's converter writes for Llama 3's scaling, in float32."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    freqs = np.float32(1.0) / (np.float32(rope_theta) ** exponent).astype(np.float32)
    low, high = LLAMA3_BANDS["low_freq_factor"], LLAMA3_BANDS["high_freq_factor"]
    wavelen = (np.float32(2 * math.pi) / freqs).astype(np.float32)
    smooth = ((np.float32(context) / wavelen - np.float32(low)) / np.float32(high - low)).astype(
        np.float32
    )
    medium = np.float32(1.0) / ((np.float32(1.0) - smooth) / np.float32(factor) + smooth)
    table = np.where(wavelen > context / low, np.float32(factor), medium)
    return np.where(wavelen < context / high, np.float32(1.0), table).astype(np.float32)


def _llama3(factors: np.ndarray, rope_theta: float, head_dim: int) -> dict[str, Any]:
    """Llama 3's parameters when ``factors`` is the converter's table of them, else a refusal."""
    factors = np.asarray(factors, dtype=np.float32).reshape(-1)
    if factors.shape != (head_dim // 2,) or not np.all(np.isfinite(factors)):
        raise _refusal(
            f"a {FACTORS_TENSOR} table of {factors.size} values for rotary dimension {head_dim}"
        )
    factor = float(factors.max())
    if factor > 1.0 and np.allclose(
        factors, llama3_factors(rope_theta, head_dim, factor), rtol=_TABLE_RTOL, atol=0.0
    ):
        return {
            "rope_type": "llama3",
            "rope_theta": rope_theta,
            "factor": factor,
            **LLAMA3_BANDS,
            "original_max_position_embeddings": LLAMA3_CONTEXT,
        }
    raise _refusal(f"a {FACTORS_TENSOR} table that is not Llama 3's rope scaling")


def _refusal(feature: str) -> UnsupportedModelError:
    """Neither path runs this scaling exactly: a load error naming it."""
    return UnsupportedModelError(
        f"{feature} is not run by this engine (it runs linear scaling and Llama 3's, as "
        "transformers states them)",
        feature,
    )


def apply(config: Any, parameters: dict[str, Any] | None) -> None:
    """Set the scaling on a transformers config from the file (Gemma 3: its global layers)."""
    if parameters is None:
        return
    current = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in current:
        config.rope_parameters = {**current, "full_attention": parameters}
    else:
        config.rope_parameters = parameters
