"""Compile the Triton kernels for a CUDA target without a GPU; prints JSON per kernel.

Run without TRITON_INTERPRET (the interpreter never compiles): it type-checks the kernels
the way a GPU launch would and reports each one's shared memory, on a machine with no GPU.
Usage: python compile_kernels.py [capability, e.g. 86]
"""

from __future__ import annotations

import json
import sys
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from paged_llm.kernels.triton import attention as triton_attention
from paged_llm.kernels.triton import store as triton_store
from paged_llm.kernels.triton.config import tile_shape

ELEMENT_SIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def _compile(fn: Any, types: dict[str, str], consts: dict[str, Any], target: GPUTarget) -> int:
    """Compile fn with these argument types and constants; return its shared memory bytes."""
    signature = {
        name: "constexpr" if name in consts else types.get(name, "i32") for name in fn.arg_names
    }
    kernel = triton.compile(
        ASTSource(fn, signature, consts), target=target, options={"num_warps": 4, "num_stages": 2}
    )
    return int(kernel.metadata.shared)


def attention(
    dtype: str, head_dim: int, block_size: int, ratio: int, max_q: int, split: bool, target: Any
) -> int:
    """Compile the attention kernel as the launcher would configure it."""
    head_pad = max(16, triton.next_power_of_2(head_dim))
    block_m, block_q, tile_n = tile_shape(ratio, max_q, head_pad, ELEMENT_SIZE[dtype])
    consts = {
        "HEAD_DIM": head_dim,
        "HEAD_PAD": head_pad,
        "BLOCK_SIZE": block_size,
        "GQA_RATIO": ratio,
        "BLOCK_Q": block_q,
        "BLOCK_M": block_m,
        "TILE_N": tile_n,
        "SPLIT": split,
        "DOT_PRECISION": "ieee" if dtype == "fp32" else "tf32",
        "DOT_UPCAST": False,
    }
    out = "*fp32" if split else f"*{dtype}"
    types = {
        "out_ptr": out,
        "lse_ptr": out,
        "query_ptr": f"*{dtype}",
        "key_cache_ptr": f"*{dtype}",
        "value_cache_ptr": f"*{dtype}",
        "block_tables_ptr": "*i32",
        "context_lens_ptr": "*i32",
        "query_start_loc_ptr": "*i32",
        "scale_log2e": "fp32",
    }
    return _compile(triton_attention._attention_kernel, types, consts, target)


def main(capability: int) -> None:
    """Compile a spread of configurations and print one JSON line per kernel."""
    target = GPUTarget("cuda", capability, 32)
    configs = [
        ("bf16", 128, 16, 4, 1, False),  # decode
        ("fp16", 80, 32, 1, 64, False),  # prefill, head size padded to 128
        ("fp32", 128, 64, 8, 1, True),  # split decode, the largest tiles
    ]
    for config in configs:
        print(
            json.dumps(
                {"kernel": "attention", "config": config, "shared": attention(*config, target)}
            )
        )
    merge = _compile(
        triton_attention._merge_kernel,
        {"out_ptr": "*bf16", "partial_ptr": "*fp32", "lse_ptr": "*fp32"},
        {"HEAD_DIM": 96, "HEAD_PAD": 128, "SPLITS_PAD": 8},
        target,
    )
    print(json.dumps({"kernel": "merge", "shared": merge}))
    store = _compile(
        triton_store._store_kv_kernel,
        {
            "key_ptr": "*bf16",
            "value_ptr": "*bf16",
            "key_cache_ptr": "*bf16",
            "value_cache_ptr": "*bf16",
            "slot_mapping_ptr": "*i64",
        },
        {"HEAD_DIM": 80, "HEAD_PAD": 128, "BLOCK_H": 8, "BLOCK_SIZE": 16},
        target,
    )
    print(json.dumps({"kernel": "store", "shared": store}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 86)
