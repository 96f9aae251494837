"""Fixtures for the kernel tests: run the CPU attention tests on each decode path and pool."""

from __future__ import annotations

import pytest
import torch

from paged_llm.kernels.cpu import attention as cpu_attention


@pytest.fixture(params=["native", "torch"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """float32 decodes on the C kernel (where it builds), or on the torch path."""
    if request.param == "native":
        if cpu_attention.unavailable() is not None:
            pytest.skip(f"no C attention kernel here: {cpu_attention.unavailable()}")
    else:
        monkeypatch.setattr(cpu_attention, "takes", lambda *args: False)
    return str(request.param)


@pytest.fixture(
    params=[torch.float32, torch.float16, torch.bfloat16],
    ids=lambda dtype: str(dtype).removeprefix("torch."),
)
def kv_dtype(request: pytest.FixtureRequest) -> torch.dtype:
    """What the KV pool holds under float32 queries: float32, or 16 bits read widened."""
    dtype: torch.dtype = request.param
    return dtype
