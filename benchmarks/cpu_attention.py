"""Decode step of the bundled model with the C decode attention against the torch path.

``scripts/bench cpu_attention [--rounds 2] [--steps 20]``: for each
number of sequences and context length, prefills that many prompts, then times decode
steps of ``LLMEngine`` with float32 decodes on the C kernel (kernels/cpu/src/cpu_attention.c) and
on the torch path (blocks gathered, then SDPA), the two alternating round by round in one
process so a busy machine skews them alike; prints the best round of each, in
milliseconds per step. Run it on a quiet machine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import load_model
from paged_llm.kernels.cpu import attention as cpu_attention

from . import ROOT, argument_parser
from .machine import in_own_thread, step_until_decoding

# (sequences, context): one voice answer, long Assist prompts, summaries, a busy home.
CASES = [(1, 64), (1, 512), (1, 1024), (1, 2048), (1, 3000), (4, 512), (4, 2048), (16, 400)]


def decode_ms(engine: LLMEngine, seqs: int, context: int, steps: int) -> float:
    """Milliseconds per decode step of ``seqs`` sequences that have ``context`` tokens."""
    params = SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True)
    for i in range(seqs):
        engine.add_request([100 + (j * 7 + i) % 5000 for j in range(context)], params)
    step_until_decoding(engine)
    engine.step()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = (time.perf_counter() - started) / steps * 1e3
    while engine.has_unfinished():
        engine.step()
    return elapsed


def main(argv: list[str] | None = None) -> None:
    """Print the table: both paths per case, best of the rounds."""
    parser = argument_parser("cpu_attention", __doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    reason = cpu_attention.unavailable()
    if reason is not None:
        raise SystemExit(f"benchmarks.cpu_attention: no C attention kernel here: {reason}")
    config = EngineConfig(
        model=DEFAULT_MODEL,
        device="cpu",
        dtype="float32",
        cache_dir=ROOT / ".cache" / "converted",
        max_model_len=4096,
        kv_budget=400 << 20,
        max_num_batched_tokens=512,
    )
    # The engine loads and steps on a thread that ends: a live loading thread's OpenMP
    # pool would halve the speed of every step (engine/step_thread.py).
    in_own_thread(run, config, args.rounds, args.steps)


def run(config: EngineConfig, rounds: int, steps: int) -> None:
    """Load the model, then time every case on both paths."""
    engine = LLMEngine(load_model(config), config)
    native = cpu_attention.takes
    paths: dict[str, Callable[..., bool]] = {"C kernel": native, "torch": lambda *a: False}
    print(f"{engine.loaded.name}, {engine.loaded.weights}")
    print("| sequences × context | torch path ms | C kernel ms | faster |")
    print("| --- | ---: | ---: | ---: |")
    try:
        for seqs, context in CASES:
            best = {name: float("inf") for name in paths}
            for _ in range(rounds):
                for name, takes in paths.items():
                    cpu_attention.takes = takes  # type: ignore[assignment]
                    best[name] = min(best[name], decode_ms(engine, seqs, context, steps))
            ratio = best["torch"] / best["C kernel"]
            print(
                f"| {seqs} × {context:,} | {best['torch']:.1f} | {best['C kernel']:.1f} | "
                f"{ratio:.2f}x |",
                flush=True,
            )
    finally:
        cpu_attention.takes = native  # type: ignore[assignment]


if __name__ == "__main__":
    sys.exit(main())
