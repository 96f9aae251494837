"""Where one decode step's time goes at 1, 8 and 32 sequences: kernels against the rest.

``scripts/bench profile_step [--model PATH.gguf] [--weights auto]``: decodes
64-token prompts and times 16 pure decode steps per batch size. On a model the engine's C
forward runs (GGUF read in place on the CPU, engine/model/native_forward.py) the step's kernels
are that one call: matrix products, attention, norms, rotary, activations. What is left is
the forward's Python (cos and sin from the model's rotary module, the step's arrays) and
the rest of the step (scheduling, penalties, sampling, outputs). On any other model the
forward is transformers' and counts as a whole. Run on a quiet machine.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from paged_llm.engine.config import EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import load_model
from paged_llm.kernels.cpu import forward as cpu_forward

from . import ROOT, argument_parser
from .machine import in_own_thread, step_until_decoding


class KernelClock:
    """Seconds spent inside the C forward's library call (wraps the ctypes function)."""

    def __init__(self) -> None:
        """Wrap cf_forward of the loaded library."""
        self.seconds = 0.0
        self._lib = cpu_forward._LIBRARY.get()
        self._run = self._lib.cf_forward
        self._lib.cf_forward = self

    def __call__(self, *args: Any) -> int:
        """Run and time one step's call."""
        started = time.perf_counter()
        try:
            done: int = self._run(*args)
            return done
        finally:
            self.seconds += time.perf_counter() - started


def profile(engine: LLMEngine, steps: int) -> None:
    """Print the table for 1, 8 and 32 sequences (milliseconds per step, share of the step)."""
    native = engine.runner.native is not None
    clock = KernelClock() if native else None
    print(f"weights: {engine.loaded.weights}; {engine.runner.forward_text}")
    print("| sequences | step ms | kernels (C forward) | forward's Python | rest of the step "
          "| outside the kernels |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in (1, 8, 32):
        params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
        for i in range(batch):
            engine.add_request(list(range(1000 + i, 1064 + i)), params, request_id=f"{batch}-{i}")
        step_until_decoding(engine)
        engine.step()
        forward = 0.0
        if clock is not None:
            clock.seconds = 0.0
        started = time.perf_counter()
        for _ in range(steps):
            engine.step()
            forward += engine.runner.last_forward_s
        wall = (time.perf_counter() - started) / steps * 1e3
        forward = forward / steps * 1e3
        kernels = clock.seconds / steps * 1e3 if clock is not None else forward
        parts = (kernels, forward - kernels, wall - forward)
        cells = " | ".join(f"{v:.2f} ({v / wall:.0%})" for v in parts)
        outside = (wall - kernels) / wall if native else float("nan")
        print(f"| {batch} | {wall:.2f} | {cells} | {outside:.0%} |", flush=True)
        while engine.has_unfinished():
            engine.step()


def main(argv: list[str] | None = None) -> None:
    """Load the model and profile its decode steps, each phase on a thread of its own."""
    parser = argument_parser("profile_step", __doc__)
    parser.add_argument("--model", default=None, help="a GGUF file (default: the bundled model)")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args(argv)
    settings: dict[str, Any] = {"model": args.model} if args.model else {}
    config = EngineConfig(
        device="cpu",
        weights=args.weights,
        kv_budget=2**30,
        cache_dir=ROOT / ".cache" / "converted",
        **settings,
    )
    loaded = in_own_thread(load_model, config)
    engine = LLMEngine(loaded, config)
    profile(engine, args.steps)


if __name__ == "__main__":
    sys.exit(main())
