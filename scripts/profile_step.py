"""Where one decode step's time goes at 1, 8 and 32 sequences: a torch profiler breakdown.

``.venv/bin/python scripts/profile_step.py [--dtype auto] [--weights auto]``: decodes 64-token
prompts and profiles 8 steps per batch size; ops are grouped into matrix products,
attention (KV store, gather, SDPA), other torch ops (elementwise, norms, sampling), the
engine's own 4-bit/8-bit kernels (kernels/cpu_quant.c, timed around each call), and the
rest of the wall time (Python, scheduling, framework dispatch). The float32 CPU decode
attention kernel (kernels/cpu_attention.c) is timed around its calls and counts as attention.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import ModuleType

from bench_machine import step_until_decoding
from torch.profiler import ProfilerActivity, profile

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.loader import load_model
from paged_llm.engine.sequence import SamplingParams
from paged_llm.kernels import cpu_attention, cpu_quant

ROOT = Path(__file__).resolve().parents[1]
MATMUL = ("mm", "addmm", "bmm", "_weight_int4pack_mm_for_cpu", "_weight_int8pack_mm", "matmul")
ATTENTION = ("scaled_dot_product", "index_select", "index_put", "index_copy", "_flash_attention")


def bucket(name: str) -> str:
    """The group an aten op's self time counts in."""
    op = name.removeprefix("aten::")
    if op in MATMUL:
        return "matmul"
    if any(key in op for key in ATTENTION):
        return "attention"
    return "other ops"


class KernelClock:
    """Seconds spent in one of the engine's C kernels (not aten ops: the profiler skips them)."""

    def __init__(self, module: ModuleType, name: str) -> None:
        self.seconds = 0.0
        self._run = getattr(module, name)
        setattr(module, name, self._timed)

    def _timed(self, *args: object) -> object:
        started = time.perf_counter()
        try:
            return self._run(*args)
        finally:
            self.seconds += time.perf_counter() - started


def main() -> None:
    """Profile decode steps per batch size and print a table (milliseconds per step)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    config = EngineConfig(
        device="cpu",
        dtype=args.dtype,
        weights=args.weights,
        cache_dir=ROOT / ".cache" / "converted",
    )
    loaded = load_model(config)
    engine = LLMEngine(loaded, config)
    print(f"{loaded.dtype}, weights {loaded.weights}")
    clock = KernelClock(cpu_quant, "_in_one_call")
    # reference.py calls it through the module: wrapping the attribute times every call.
    attention = KernelClock(cpu_attention, "decode")
    print(
        "| sequences | step ms | matmul | attention | other ops | 4/8-bit kernels | Python & rest |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in (1, 8, 32):
        params = SamplingParams(temperature=0, max_tokens=args.steps + 8, ignore_eos=True)
        for i in range(batch):
            engine.add_request(list(range(1000 + i, 1064 + i)), params, request_id=f"{batch}-{i}")
        # Prefill (the token budget spreads 32 prompts over several steps), then warm up:
        # the profiled steps must all be pure decode steps.
        step_until_decoding(engine)
        engine.step()
        clock.seconds = attention.seconds = 0.0
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            wall = (time.perf_counter() - started) / args.steps * 1e3
        groups = {"matmul": 0.0, "attention": 0.0, "other ops": 0.0}
        for event in prof.key_averages():
            if event.key.startswith("aten::"):
                groups[bucket(event.key)] += event.self_cpu_time_total / 1e3 / args.steps
        groups["attention"] += attention.seconds * 1e3 / args.steps
        groups["kernels"] = clock.seconds * 1e3 / args.steps
        rest = wall - sum(groups.values())
        cells = " | ".join(f"{v:.1f} ({v / wall:.0%})" for v in (*groups.values(), rest))
        print(f"| {batch} | {wall:.1f} | {cells} |", flush=True)
        while engine.has_unfinished():
            engine.step()


if __name__ == "__main__":
    main()
