"""The 4/8-bit CPU kernels alone at the bundled model's shapes, optionally against an older source.

``scripts/bench cpu_quant [--against REV|FILE] [--rows 1,2,4,8,32]``: times
all 210 4-bit layers of SmolLM2-135M (random weights, so the codes come from memory as in a
decode step) and its 49,152 x 576 8-bit output projection, per number of rows. With
``--against`` the source of that git revision (or that C file) is built too and the two
alternate round by round, so a busy machine skews them alike; prints the best round of
each, in milliseconds.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from paged_llm.kernels.cpu import quant as cpu_quant

from . import ROOT, argument_parser

HIDDEN, INTERMEDIATE, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152
# (out, in) of one decoder layer's q, k, v, o, gate, up and down projections.
LAYER_SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),
                (INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]  # fmt: skip


def q4_weights() -> list[tuple[torch.Tensor, ...]]:
    """Random packed 4-bit weights (codes, scale, zero) for every layer of the model."""
    out = []
    for n, k in LAYER_SHAPES * LAYERS:
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
        groups = (n, k // cpu_quant.GROUP_SIZE)
        out.append((codes, torch.rand(groups) * 0.01, torch.randn(groups) * 0.01))
    return out


def q8_head() -> tuple[torch.Tensor, torch.Tensor]:
    """A random 8-bit output projection (codes, scale)."""
    codes = torch.randint(-127, 128, (VOCAB, HIDDEN), dtype=torch.int8)
    return codes, torch.rand(VOCAB, HIDDEN // cpu_quant.GROUP_SIZE) * 0.01


def time_layers(lib: ctypes.CDLL, rows: int, layers: list, head: tuple) -> tuple[float, float]:
    """Milliseconds for one pass over all 4-bit layers, and for the 8-bit head, at ``rows``."""
    xs = {k: torch.randn(rows, k) for k in (HIDDEN, INTERMEDIATE)}
    outs = {n: torch.empty(rows, n) for n in (HIDDEN, KV, INTERMEDIATE, VOCAB)}
    started = time.perf_counter()
    for codes, scale, zero in layers:
        n, k = codes.shape[0], codes.shape[1] * 2
        lib.q4_linear(xs[k].data_ptr(), rows, k, codes.data_ptr(), scale.data_ptr(),
                      zero.data_ptr(), n, outs[n].data_ptr())  # fmt: skip
    middle = time.perf_counter()
    codes, scale = head
    lib.q8_linear(xs[HIDDEN].data_ptr(), rows, HIDDEN, codes.data_ptr(), scale.data_ptr(),
                  VOCAB, outs[VOCAB].data_ptr())  # fmt: skip
    return (middle - started) * 1e3, (time.perf_counter() - middle) * 1e3


def build(build_dir: Path, source: Path) -> ctypes.CDLL:
    """Build and load one version of the kernels' source, or exit saying why not."""
    lib, reason = cpu_quant.load_library(build_dir, source)
    if lib is None:
        raise SystemExit(f"cannot build {source}: {reason}")
    return lib


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, build the versions, alternate rounds, print the best of each."""
    parser = argument_parser("cpu_quant", __doc__)
    parser.add_argument(
        "--against",
        help="a C file, or a git revision whose kernels/cpu/src/cpu_quant.c, to compare",
    )
    parser.add_argument("--rows", default="1,2,3,4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    if max(rows_list) > cpu_quant.MAX_ROWS:
        raise SystemExit(f"the kernels take at most {cpu_quant.MAX_ROWS} rows per call")
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"current": build(Path(tmp) / "build", cpu_quant.SOURCE)}
        if args.against:
            old = Path(args.against)
            if not old.is_file():
                old = Path(tmp) / "old.c"
                old.write_bytes(subprocess.run(
                    ["git", "show", f"{args.against}:kernels/cpu/src/cpu_quant.c"],
                    cwd=ROOT, capture_output=True, check=True,
                ).stdout)  # fmt: skip
            builds = {args.against: build(Path(tmp) / "build", old), **builds}
        layers, head = q4_weights(), q8_head()
        best: dict[tuple[str, int], tuple[float, float]] = {}
        for _ in range(args.rounds):
            for rows in rows_list:
                for name, lib in builds.items():
                    got = time_layers(lib, rows, layers, head)
                    was = best.get((name, rows), (float("inf"),) * 2)
                    best[name, rows] = (min(was[0], got[0]), min(was[1], got[1]))
    names = list(builds)
    print(f"torch threads {torch.get_num_threads()}; ms, best of {args.rounds}")
    print("| rows | " + " | ".join(f"{n} layers | {n} head" for n in names) + " |")
    print("| ---: |" + " ---: | ---: |" * len(names))
    for rows in rows_list:
        cells = " | ".join(f"{best[n, rows][0]:.1f} | {best[n, rows][1]:.2f}" for n in names)
        print(f"| {rows} | {cells} |")


if __name__ == "__main__":
    sys.exit(main())
