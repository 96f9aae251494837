"""The one place that picks the backend (Triton or torch) for store_kv and paged_attention."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Literal

import torch

from paged_llm.kernels import reference
from paged_llm.kernels.checks import check_attention_args, check_store_args
from paged_llm.kernels.inputs import AttentionCall, AttentionFn, PlanCache
from paged_llm.kernels.triton.support import triton_import_error

BACKENDS = ("auto", "torch", "triton")
BACKEND_ENV_VAR = "PAGED_LLM_ATTENTION_BACKEND"


_LOGGER = logging.getLogger(__name__)
_default: str | None = None


def set_backend(name: str | None) -> None:
    """Set the process-wide default: "auto", "torch" or "triton"; None defers to the env var."""
    global _default
    _default = None if name is None else _validated(name, "set_backend")


def get_backend() -> str:
    """Return the default backend: set_backend's, else $PAGED_LLM_ATTENTION_BACKEND, else auto."""
    if _default is not None:
        return _default
    return _validated(os.environ.get(BACKEND_ENV_VAR, "auto") or "auto", BACKEND_ENV_VAR)


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Make name the default inside a with-block (tests and comparisons)."""
    previous = _default
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def resolve_backend(device: torch.device, backend: str | None = None) -> Literal["torch", "triton"]:
    """Pick the backend for tensors on device; raise when a forced Triton cannot run there."""
    name = get_backend() if backend is None else _validated(backend, "backend")
    if name == "torch":
        return "torch"
    if name == "triton":
        _triton_modules(device)
        return "triton"
    if device.type != "cuda":
        return "torch"
    if triton_import_error() is not None:
        _warn_no_triton()
        return "torch"
    return "triton"


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str | None = None,
    plan_cache: PlanCache | None = None,
) -> None:
    """Write each new token's K/V [num_tokens, kv_heads, dim] into its slot; -1 slots skip.

    ``plan_cache``: a dict the layers of one step share, so the torch path works out the
    slots once per step (Triton reads them on the device and ignores it).
    """
    check_store_args(key, value, key_cache, value_cache, slot_mapping)
    if resolve_backend(key_cache.device, backend) == "triton":
        triton_store, _ = _triton_modules(key_cache.device)
        triton_store.store_kv(key, value, key_cache, value_cache, slot_mapping)
    else:
        reference.store_kv(key, value, key_cache, value_cache, slot_mapping, plan_cache=plan_cache)


def paged_attention(call: AttentionCall, *, backend: str | None = None) -> torch.Tensor:
    """Causal GQA attention of a packed step's queries over their sequences' paged K/V.

    ``call``: one layer's queries, caches, scale, window and soft-cap, with the step's
    metadata (inputs.py). ``backend`` overrides the default for this call.
    """
    name = resolve_backend(call.query.device, backend)
    check_attention_args(_call_to_check(call, name))
    # Annotated with the alias, so mypy holds both backends to the one AttentionCall.
    run: AttentionFn
    if name == "triton":
        _, triton_attention = _triton_modules(call.query.device)
        run = triton_attention.paged_attention
    else:
        run = reference.paged_attention
    return run(call)


def _call_to_check(call: AttentionCall, backend: str) -> AttentionCall:
    """The call for check_attention_args, which wants the caches in the queries' dtype.

    The torch path also reads a 16-bit pool (both caches float16, or both bfloat16) under
    float32 queries, widening what it reads; such a pair is checked, for shape and device,
    as zero-byte stand-ins of the queries' dtype. Triton reads only the queries' dtype.
    """
    query, key_cache, value_cache = call.query, call.key_cache, call.value_cache
    narrow = key_cache.dtype
    if (
        backend == "torch"
        and query.dtype == torch.float32
        and narrow in (torch.float16, torch.bfloat16)
        and value_cache.dtype == narrow
    ):
        stand_in = torch.empty((), dtype=query.dtype, device=key_cache.device)
        return dataclasses.replace(
            call,
            key_cache=stand_in.expand(key_cache.shape),
            value_cache=stand_in.expand(value_cache.shape),
        )
    return call


def _validated(name: str, source: str) -> str:
    """Normalise a backend name or raise naming where it came from."""
    normal = name.strip().lower()
    if normal not in BACKENDS:
        raise ValueError(f"{source}: backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    return normal


def _triton_modules(device: torch.device) -> tuple[ModuleType, ModuleType]:
    """Import the Triton kernel modules, or say clearly why they cannot run on device."""
    error = triton_import_error()
    if error is not None:
        raise RuntimeError(
            f"backend 'triton' needs the triton package, which does not import here ({error}); "
            "install paged-llm[triton] or use backend 'torch'"
        )
    from paged_llm.kernels.triton import attention as triton_attention
    from paged_llm.kernels.triton import store as triton_store

    if device.type != "cuda" and not triton_attention.INTERPRETED:
        raise RuntimeError(
            f"backend 'triton' cannot run on {device.type} tensors: Triton kernels need a CUDA "
            "device, or TRITON_INTERPRET=1 in the environment before paged_llm's Triton kernels "
            "are first imported (the CPU interpreter, for tests); use backend 'torch' on CPU"
        )
    return triton_store, triton_attention


@functools.cache
def _warn_no_triton() -> None:
    """Say once that CUDA runs the slower torch path because Triton is missing."""
    _LOGGER.warning(
        "triton does not import here (%s); CUDA attention uses the torch path",
        triton_import_error(),
    )
