"""Benchmark the GGUF block kernels (kernels/cpu/src/gguf_kernels.c) against float32 and cpu_quant.

For each matrix shape and weight type, prints microseconds per call and the effective GB/s
of weight bytes read (the weight's size in its format / time) at several row counts, beside
torch's dense float32 F.linear of the same shape (GB/s of its float32 weight) and the old
cpu_quant 4-bit kernel (for Q4_0; GB/s of the Q4_0 bytes, the same model weight). Calls
cycle over copies of each weight, at least --spread MB of them, so that weights come from
memory as a model's layers do, not from the last-level cache. On a machine others share,
--cpu-time runs one thread and times it by its CPU time, which waiting does not inflate.

    scripts/bench gguf_kernels [--rows 1,8,32] [--types Q4_0,Q6_K]
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from paged_llm.kernels.cpu import gguf_matmul as gk
from paged_llm.kernels.cpu import quant as cpu_quant

from . import argument_parser

SHAPES = [(8192, 2048), (2048, 8192)]  # (n outputs, k inputs)
TYPES = ["Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16"]
ROWS = [1, 2, 4, 8, 32, 128, 512]
# Byte offsets of each block's fp16 scales (set to finite values: random bytes may be NaN).
_SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
           "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}  # fmt: skip


def random_weight(type_name: str, n: int, k: int) -> gk.Matrix:
    """A weight of random codes with finite scales (the kernels' speed does not see values)."""
    type_id = gk.TYPES[type_name]
    size = gk.row_bytes(type_id, k)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=gen)
    if type_name in _SCALES:
        blocks = data.view(-1, size * gk.block_size(type_id) // k)
        half = torch.full((blocks.shape[0], 1), 0.01, dtype=torch.float16).view(torch.uint8)
        for at in _SCALES[type_name]:
            blocks[:, at : at + 2] = half
    elif type_name in ("F16", "BF16", "F32"):
        dtype = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}[type_name]
        data = torch.randn(n * k, generator=gen).to(dtype).view(torch.uint8)
    return gk.Matrix(data.numpy(), type_id, n, k)


Call = Callable[[], object]


CLOCK = time.perf_counter


def seconds_per_call(fn: Call, budget: float) -> float:
    """The mean of repeated calls (after a warm-up), within about ``budget`` seconds.

    The mean, not the fastest: with rotating copies the fastest call is the one whose weight
    a large last-level cache still held, which overstated the GB/s a model's layers get.
    """
    fn()
    spent, calls = 0.0, 0
    while calls < 3 or (spent < budget and calls < 200):
        start = CLOCK()
        fn()
        spent, calls = spent + CLOCK() - start, calls + 1
    return spent / calls


def rotating(copies: list[Call]) -> Call:
    """Each call runs the next of ``copies`` in turn."""
    turn = itertools.cycle(copies)
    return lambda: next(turn)()


def count(size: int, spread: int) -> int:
    """Copies of a ``size``-byte weight that fill ``spread`` bytes (at least one)."""
    return max(1, -(-spread // size))


def line(label: str, calls: dict[int, Call], size: int, budget: float) -> None:
    """Print one row of the table: a cell per row count."""
    cells = [cell(seconds_per_call(fn, budget), size) for fn in calls.values()]
    print(f"{label:<16}" + "".join(f"{c:>17}" for c in cells))


def cell(seconds: float, weight_bytes: int) -> str:
    """'µs GB/s' for one call."""
    return f"{seconds * 1e6:9.0f} {weight_bytes / seconds / 1e9:6.1f}"


def old_q4(n: int, k: int) -> cpu_quant.Packed:
    """cpu_quant's packed 4-bit weight of the same shape (codes, scale, zero)."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    scale = torch.rand(n, k // 32, generator=gen) / 100
    zero = torch.rand(n, k // 32, generator=gen) / 100
    return cpu_quant.Packed(cpu_quant.pack_q4(codes), scale.contiguous(), zero.contiguous())


def main(argv: list[str] | None = None) -> None:
    """Print a table per matrix shape: each weight type, then the dense and old baselines."""
    parser = argument_parser("gguf_kernels", __doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per cell")
    parser.add_argument("--spread", type=int, default=256, help="MB of weight copies per row")
    parser.add_argument("--cpu-time", action="store_true", help="one thread, its CPU time")
    args = parser.parse_args(argv)
    if args.cpu_time:  # torch's thread count is OpenMP's, which the kernels share
        global CLOCK
        CLOCK = time.thread_time
        torch.set_num_threads(1)
    rows_list = [int(r) for r in args.rows.split(",")]
    types = args.types.split(",")
    reason = gk.unavailable()
    if reason is not None:
        raise SystemExit(f"the GGUF kernels are unavailable: {reason}")
    old = cpu_quant.unavailable() is None
    clock = "CPU time of one thread" if args.cpu_time else "wall clock"
    print(f"path {gk.vector_path()}, threads {torch.get_num_threads()}, {clock}")
    print("each cell: microseconds per call, GB/s of weight bytes")
    for n, k in SHAPES:
        print(f"\n[{n} x {k}]" + "".join(f"{'rows ' + str(r):>17}" for r in rows_list))
        xs = {r: torch.randn(r, k) for r in rows_list}
        spread = args.spread << 20
        for name in types:
            size = random_weight(name, 1, k).data.size * n
            weights = [random_weight(name, n, k) for _ in range(count(size, spread))]
            # the kernels' binding takes numpy: views of the same inputs
            calls = {
                r: rotating([partial(w.linear, xs[r].numpy()) for w in weights]) for r in rows_list
            }
            line(name, calls, size, args.budget)
        dense = [torch.randn(n, k) for _ in range(count(4 * n * k, spread))]
        calls = {r: rotating([partial(F.linear, xs[r], d) for d in dense]) for r in rows_list}
        line("torch f32 dense", calls, 4 * n * k, args.budget)
        if old and "Q4_0" in types:
            size = gk.row_bytes(gk.TYPES["Q4_0"], k) * n
            packed = [old_q4(n, k) for _ in range(count(size, spread))]
            calls = {r: rotating([partial(p.linear, xs[r]) for p in packed]) for r in rows_list}
            line("cpu_quant q4", calls, size, args.budget)


if __name__ == "__main__":
    sys.exit(main())
