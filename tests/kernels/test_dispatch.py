"""Backend choice: CPU goes to torch by default, forcing works, and failures say why."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from paged_llm import kernels
from paged_llm.kernels import dispatch, reference
from tests.helpers.kernel_cases import TOLERANCE, make_step, rel_err

triton_attention = pytest.importorskip("paged_llm.kernels.triton.attention")
triton_store = pytest.importorskip("paged_llm.kernels.triton.store")
needs_interpreter = pytest.mark.skipif(
    not triton_attention.INTERPRETED, reason="needs TRITON_INTERPRET=1 (scripts/test sets it)"
)
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(autouse=True)
def _clean_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(kernels.BACKEND_ENV_VAR, raising=False)
    kernels.set_backend(None)
    yield
    kernels.set_backend(None)


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[str]:
    """Record calls to module.name while still running it."""
    calls: list[str] = []
    real: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _step() -> Any:
    return make_step(
        [(20, 3), (9, 1)],
        num_kv_heads=1,
        gqa_ratio=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        seed=0,
    )


def _attend(backend: str | None = None) -> torch.Tensor:
    return kernels.paged_attention(_step().call(), backend=backend)


def test_auto_sends_cpu_to_torch_and_cuda_to_triton() -> None:
    assert kernels.get_backend() == "auto"
    assert kernels.resolve_backend(CPU) == "torch"
    assert kernels.resolve_backend(CUDA) == "triton"


def test_cpu_tensors_run_the_reference_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_calls = _spy(monkeypatch, reference, "paged_attention")
    triton_calls = _spy(monkeypatch, triton_attention, "paged_attention")
    _attend()
    assert torch_calls == ["paged_attention"]
    assert triton_calls == []


@needs_interpreter
def test_forcing_triton_per_call_runs_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    attention_calls = _spy(monkeypatch, triton_attention, "paged_attention")
    store_calls = _spy(monkeypatch, triton_store, "store_kv")
    step = _step()
    out = step.nan_out()
    result = kernels.paged_attention(step.call(out=out), backend="triton")
    assert result is out
    assert attention_calls == ["paged_attention"]
    expected = kernels.paged_attention(step.call(), backend="torch")
    assert rel_err(result, expected) < TOLERANCE[torch.float32]
    kv = torch.ones(1, 1, 64)
    kernels.store_kv(kv, kv, step.key_cache, step.value_cache, torch.tensor([3]), backend="triton")
    assert store_calls == ["store_kv"]
    assert torch.equal(step.key_cache[0, 3], kv[0])


@needs_interpreter
def test_global_default_and_env_var_force_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    triton_calls = _spy(monkeypatch, triton_attention, "paged_attention")
    torch_calls = _spy(monkeypatch, reference, "paged_attention")
    with kernels.use_backend("triton"):
        assert kernels.get_backend() == "triton"
        _attend()
        _attend(backend="torch")  # a per-call choice beats the default
    assert kernels.get_backend() == "auto"
    monkeypatch.setenv(kernels.BACKEND_ENV_VAR, "Triton")
    _attend()
    kernels.set_backend("torch")  # set_backend beats the environment
    _attend()
    assert triton_calls == ["paged_attention", "paged_attention"]
    assert torch_calls == ["paged_attention", "paged_attention"]


def test_unknown_backend_names_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="set_backend: backend must be one of auto, torch"):
        kernels.set_backend("cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        _attend(backend="flash")
    monkeypatch.setenv(kernels.BACKEND_ENV_VAR, "fast")
    with pytest.raises(ValueError, match=kernels.BACKEND_ENV_VAR):
        kernels.get_backend()


def test_forcing_triton_on_cpu_without_interpreter_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(triton_attention, "INTERPRETED", False)
    with pytest.raises(RuntimeError, match="need a CUDA device, or TRITON_INTERPRET=1"):
        _attend(backend="triton")
    with pytest.raises(RuntimeError, match="cannot run on cpu tensors"):
        kernels.resolve_backend(CPU, "triton")
    assert kernels.resolve_backend(CPU) == "torch"


def test_missing_triton_falls_back_on_auto_and_fails_when_forced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch, "triton_import_error", lambda: "ImportError: no triton")
    assert kernels.resolve_backend(CUDA) == "torch"
    with pytest.raises(RuntimeError, match=r"needs the triton package.*ImportError: no triton"):
        kernels.resolve_backend(CUDA, "triton")


INPUT_FIELDS = {field.name for field in dataclasses.fields(kernels.PagedAttentionInputs)}
BAD_ATTENTION_ARGS: list[tuple[Callable[[Any], dict[str, Any]], str]] = [
    (
        lambda s: {
            "query": torch.zeros(4, 3, 64),
            "key_cache": torch.zeros(6, 16, 2, 64),
            "value_cache": torch.zeros(6, 16, 2, 64),
        },
        "num_heads 3 is not a multiple of num_kv_heads 2",
    ),
    (lambda s: {"query": torch.zeros(4, 2, 32)}, "head_dim 32 differs"),
    (lambda s: {"query": s.query.double()}, "dtype must be float16"),
    (lambda s: {"value_cache": s.value_cache.half()}, "must have query's dtype"),
    (lambda s: {"value_cache": s.value_cache[:, :8]}, "must both be \\[num_blocks"),
    (lambda s: {"query_start_loc": s.inputs.query_start_loc[:2]}, "num_seqs \\+ 1 = 3"),
    (lambda s: {"block_tables": s.inputs.block_tables[:1]}, "block_tables must be"),
    (lambda s: {"context_lens": s.inputs.context_lens.float()}, "context_lens must be int32"),
    (lambda s: {"out": s.query.half()}, "out must match query"),
]


@pytest.mark.parametrize(
    ("change", "message"), BAD_ATTENTION_ARGS, ids=[m for _, m in BAD_ATTENTION_ARGS]
)
def test_bad_attention_arguments_fail_clearly(
    change: Callable[[Any], dict[str, Any]], message: str
) -> None:
    step = _step()
    changed = change(step)
    # Each change replaces one argument: a per-layer one, or a field of the step's inputs.
    inputs = dataclasses.replace(
        step.inputs, **{k: v for k, v in changed.items() if k in INPUT_FIELDS}
    )
    layer = {k: v for k, v in changed.items() if k not in INPUT_FIELDS}
    with pytest.raises(ValueError, match=message):
        kernels.paged_attention(step.call(inputs=inputs, scale=1.0, **layer))


def test_bad_store_arguments_fail_clearly() -> None:
    cache = torch.zeros(2, 16, 2, 64)
    kv = torch.zeros(3, 2, 64)
    with pytest.raises(ValueError, match=r"slot_mapping must be \[num_tokens=3\]"):
        kernels.store_kv(kv, kv, cache, cache, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="int32 or int64"):
        kernels.store_kv(kv, kv, cache, cache, torch.zeros(3))
    with pytest.raises(ValueError, match="do not match the cache"):
        kernels.store_kv(kv[:, :1], kv[:, :1], cache, cache, torch.zeros(3, dtype=torch.int64))
