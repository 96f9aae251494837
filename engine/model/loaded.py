"""What a loaded model hands the engine, and the KV pool's shape, without importing torch.

Both runners' loaders return a :class:`LoadedModel`: the torch path's (engine/model/loader.py)
with a torch device and dtype, the numpy path's (engine/model/cpu_model.py) with their names.
The engine core reads only what both give (names, limits, the model's ``config``); the
runner that ``runner`` names interprets the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paged_llm.engine.config import KV_CACHE_DTYPES

# LoadedModel.runner: which runner serves the model.
TORCH, NUMPY = "torch", "numpy"
# Bytes per value of the dtypes a KV pool may hold, by name.
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(slots=True)
class LoadedModel:
    """A model ready to run: weights on the device, tokenizer, and the limits they imply."""

    model: Any
    tokenizer: Any
    name: str
    # The torch path: a torch.device and torch.dtype; the numpy path: "cpu" and "float32".
    device: Any
    dtype: Any
    max_model_len: int
    # What sets max_model_len, for errors: "the model's context of N tokens" or the like.
    context_limit: str
    eos_token_ids: tuple[int, ...]
    weights: str = "float"
    # How decode attention runs on this device and dtype (for diagnostics).
    attention: str = "torch"
    # A request that sets no repetition penalty gets this (the model's generation_config).
    repetition_penalty: float = 1.0
    # Which runner serves it: TORCH (runner.ModelRunner) or NUMPY (cpu_runner.CpuRunner).
    runner: str = TORCH
    # The numpy path's chat template (tokenizer.chat_template.ChatTemplate); None: the
    # tokenizer's own apply_chat_template (transformers').
    chat_template: Any = None


def device_type(device: Any) -> str:
    """``cpu`` or ``cuda`` of a torch device or a device's name."""
    return str(getattr(device, "type", None) or str(device).partition(":")[0])


def dtype_name(dtype: Any) -> str:
    """A dtype as the settings spell it (float32, bfloat16), from torch, numpy or a name."""
    return str(dtype).removeprefix("torch.")


def kv_geometry(model_config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head size) of a transformers config or a GGUFConfig."""
    heads = int(model_config.num_attention_heads)
    head_dim = int(getattr(model_config, "head_dim", None) or model_config.hidden_size // heads)
    kv_heads = int(getattr(model_config, "num_key_value_heads", None) or heads)
    return int(model_config.num_hidden_layers), kv_heads, head_dim


def kv_bytes_per_block(model_config: Any, block_size: int, kv_dtype: Any) -> int:
    """Bytes one block of K and V takes across all layers, in the pool's dtype ``kv_dtype``."""
    layers, kv_heads, head_dim = kv_geometry(model_config)
    return 2 * layers * block_size * kv_heads * head_dim * _ITEM_BYTES[dtype_name(kv_dtype)]


_SIXTEEN_BITS = ("float16", "bfloat16")


def kv_dtype_name(setting: str, device: str, model_dtype: str, weights: str) -> str:
    """The dtype the KV pool holds for a ``kv_cache_dtype`` setting (config.KV_CACHE_DTYPES).

    ``auto`` is float16 on a CPU engine whose float32 model runs quantized weights in place
    (``weights``, LoadedModel's text, not "float"): the fast path, where a 16-bit pool gives
    twice the blocks for a budget and halves the bytes a decode reads. Otherwise the model's
    dtype, so the exact float path keeps its float32 pool and transformers' own tokens, and
    CUDA (Triton reads the queries' dtype) keeps the model's. An explicit dtype must be the
    model's, or a 16-bit one under a float32 model on the CPU (the attention widens what it
    reads to float32); anything else is a ValueError naming the setting. ``device`` and
    ``model_dtype`` are names (``cpu``, ``float32``).
    """
    if setting not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {setting!r}"
        )
    on_cpu = device == "cpu"
    if setting == "auto":
        fast = on_cpu and model_dtype == "float32" and not weights.startswith("float")
        return "float16" if fast else model_dtype
    if setting == model_dtype:
        return setting
    if on_cpu and model_dtype == "float32" and setting in _SIXTEEN_BITS:
        return setting
    raise ValueError(
        f"kv_cache_dtype {setting} cannot serve a {model_dtype} model on {device}: the KV "
        f"cache holds the model's dtype ({model_dtype}), or float16 or bfloat16 under a "
        "float32 model on the CPU; use kv_cache_dtype auto"
    )


def config_kv_dtype_name(config: Any, loaded: LoadedModel) -> str:
    """kv_dtype_name for an engine's settings (an EngineConfig) and its loaded model."""
    return kv_dtype_name(
        config.kv_cache_dtype,
        device_type(loaded.device),
        dtype_name(loaded.dtype),
        loaded.weights,
    )
