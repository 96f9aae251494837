"""What holds outside the test interpreter: no-triton installs, real errors, GPU compilation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _run(code: str | None = None, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python code (or a script and its args) with TRITON_INTERPRET unset."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # silences a Triton 3.9 deprecation warning
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


NO_TRITON = """
import sys

sys.modules["triton"] = None  # what Python sees when triton is not installed
import torch
from paged_llm import kernels

cache = torch.zeros(4, 16, 1, 64)
kv = torch.randn(3, 1, 64)
kernels.store_kv(kv, kv, cache, cache, torch.tensor([0, 1, 2]))
query = torch.randn(3, 2, 64)
inputs = kernels.PagedAttentionInputs(
    torch.tensor([[0]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32),
    torch.tensor([0, 3], dtype=torch.int32), max_query_len=3, max_context_len=3,
)
out = kernels.paged_attention(kernels.AttentionCall(query, cache, cache, inputs, 0.125))
assert out.isfinite().all()
assert kernels.resolve_backend(torch.device("cuda")) == "torch"
try:
    kernels.resolve_backend(torch.device("cuda"), "triton")
except RuntimeError as exc:
    print("ERROR:", exc)
assert not any(name.startswith("triton.") for name in sys.modules)
"""


def test_kernels_import_and_run_on_cpu_without_triton() -> None:
    result = _run(NO_TRITON)
    assert result.returncode == 0, result.stderr
    assert "needs the triton package" in result.stdout
    assert "ModuleNotFoundError" in result.stdout


FORCED_ON_CPU = """
import torch
from paged_llm import kernels

cache = torch.zeros(2, 16, 1, 64)
try:
    kernels.store_kv(cache[0, :2], cache[0, :2], cache, cache, torch.tensor([0, 1]),
                     backend="triton")
except RuntimeError as exc:
    print("ERROR:", exc)
"""


def test_forcing_triton_on_cpu_without_interpreter_fails_clearly() -> None:
    pytest.importorskip("triton")
    result = _run(FORCED_ON_CPU)
    assert result.returncode == 0, result.stderr
    assert "cannot run on cpu tensors" in result.stdout
    assert "TRITON_INTERPRET=1" in result.stdout


def test_kernels_compile_for_a_consumer_gpu() -> None:
    # sm_86 (RTX 30xx) allows about 99 KiB of shared memory per program.
    pytest.importorskip("triton.backends.nvidia")
    result = _run(None, str(HERE / "compile_kernels.py"), "86")
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert {report["kernel"] for report in reports} == {"attention", "merge", "store"}
    assert max(report["shared"] for report in reports) <= 99 * 1024
