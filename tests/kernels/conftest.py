"""Fixtures for the kernel tests: run the CPU attention tests on each decode path."""

from __future__ import annotations

import pytest

from paged_llm.kernels import cpu_attention


@pytest.fixture(params=["native", "torch"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """float32 decodes on the C kernel (where it builds), or on the torch path."""
    if request.param == "native":
        if cpu_attention.unavailable() is not None:
            pytest.skip(f"no C attention kernel here: {cpu_attention.unavailable()}")
    else:
        monkeypatch.setattr(cpu_attention, "takes", lambda *args: False)
    return str(request.param)
