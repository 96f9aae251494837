"""Benchmark the paged-attention kernels on a CUDA device; prints Markdown tables.

Decode: batch 1-256 x context 512-32k, one new token per sequence. Prefill: chunks of new
tokens over a context. For each case: kernel time, achieved GB/s (K/V and queries read plus
outputs written, over time), that as a share of the card's measured device-to-device copy
bandwidth, and the speed relative to torch SDPA on the same K/V already gathered into
contiguous tensors (the dense baseline paging has to compete with; >1 means paging is faster).

    python -m benchmarks kernels                 # CUDA, Llama-3-8B-like heads, bf16
    python -m benchmarks kernels --cpu-smoke     # tiny run on CPU to check the logic
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from paged_llm.kernels import AttentionCall, PagedAttentionInputs, paged_attention, resolve_backend

from . import argument_parser

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Shape:
    """Attention heads and KV layout of the benchmarked model."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def element_size(self) -> int:
        """Bytes of one value in the benchmarked dtype."""
        return torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class Case:
    """One step: batch sequences, each with q_len new tokens at a context of ctx tokens."""

    batch: int
    q_len: int
    ctx: int


class Timer:
    """Median milliseconds of a callable: CUDA events via triton's do_bench, else wall clock."""

    def __init__(self, device: torch.device, rep_ms: int) -> None:
        self.device, self.rep_ms = device, rep_ms

    def __call__(self, fn: Callable[[], object]) -> float:
        """Median milliseconds of ``fn``."""
        if self.device.type == "cuda":
            from triton.testing import do_bench

            warmup = max(5, self.rep_ms // 4)
            return float(do_bench(fn, warmup=warmup, rep=self.rep_ms, return_mode="median"))
        fn()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[len(times) // 2]


def copy_bandwidth(device: torch.device, nbytes: int, timer: Timer) -> float:
    """Measured device-to-device copy bandwidth in GB/s (bytes read plus written)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9


@dataclass
class Step:
    """The tensors of one benchmarked step: its queries and pool, and the step's metadata."""

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    inputs: PagedAttentionInputs


def build_step(shape: Shape, case: Case, device: torch.device) -> Step:
    """A step over a pool with shuffled blocks: every sequence has the same lengths."""
    gen = torch.Generator(device=device).manual_seed(0)
    blocks_per_seq = -(-case.ctx // shape.block_size)
    num_blocks = case.batch * blocks_per_seq
    pool_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    num_tokens = case.batch * case.q_len
    perm = torch.randperm(num_blocks, generator=gen, device=device)
    # No plan cache: each timed call plans on the torch path, as a step's first layer does.
    inputs = PagedAttentionInputs(
        block_tables=perm.view(case.batch, blocks_per_seq).to(torch.int32),
        context_lens=torch.full((case.batch,), case.ctx, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(
            0, num_tokens + 1, case.q_len, dtype=torch.int32, device=device
        ),
        max_query_len=case.q_len,
        max_context_len=case.ctx,
    )
    return Step(
        query=torch.randn(
            (num_tokens, shape.num_heads, shape.head_dim),
            generator=gen,
            device=device,
            dtype=shape.dtype,
        ),
        key_cache=torch.randn(pool_shape, generator=gen, device=device, dtype=shape.dtype),
        value_cache=torch.randn(pool_shape, generator=gen, device=device, dtype=shape.dtype),
        inputs=inputs,
    )


def paged_call(
    step: Step, shape: Shape, backend: str, splits: int | None = None
) -> Callable[[], object]:
    """The paged kernel on this step; splits forces the Triton launcher's split count."""
    out = torch.empty_like(step.query)
    # Built once, outside the timed call, as the engine builds one per layer before calling.
    call = AttentionCall(
        step.query, step.key_cache, step.value_cache, step.inputs, shape.head_dim**-0.5, out=out
    )
    if splits is None:
        return lambda: paged_attention(call, backend=backend)
    from paged_llm.kernels.triton import attention as triton_attention

    return lambda: triton_attention.paged_attention(call, num_kv_splits=splits)


def sdpa_baseline(step: Step, shape: Shape, case: Case) -> Callable[[], object]:
    """SDPA over K/V gathered once into contiguous [batch, kv_heads, ctx, dim] tensors."""
    kv_shape = (case.batch, -1, shape.num_kv_heads, shape.head_dim)

    def gather(cache: torch.Tensor) -> torch.Tensor:
        dense = cache[step.inputs.block_tables.long()].view(kv_shape)[:, : case.ctx]
        return dense.transpose(1, 2).contiguous()

    keys, values = gather(step.key_cache), gather(step.value_cache)
    scale = float(shape.head_dim**-0.5)
    ratio = shape.num_heads // shape.num_kv_heads
    if case.q_len == 1:
        # A KV head's query heads become the query rows: no GQA support needed from SDPA.
        q = step.query.view(case.batch, shape.num_kv_heads, ratio, shape.head_dim)
        return lambda: F.scaled_dot_product_attention(q, keys, values, scale=scale)
    q = step.query.view(case.batch, case.q_len, shape.num_heads, shape.head_dim).transpose(1, 2)
    if case.q_len == case.ctx:
        return lambda: F.scaled_dot_product_attention(
            q, keys, values, is_causal=True, scale=scale, enable_gqa=True
        )
    device = step.query.device
    positions = torch.arange(case.ctx - case.q_len, case.ctx, device=device)
    mask = torch.arange(case.ctx, device=device) <= positions[:, None]
    return lambda: F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )


def traffic_bytes(shape: Shape, case: Case) -> int:
    """Minimum bytes a step moves: its K/V once, its queries, its outputs."""
    kv = 2 * case.batch * case.ctx * shape.num_kv_heads * shape.head_dim
    q_and_out = 2 * case.batch * case.q_len * shape.num_heads * shape.head_dim
    return (kv + q_and_out) * shape.element_size


def attention_flops(shape: Shape, case: Case) -> float:
    """Multiply-adds x2 of QK^T and PV over the keys each query really sees (causal)."""
    seen = sum(case.ctx - case.q_len + 1 + i for i in range(case.q_len))
    return 4.0 * case.batch * seen * shape.num_heads * shape.head_dim


def needed_bytes(shape: Shape, case: Case) -> int:
    """Peak device memory of a case: the pool, its gathered copy and one gather temporary."""
    return 3 * traffic_bytes(shape, case) + (64 << 20)


def run_case(
    shape: Shape, case: Case, device: torch.device, timer: Timer, backend: str
) -> dict[str, float]:
    """Time the paged kernel (and, for split decode, its single-pass variant) and SDPA."""
    step = build_step(shape, case, device)
    result = {"paged_ms": timer(paged_call(step, shape, backend))}
    result["splits"], result["single_ms"] = 1, math.nan
    if resolve_backend(device, backend) == "triton":
        from paged_llm.kernels.triton.config import choose_num_splits

        splits = choose_num_splits(case.batch, shape.num_kv_heads, case.q_len, case.ctx, device)
        result["splits"] = splits
        if splits > 1:
            result["single_ms"] = timer(paged_call(step, shape, backend, splits=1))
    result["sdpa_ms"] = timer(sdpa_baseline(step, shape, case))
    del step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


@dataclass(frozen=True)
class Sweep:
    """What every case of one run shares: the heads, the device and its timer, the backend."""

    shape: Shape
    device: torch.device
    timer: Timer
    backend: str
    copy_gbs: float

    def rows(
        self,
        header: list[str],
        cases: Sequence[Case],
        label: Callable[[Case], str],
        cells: Callable[[Case, dict[str, float]], str],
    ) -> list[str]:
        """Markdown lines: ``header``, then each case's ``label`` and its timed ``cells``."""
        lines = list(header)
        for case in cases:
            if not fits(self.shape, case, self.device):
                lines.append(f"| {label(case)} | skipped: not enough device memory |")
                continue
            r = run_case(self.shape, case, self.device, self.timer, self.backend)
            lines.append(f"| {label(case)} | {cells(case, r)} |")
        return lines

    def share(self, gbs: float) -> str:
        """``gbs`` as a percentage of the measured copy bandwidth."""
        return f"{100 * gbs / self.copy_gbs:.0f}%"


def decode_table(sweep: Sweep, cases: Sequence[Case]) -> list[str]:
    """Markdown rows for the decode sweep."""

    def cells(case: Case, r: dict[str, float]) -> str:
        gbs = traffic_bytes(sweep.shape, case) / (r["paged_ms"] * 1e-3) / 1e9
        single = "" if math.isnan(r["single_ms"]) else f"{r['single_ms']:.3f}"
        return (
            f"{int(r['splits'])} | {r['paged_ms']:.3f} | {gbs:.0f} | {sweep.share(gbs)} | "
            f"{r['sdpa_ms']:.3f} | {r['sdpa_ms'] / r['paged_ms']:.2f} | {single}"
        )

    header = [
        "| batch | context | splits | paged ms | GB/s | % of copy BW | SDPA ms | vs SDPA (x) "
        "| 1-pass ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return sweep.rows(header, cases, lambda case: f"{case.batch} | {case.ctx}", cells)


def prefill_table(sweep: Sweep, cases: Sequence[Case]) -> list[str]:
    """Markdown rows for the prefill-chunk cases."""

    def cells(case: Case, r: dict[str, float]) -> str:
        seconds = r["paged_ms"] * 1e-3
        gbs = traffic_bytes(sweep.shape, case) / seconds / 1e9
        tflops = attention_flops(sweep.shape, case) / seconds / 1e12
        return (
            f"{r['paged_ms']:.3f} | {tflops:.1f} | {gbs:.0f} | {sweep.share(gbs)} | "
            f"{r['sdpa_ms']:.3f} | {r['sdpa_ms'] / r['paged_ms']:.2f}"
        )

    header = [
        "| chunk | context | paged ms | TFLOP/s | GB/s | % of copy BW | SDPA ms | vs SDPA (x) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return sweep.rows(header, cases, lambda case: f"{case.q_len} | {case.ctx}", cells)


def fits(shape: Shape, case: Case, device: torch.device) -> bool:
    """Whether the case's pool and baseline copy fit in free device memory."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return needed_bytes(shape, case) < 0.9 * free


# Defaults for a CUDA run (Llama-3-8B-like attention) and for the tiny CPU smoke run.
GPU_DEFAULTS = {
    "dtype": "bfloat16",
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "batches": [1, 4, 16, 64, 256],
    "contexts": [512, 2048, 8192, 32768],
    "prefill": [[512, 4096], [2048, 2048], [2048, 8192]],
}
SMOKE_DEFAULTS = {
    "dtype": "float32",
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 64,
    "batches": [1, 3],
    "contexts": [40, 100],
    "prefill": [[16, 48], [32, 32]],
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options, with the CUDA or smoke-run defaults filled in where none was given."""
    parser = argument_parser("kernels", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes on the CPU (torch backend unless forced) to check the logic",
    )
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    parser.add_argument("--dtype", choices=sorted(DTYPES))
    parser.add_argument("--heads", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+")
    parser.add_argument("--contexts", type=int, nargs="+")
    parser.add_argument(
        "--prefill",
        type=int,
        nargs=2,
        action="append",
        metavar=("CHUNK", "CTX"),
        help="a prefill chunk of CHUNK new tokens ending at context CTX (repeatable)",
    )
    parser.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time")
    args = parser.parse_args(argv)
    for name, default in (SMOKE_DEFAULTS if args.cpu_smoke else GPU_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for chunk, ctx in args.prefill:
        if not 0 < chunk <= ctx:
            parser.error(f"--prefill {chunk} {ctx}: need 0 < CHUNK <= CTX")
    if args.heads % args.kv_heads:
        parser.error("--heads must be a multiple of --kv-heads")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Print the decode and prefill tables; 2 when there is no CUDA device and no --cpu-smoke."""
    args = parse_args(argv)
    if args.cpu_smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        message = "needs a CUDA device (none found); --cpu-smoke checks the logic on the CPU"
        print(f"benchmarks.kernels: {message}", file=sys.stderr)
        return 2
    shape = Shape(args.heads, args.kv_heads, args.head_dim, args.block_size, DTYPES[args.dtype])
    timer = Timer(device, args.rep_ms)
    copy_gbs = copy_bandwidth(device, (1 << 30) if device.type == "cuda" else (16 << 20), timer)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run)"
    print(f"# Paged attention on {name}\n")
    print(
        f"backend {resolve_backend(device, args.backend)}, {args.dtype}, heads {args.heads}, "
        f"kv heads {args.kv_heads}, head dim {args.head_dim}, block size {args.block_size}; "
        f"measured copy bandwidth {copy_gbs:.0f} GB/s\n"
    )
    decode = [Case(b, 1, c) for c in args.contexts for b in args.batches]
    print("## Decode (one new token per sequence)\n")
    sweep = Sweep(shape, device, timer, args.backend, copy_gbs)
    print("\n".join(decode_table(sweep, decode)))
    prefill = [Case(1, chunk, ctx) for chunk, ctx in args.prefill]
    print("\n## Prefill chunk (one sequence)\n")
    print("\n".join(prefill_table(sweep, prefill)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
