"""Paged-KV kernels: store new K/V into the block pool and attend over it (Triton or torch).

A step's attention metadata travels as one PagedAttentionInputs (inputs.py), built once per
step; each layer hands paged_attention one AttentionCall holding it with that layer's
queries, caches and options. Dispatch lives in dispatch.py: CUDA tensors use Triton, CPU
tensors the torch reference, unless a backend is forced per call (`backend=`),
process-wide (`set_backend`, `use_backend`) or through $PAGED_LLM_ATTENTION_BACKEND.
Triton is imported only when used.
"""

from paged_llm.extras import require_engine_extra

require_engine_extra(__name__, ("torch",))

from paged_llm.kernels.dispatch import (  # noqa: E402
    BACKEND_ENV_VAR,
    BACKENDS,
    get_backend,
    paged_attention,
    resolve_backend,
    set_backend,
    store_kv,
    use_backend,
)
from paged_llm.kernels.inputs import AttentionCall, PagedAttentionInputs  # noqa: E402
from paged_llm.kernels.triton.support import triton_import_error  # noqa: E402

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
