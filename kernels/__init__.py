"""Paged-KV kernels: store new K/V into the block pool and attend over it (Triton or torch).

A step's attention metadata travels as one PagedAttentionInputs (inputs.py), built once per
step; each layer hands paged_attention one AttentionCall holding it with that layer's
queries, caches and options. Dispatch lives in dispatch.py: CUDA tensors use Triton, CPU
tensors the torch reference, unless a backend is forced per call (`backend=`),
process-wide (`set_backend`, `use_backend`) or through $PAGED_LLM_ATTENTION_BACKEND.
Triton is imported only when used.

The names below are loaded on first use, not when the package is: the CPU kernels'
bindings (paged_llm.kernels.cpu: forward, gguf_matmul, attention) take numpy arrays and
must import without torch, for the CPU runner that serves GGUF files with no torch
installed. Asking for one of these names without torch raises EngineExtraMissing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from paged_llm.extras import require_engine_extra

if TYPE_CHECKING:
    from paged_llm.kernels.dispatch import (
        BACKEND_ENV_VAR,
        BACKENDS,
        get_backend,
        paged_attention,
        resolve_backend,
        set_backend,
        store_kv,
        use_backend,
    )
    from paged_llm.kernels.inputs import AttentionCall, PagedAttentionInputs
    from paged_llm.kernels.triton.support import triton_import_error

# Each public name and the module it comes from.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "BACKENDS",
            "BACKEND_ENV_VAR",
            "get_backend",
            "paged_attention",
            "resolve_backend",
            "set_backend",
            "store_kv",
            "use_backend",
        ),
        "paged_llm.kernels.dispatch",
    ),
    "AttentionCall": "paged_llm.kernels.inputs",
    "PagedAttentionInputs": "paged_llm.kernels.inputs",
    "triton_import_error": "paged_llm.kernels.triton.support",
}

__all__ = [
    "BACKENDS",
    "BACKEND_ENV_VAR",
    "AttentionCall",
    "PagedAttentionInputs",
    "get_backend",
    "paged_attention",
    "resolve_backend",
    "set_backend",
    "store_kv",
    "triton_import_error",
    "use_backend",
]


def __getattr__(name: str) -> Any:
    """Import the torch-based module a public name lives in, on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_engine_extra(__name__, ("torch",))
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted({*globals(), *__all__})
