"""The quantized float32 CPU kernels: the dense weights exactly, only the sums in another order."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from paged_llm.engine.model.quant import Q4Float32Linear, quantize_q4
from paged_llm.kernels.cpu import native_build, prebuilt
from paged_llm.kernels.cpu import quant as cpu_quant

pytestmark = pytest.mark.skipif(
    cpu_quant.unavailable() is not None,
    reason=f"no quantized CPU kernels: {cpu_quant.unavailable()}",
)


@pytest.fixture(autouse=True)
def local_builds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the local build: an installed paged-llm-kernels is not looked at
    (tests/kernels/test_prebuilt.py tests that path)."""
    monkeypatch.setattr(prebuilt, "folder", lambda: None)


def copy_source(folder: Path, text: str) -> Path:
    """A copy of cpu_quant.c (as text) in folder, with the header it includes beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(cpu_quant.SOURCE.with_name("cpu_needs.h"), folder / "cpu_needs.h")
    path = folder / "cpu_quant.c"
    path.write_text(text)
    return path


ROWS = [1, 3, cpu_quant.DENSE_ROWS, cpu_quant.DENSE_ROWS + 1, cpu_quant.MAX_ROWS + 1, 70]


def _q4(out_features: int = 80, in_features: int = 160) -> tuple[torch.Tensor, ...]:
    """A random 4-bit weight: packed codes, scale, zero, and its dense float32 value."""
    torch.manual_seed(0)
    q = quantize_q4(torch.randn(out_features, in_features))
    return cpu_quant.pack_q4(q.codes), q.scale.contiguous(), q.zero.contiguous(), q.dequantize()


def _q8(out_features: int = 80, in_features: int = 160) -> tuple[torch.Tensor, ...]:
    """A random 8-bit weight in groups of 32: codes, scale, and its dense float32 value."""
    torch.manual_seed(0)
    codes = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
    scale = torch.rand(out_features, in_features // 32) / 100
    return codes, scale, codes.float() * scale.repeat_interleave(32, dim=1)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the largest reference value."""
    return float((got - ref).abs().max() / ref.abs().max())


def test_pack_keeps_ggufs_nibble_order() -> None:
    """Byte j of a group holds value j low and value j + 16 high, as in a GGUF block."""
    codes = torch.arange(64).remainder(16).reshape(1, 64)
    packed = cpu_quant.pack_q4(codes)
    assert packed.shape == (1, 32)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 16] << 4)
    assert packed[0, 16] == codes[0, 32] | (codes[0, 48] << 4)


def test_dequantize_gives_the_dense_weight_bit_for_bit() -> None:
    codes, scale, zero, dense = _q4()
    assert torch.equal(cpu_quant.q4_dequantize(codes, scale, zero), dense)
    codes8, scale8, dense8 = _q8()
    assert torch.equal(cpu_quant.q8_dequantize(codes8, scale8), dense8)


@pytest.mark.parametrize("rows", ROWS)
def test_q4_linear_is_the_dense_product_up_to_summation_order(rows: int) -> None:
    codes, scale, zero, dense = _q4()
    x = torch.randn(rows, dense.shape[1])
    got = cpu_quant.q4_linear(x, codes, scale, zero)
    ref = F.linear(x, dense)
    assert got.shape == ref.shape
    assert _rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("rows", ROWS)
def test_q8_linear_is_the_dense_product_up_to_summation_order(rows: int) -> None:
    codes, scale, dense = _q8()
    x = torch.randn(rows, dense.shape[1])
    got = cpu_quant.q8_linear(x, codes, scale)
    assert got.shape == (rows, dense.shape[0])
    assert _rel_err(got, F.linear(x, dense)) < 1e-5


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 9, 13, cpu_quant.DENSE_ROWS])
@pytest.mark.parametrize("out_features", [80, 81, 83])
def test_the_products_weights_are_the_dense_ones_bit_for_bit(rows: int, out_features: int) -> None:
    """One-hot rows read single weights back: every path (one row in output pairs, tiles
    from the codes, tiles from a formed row) multiplies exactly the dense weight."""
    codes, scale, zero, dense = _q4(out_features)
    codes8, scale8, dense8 = _q8(out_features)
    columns = torch.randperm(dense.shape[1])[:rows]
    x = torch.eye(dense.shape[1])[columns]
    assert torch.equal(cpu_quant.q4_linear(x, codes, scale, zero), dense[:, columns].T)
    assert torch.equal(cpu_quant.q8_linear(x, codes8, scale8), dense8[:, columns].T)


@pytest.mark.parametrize("out_features", [80, 81, 83])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(out_features: int) -> None:
    """Batch invariance on the kernels' path (up to DENSE_ROWS rows, every decode step of up
    to that many sequences): each output sums its lanes in a fixed order, alone or not."""
    codes, scale, zero, dense = _q4(out_features)
    codes8, scale8, _ = _q8(out_features)
    x = torch.randn(cpu_quant.DENSE_ROWS, dense.shape[1])
    together = cpu_quant.q4_linear(x, codes, scale, zero)
    together8 = cpu_quant.q8_linear(x, codes8, scale8)
    for row in range(x.shape[0]):
        alone = x[row : row + 1]
        assert torch.equal(cpu_quant.q4_linear(alone, codes, scale, zero)[0], together[row])
        assert torch.equal(cpu_quant.q8_linear(alone, codes8, scale8)[0], together8[row])


def test_layer_adds_bias_and_keeps_leading_dimensions() -> None:
    torch.manual_seed(1)
    weight, bias = torch.randn(48, 64), torch.randn(48)
    q = quantize_q4(weight)
    x = torch.randn(2, 3, 64)
    with torch.inference_mode():
        got = Q4Float32Linear(q, bias)(x)
    ref = F.linear(x, q.dequantize(), bias)
    assert got.shape == (2, 3, 48)
    assert _rel_err(got, ref) < 1e-5


def test_a_layer_whose_buffers_were_replaced_reads_the_new_ones() -> None:
    """``model.to()`` swaps buffers for new tensors; the kernels must not keep old addresses."""
    torch.manual_seed(2)
    q = quantize_q4(torch.randn(48, 64))
    layer = Q4Float32Linear(q, None)
    x = torch.randn(1, 64)
    with torch.inference_mode():
        before = layer(x)
        layer._apply(lambda t: t.clone())
        assert torch.equal(layer(x), before)
    assert layer.__dict__["_packed"].tensors[0] is layer.codes


def test_inputs_not_in_groups_of_32_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="inputs in groups of 32, got 40"):
        cpu_quant.pack_q4(torch.zeros(8, 40, dtype=torch.uint8))


def test_non_contiguous_inputs_are_refused_not_misread() -> None:
    codes, scale, zero, _ = _q4()
    with pytest.raises(ValueError, match="contiguous CPU tensors"):
        cpu_quant.q4_dequantize(codes, scale.t().contiguous().t(), zero)
    with pytest.raises(ValueError, match=r"float32 activations, not torch\.float64"):
        cpu_quant.q4_linear(torch.zeros(1, 160, dtype=torch.float64), codes, scale, zero)
    with pytest.raises(ValueError, match=r"takes \[rows, 160\] inputs, got \(1, 192\)"):
        cpu_quant.q4_linear(torch.zeros(1, 192), codes, scale, zero)


def test_without_a_compiler_it_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cpu_quant.load_library(tmp_path) == (
        None,
        "no prebuilt kernels fit (the paged-llm-kernels package is not installed) and there "
        "is no C compiler ($CC, cc, gcc or clang) on PATH to build them",
    )


def test_a_failing_build_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "broken-cc"
    broken.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo broken 1.0 && exit 0\necho "no such flag" >&2\n'
        "exit 1\n"
    )
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    lib, reason = cpu_quant.load_library(tmp_path / "build")
    assert lib is None
    assert reason == f"building them with {broken} failed: no such flag"


def test_a_build_is_reused_for_the_same_source_compiler_and_cpu(tmp_path: Path) -> None:
    lib, reason = cpu_quant.load_library(tmp_path)
    assert reason is None
    assert lib is not None
    built = list(tmp_path.glob("cpu_quant-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    cpu_quant.load_library(tmp_path)
    assert [p.stat().st_mtime_ns for p in tmp_path.glob("cpu_quant-*.so")] == [stamp]


def test_the_default_build_folder_is_the_users_own_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native_build.default_build_dir() == tmp_path / "paged-llm" / "kernels"


def test_another_version_of_the_source_builds_beside_the_engines(tmp_path: Path) -> None:
    """A benchmark can load an older kernel next to the current one: each source its own build."""
    other = copy_source(tmp_path / "other", cpu_quant.SOURCE.read_text() + "\n/* another */\n")
    first, _ = cpu_quant.load_library(tmp_path / "build")
    second, reason = cpu_quant.load_library(tmp_path / "build", other)
    assert reason is None
    assert first is not None
    assert second is not None
    assert len(list((tmp_path / "build").glob("cpu_quant-*.so"))) == 2


# The C source takes the widest vector path the build's -march=native allows; hiding a
# feature's macro from it builds the narrower paths on the same CPU.
_NARROWER = {"avx2": ["__AVX512F__"], "portable": ["__AVX512F__", "__AVX2__"]}


def _cpu_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists a CPU feature."""
    return flag in native_build.cpu_flags().decode().split()


@pytest.fixture(scope="module", params=["native", "avx2", "portable"])
def library(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, ctypes.CDLL]:
    """The kernels built with each vector path this CPU can run, and the path's name."""
    if request.param == "avx2" and not (_cpu_has("avx2") and _cpu_has("avx512f")):
        pytest.skip("the AVX2 path is the native one or not runnable here")
    source = cpu_quant.SOURCE.read_text()
    for macro in _NARROWER.get(request.param, []):
        source = source.replace(macro, f"__HIDDEN{macro}")
    path = copy_source(tmp_path_factory.mktemp(request.param), source)
    lib, reason = cpu_quant.load_library(path.parent / "build", path)
    assert lib is not None, reason
    return request.param, lib


def _product(lib: ctypes.CDLL, x: torch.Tensor, *weight: torch.Tensor) -> torch.Tensor:
    """x @ W.T through one build's q4_linear (codes, scale, zero) or q8_linear (codes, scale)."""
    kernel = lib.q4_linear if len(weight) == 3 else lib.q8_linear
    return cpu_quant._in_one_call(kernel, x, weight[0].shape[0], cpu_quant._addresses(*weight))


def test_every_vector_path_keeps_the_weights_and_batch_invariance(
    library: tuple[str, ctypes.CDLL],
) -> None:
    """Each path a CPU may take: the dense weights bit for bit, the product up to summation
    order, and a row's result the same alone or beside others; each says which it is."""
    variant, lib = library
    native = "AVX-512" if _cpu_has("avx512f") else "AVX2" if _cpu_has("avx2") else "portable C"
    expected = {"native": native if _cpu_has("fma") else "portable C", "avx2": "AVX2"}
    assert lib.quant_path().decode() == expected.get(variant, "portable C")
    codes, scale, zero, dense = _q4(83)
    codes8, scale8, dense8 = _q8(83)
    for rows in (1, 2, 5, 7, 13, cpu_quant.MAX_ROWS):
        columns = torch.randperm(dense.shape[1])[:rows]
        x = torch.eye(dense.shape[1])[columns]
        assert torch.equal(_product(lib, x, codes, scale, zero), dense[:, columns].T)
        assert torch.equal(_product(lib, x, codes8, scale8), dense8[:, columns].T)
    x = torch.randn(cpu_quant.MAX_ROWS, dense.shape[1])
    together = _product(lib, x, codes, scale, zero)
    together8 = _product(lib, x, codes8, scale8)
    assert _rel_err(together, F.linear(x, dense)) < 1e-5
    assert _rel_err(together8, F.linear(x, dense8)) < 1e-5
    for row in range(x.shape[0]):
        alone = x[row : row + 1]
        assert torch.equal(_product(lib, alone, codes, scale, zero)[0], together[row])
        assert torch.equal(_product(lib, alone, codes8, scale8)[0], together8[row])
