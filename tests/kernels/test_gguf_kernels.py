"""The GGUF block kernels: GGUF's dequantization bit for bit, products within stated float
bounds of a float64 oracle, the same bits for a row alone or in any batch, and the C self-test
on every path the machine reaches (native, portable, aarch64 under qemu, musl)."""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import shutil
import subprocess
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from paged_llm.kernels.cpu import gguf_matmul as gk
from tests.helpers.support import CACHE

pytestmark = pytest.mark.skipif(
    gk.unavailable() is not None, reason=f"no GGUF CPU kernels: {gk.unavailable()}"
)
ROOT = Path(__file__).resolve().parents[2]
U = 2.0**-24  # float32's unit roundoff
SMALL = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
SUPER = ["Q4_K", "Q5_K", "Q6_K"]
FLOAT = ["F32", "F16", "BF16"]
WIDTHS = {
    **{name: [32, 96, 2080] for name in SMALL},
    **{name: [256, 512, 2816] for name in SUPER},
    **{name: [7, 96, 2080] for name in FLOAT},
}
# (rows, outputs, which width): every row count, output count and width at least once.
PRODUCTS = [(1, 1000, 2), (2, 7, 1), (3, 33, 0), (8, 1000, 0), (17, 1, 2), (64, 33, 1),
            (300, 7, 2)]  # fmt: skip
MAX_N = 1000
# Byte offsets of the K types' fp16 scales (d, dmin): random bytes there may be inf or NaN.
_K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _qtype(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name]


@functools.cache
def _weight(name: str, k: int, n: int = MAX_N) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random weight: its GGUF bytes [n, row_bytes], gguf's float32 values [n, k], and each
    value's min term (m or dmin * m_j where the type has one, else 0) for error bounds."""
    rng = np.random.default_rng(zlib.crc32(f"{name} {k} {n}".encode()))
    if name in SUPER:
        size = gk.row_bytes(gk.TYPES[name], k)
        data = rng.integers(0, 256, (n * k // 256, size * 256 // k), dtype=np.uint8)
        for at in _K_SCALES[name]:
            scale = rng.uniform(1e-3, 1e-1, (data.shape[0], 1)) * rng.choice(
                [-1, 1], (data.shape[0], 1)
            )
            data[:, at : at + 2] = scale.astype(np.float16).view(np.uint8)
        data = data.reshape(n, size)
    elif name == "F32":
        data = rng.standard_normal((n, k), dtype=np.float32).view(np.uint8)
    else:
        data = gguf.quants.quantize(rng.standard_normal((n, k), dtype=np.float32), _qtype(name))
        data = data.view(np.uint8).reshape(n, -1)
    values = gguf.quants.dequantize(data, _qtype(name)).reshape(n, k)
    return data, values, _min_terms(name, data, n, k)


def _min_terms(name: str, data: np.ndarray, n: int, k: int) -> np.ndarray:
    """Per value, the offset a type adds to d * q (Q4_1, Q5_1: m; Q4_K, Q5_K: dmin * m_j)."""
    if name in ("Q4_1", "Q5_1"):
        blocks = data.reshape(n * k // 32, -1)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        return np.repeat(m, 32, axis=1).reshape(n, k)
    if name in ("Q4_K", "Q5_K"):
        blocks = data.reshape(n * k // 256, -1)
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        _, mins = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
        return np.repeat(dmin * mins.astype(np.float32), 32, axis=1).reshape(n, k)
    return np.zeros((n, k), dtype=np.float32)


def _matrix(name: str, k: int, n: int = MAX_N) -> gk.Matrix:
    """The kernels' matrix over the first n rows of _weight(name, k) (a zero-copy view)."""
    data = _weight(name, k)[0][:n].reshape(-1)
    return gk.Matrix(data, gk.TYPES[name], n, k)


def _inputs(rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Random inputs with a spread of magnitudes, some blocks of them zero."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen).mul(4).exp()
    x[::5, : min(k, 32)] = 0.0
    return x.numpy()


@pytest.mark.parametrize("name", SMALL + SUPER + FLOAT)
@pytest.mark.parametrize("shape", [(3, 0), (5, 1), (2, 2)], ids=["n3", "n5", "n2"])
def test_dequantize_is_ggufs_bit_for_bit(name: str, shape: tuple[int, int]) -> None:
    n, k = shape[0], WIDTHS[name][shape[1]]
    got = _matrix(name, k, n).dequantize()
    want = _weight(name, k)[1][:n]
    assert got.shape == (n, k)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _oracle(name: str, x: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 x @ W.T and its float32 rounding bound for the kernels' combination.

    Each (row, output) sums float terms: per 32-value block (dw * dx) * s (+ (mw * dx) * sum),
    each rounded at most 4 times, added into 8 lanes (k/256 adds each, then 3); per 256-value
    block d*dx*S - dmin*dx*M (5 roundings), k/256 adds; float weights 32 lanes of k/32 adds
    and 5. Beyond that the oracle's own float32 inputs x = q * d and weights d * q + m are
    each within U of the exact values the kernels' integers stand for. So with
    T = sum |x| (|w| + 2 |min|) (the terms' magnitudes, mins counted twice for the K types'
    d*S - dmin*M), the error is below (k/32 + 12) * U * T.
    """
    _, values, mins = _weight(name, k)
    w, m = values[:n].astype(np.float64), mins[:n].astype(np.float64)
    xd = x.astype(np.float64)
    magnitude = np.abs(xd) @ (np.abs(w) + 2 * np.abs(m)).T
    return xd @ w.T, (k / 32 + 12) * U * magnitude


@pytest.mark.parametrize("name", SMALL + SUPER + FLOAT)
@pytest.mark.parametrize("product", PRODUCTS, ids=[f"rows{r}-n{n}-k{k}" for r, n, k in PRODUCTS])
def test_linear_is_the_product_of_the_quantized_inputs(
    name: str, product: tuple[int, int, int]
) -> None:
    """Tight: against x_deq @ W.T, x_deq the inputs after the kernels' 8-bit quantization."""
    rows, n, which = product
    k = WIDTHS[name][which]
    x = _inputs(rows, k, seed=rows)
    type_id = gk.TYPES[name]
    x_deq = gk.dequantize_act(type_id, gk.quantize_act(type_id, x), k)
    if name in FLOAT:
        assert np.array_equal(x_deq, x)
    got = _matrix(name, k, n).linear(x).astype(np.float64)
    want, bound = _oracle(name, x_deq, n, k)
    assert got.shape == (rows, n)
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


@pytest.mark.parametrize("name", SMALL + SUPER)
@pytest.mark.parametrize("product", PRODUCTS, ids=[f"rows{r}-n{n}-k{k}" for r, n, k in PRODUCTS])
def test_linear_is_the_product_within_the_quantization_step(
    name: str, product: tuple[int, int, int]
) -> None:
    """Loose: against the unquantized x. Each input moves by at most half its block's step
    d = max|x| / 127 (plus the rounding of x / d: (0.5 + 1e-4) d in all), so the product
    moves by at most sum_i (0.5 + 1e-4) d_i |w_i|, on top of the tight bound."""
    rows, n, which = product
    k = WIDTHS[name][which]
    x = _inputs(rows, k, seed=rows)
    block = gk.block_size(gk.TYPES[name])
    step = np.abs(x).reshape(rows, k // block, block).max(axis=2) / 127
    half_step = np.repeat(step * (0.5 + 1e-4), block, axis=1).astype(np.float64)
    got = _matrix(name, k, n).linear(x).astype(np.float64)
    want, bound = _oracle(name, x, n, k)
    bound = bound + half_step @ np.abs(_weight(name, k)[1][:n].astype(np.float64)).T
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


def test_the_loose_bound_is_not_vacuous() -> None:
    """The quantization error is a real part of the loose bound, not slack that hides bugs."""
    k, n = 2080, 33
    x = _inputs(4, k)
    got = _matrix("Q8_0", k, n).linear(x).astype(np.float64)
    want, _ = _oracle("Q8_0", x, n, k)
    step = np.abs(x).reshape(4, k // 32, 32).max(axis=2) / 127
    half = np.repeat(step / 2, 32, axis=1) @ np.abs(_weight("Q8_0", k)[1][:n]).T
    assert np.max(np.abs(got - want)) > 0.01 * np.max(half)


@pytest.mark.parametrize("name", SMALL + SUPER + FLOAT)
def test_a_row_gives_the_same_bits_alone_or_in_any_batch(name: str) -> None:
    k, n = WIDTHS[name][2], 33
    matrix = _matrix(name, k, n)
    x = _inputs(64, k, seed=7)
    full = matrix.linear(x)
    for r in range(64):
        assert _same(matrix.linear(x[r : r + 1]), full[r : r + 1]), f"row {r} alone"
    for start, size in [(0, 3), (5, 3), (8, 8), (41, 8), (50, 14)]:
        got = matrix.linear(x[start : start + size])
        assert _same(got, full[start : start + size]), f"rows {start}..{start + size - 1}"
    shuffled = np.random.default_rng(1).permutation(64)
    assert _same(matrix.linear(x[shuffled]), full[shuffled])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """The same shape and bits (NaN included)."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", ["Q4_0", "Q6_K", "F16"])
def test_the_thread_count_does_not_change_the_bits(name: str) -> None:
    k, n = WIDTHS[name][2], MAX_N
    matrix = _matrix(name, k, n)
    x = _inputs(9, k, seed=3)
    # torch sets the OpenMP runtime's thread count, which the kernels share
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = matrix.linear(x)
        torch.set_num_threads(max(2, before))
        many = matrix.linear(x)
    finally:
        torch.set_num_threads(before)
    assert _same(one, many)


@pytest.mark.parametrize("name", SMALL + SUPER + FLOAT)
def test_rows_looks_up_dequantized_rows(name: str) -> None:
    k, n = WIDTHS[name][1], 33
    ids = np.array([5, 0, 32, 5, 17], dtype=np.int64)
    got = _matrix(name, k, n).rows(ids)
    want = _weight(name, k)[1][ids]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert _matrix(name, k, n).rows(np.zeros(0, dtype=np.int64)).shape == (0, k)


def test_the_matrix_keeps_the_callers_bytes() -> None:
    """No copy: the weight may be a view over a memory-mapped file."""
    data = _weight("Q4_K", 256)[0].reshape(-1)
    matrix = gk.Matrix(data, gk.TYPES["Q4_K"], MAX_N, 256)
    assert matrix.data.ctypes.data == data.ctypes.data


def test_unsupported_types_are_named() -> None:
    data = np.zeros(1024, dtype=np.uint8)
    with pytest.raises(ValueError, match=r"IQ2_XS is not supported.*supported: F32, F16, Q4_0"):
        gk.Matrix(data, 17, 4, 256)
    with pytest.raises(ValueError, match="Q3_K is not supported"):
        gk.row_bytes(11, 256)
    with pytest.raises(ValueError, match="type 99 is not supported"):
        gk.block_size(99)


def test_widths_that_are_not_whole_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match=r"Q4_K row of width 288 .* 256-value blocks"):
        gk.Matrix(np.zeros(10_000, dtype=np.uint8), gk.TYPES["Q4_K"], 4, 288)
    with pytest.raises(ValueError, match=r"Q8_0 row of width 48 .* 32-value blocks"):
        gk.row_bytes(gk.TYPES["Q8_0"], 48)


def test_inputs_of_the_wrong_width_or_dtype_are_refused() -> None:
    matrix = _matrix("Q4_0", 96, 7)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"takes \[rows, 96\] inputs, got \(2, 95\)"):
        matrix.linear(rng.standard_normal((2, 95), dtype=np.float32))
    with pytest.raises(ValueError, match=r"takes \[rows, 96\] inputs, got \(96,\)"):
        matrix.linear(rng.standard_normal(96, dtype=np.float32))
    with pytest.raises(ValueError, match=r"float32 inputs, not float64"):
        matrix.linear(rng.standard_normal((2, 96)))
    with pytest.raises(ValueError, match=r"numpy inputs, not Tensor"):
        matrix.linear(torch.randn(2, 96))  # the torch layers convert at their edge
    strided = rng.standard_normal((96, 4), dtype=np.float32).T  # made contiguous: same product
    assert _same(matrix.linear(strided), matrix.linear(np.ascontiguousarray(strided)))


def test_weights_of_the_wrong_size_or_dtype_are_refused() -> None:
    q4 = gk.TYPES["Q4_0"]
    with pytest.raises(ValueError, match=r"\[7, 96\] takes 7 x 54 = 378 bytes, got 377"):
        gk.Matrix(np.zeros(377, dtype=np.uint8), q4, 7, 96)
    with pytest.raises(ValueError, match=r"1-D uint8 numpy array, got 1-D int8"):
        gk.Matrix(np.zeros(378, dtype=np.int8), q4, 7, 96)
    with pytest.raises(ValueError, match=r"1-D uint8 numpy array, got Tensor"):
        gk.Matrix(torch.zeros(378, dtype=torch.uint8), q4, 7, 96)
    with pytest.raises(ValueError, match="contiguous"):
        gk.Matrix(np.zeros(756, dtype=np.uint8)[::2], q4, 7, 96)
    matrix = _matrix("Q4_0", 96, 7)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 7\)"):
        matrix.rows(np.array([0, 7]))
    with pytest.raises(ValueError, match="1-D int64"):
        matrix.rows(np.array([0, 1], dtype=np.int32))


def test_the_path_is_named() -> None:
    paths = {"AVX-512 VNNI", "AVX-512", "AVX-VNNI", "AVX2", "NEON dotprod", "NEON", "portable C"}
    assert gk.vector_path() in paths


def _self_test(*targets: str) -> None:
    """Run scripts/test_kernels_native on targets and assert it passed."""
    # Builds are kept beside the test models, so a warm run only runs them.
    env = {**os.environ, "KERNEL_TEST_CACHE": str(CACHE / "kernel-self-test")}
    done = subprocess.run(
        [str(ROOT / "scripts" / "test_kernels_native"), *targets],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all passed" in done.stdout


def test_the_c_self_test_passes_natively() -> None:
    """This CPU's build against the portable reference routines it holds; on x86 also the
    AVX2 code, with 16 registers and with AVX-512's 32 (tiles of 2 and 4 rows), which a
    machine with VNNI would otherwise never run. ``scripts/test_kernels_native`` with no
    arguments builds every path."""
    x86 = ("x86-64-v3", "avx512-no-vnni") if platform.machine() == "x86_64" else ()
    _self_test("native", *x86)


def test_the_c_self_test_passes_on_aarch64() -> None:
    """Both NEON paths (dotprod and not), under qemu off aarch64."""
    if platform.machine() != "aarch64":
        missing = [
            t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64-static") if not shutil.which(t)
        ]
        if missing:
            pytest.skip(f"no {' or '.join(missing)} (apt-get install gcc-aarch64-linux-gnu "
                        "qemu-user-static)")  # fmt: skip
    _self_test("aarch64")


def test_the_c_self_test_passes_with_musl() -> None:
    """Built with musl-gcc (musl-tools; static, one thread: no musl OpenMP runtime here), as
    Home Assistant OS's C library runs it: this CPU's path and the portable one, bit for bit
    against the reference routines like the glibc builds. aarch64 with musl: the next test."""
    if platform.machine() != "x86_64":
        pytest.skip(f"musl-gcc builds for x86_64 here; this is {platform.machine()}")
    if not shutil.which("musl-gcc"):
        pytest.skip("no musl-gcc (apt-get install musl-tools)")
    _self_test("musl")


def test_the_c_self_test_passes_with_musl_on_aarch64() -> None:
    """Both NEON paths built for aarch64 with musl (static, one thread), as a Raspberry Pi's
    Home Assistant OS runs them, bit for bit against the reference routines; under qemu off
    aarch64. Debian has no aarch64 musl toolchain: zig's C compiler (PyPI's ziglang) is it."""
    if not (
        os.environ.get("MUSL_AARCH64_CC")
        or shutil.which("zig")
        or importlib.util.find_spec("ziglang") is not None
    ):
        pytest.skip("no aarch64 musl compiler (pip install ziglang, or set MUSL_AARCH64_CC)")
    if platform.machine() != "aarch64" and not shutil.which("qemu-aarch64-static"):
        pytest.skip("no qemu-aarch64-static (apt-get install qemu-user-static)")
    _self_test("musl-aarch64")
