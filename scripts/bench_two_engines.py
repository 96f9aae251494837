"""One request's decode speed with a second embedded engine in the process, idle or busy.

Home Assistant runs one engine per entry; this checks that a second one does not slow the
first beyond sharing the cores. Each case runs in a fresh process (torch's OpenMP pools
are process state). Usage: ``.venv/bin/python scripts/bench_two_engines.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

CASES = {
    "one": "one engine",
    "idle": "a second engine, idle",
    "busy": "a second engine, decoding too",
}
TOKENS = 64


async def decode_rate(engine: object, tokens: int) -> float:
    """Tokens per second after the first token of one request."""
    from paged_llm.engine.async_engine import AsyncEngine
    from paged_llm.engine.sequence import SamplingParams

    assert isinstance(engine, AsyncEngine)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    first = None
    async for _ in engine.generate(list(range(1, 9)), params):
        first = first or time.perf_counter()
    assert first is not None
    return (tokens - 1) / (time.perf_counter() - first)


async def run_case(case: str, rounds: int) -> list[float]:
    """Start the engines of one case and time ``rounds`` requests on the first."""
    from paged_llm.engine.async_engine import AsyncEngine
    from paged_llm.engine.config import EngineConfig

    config = EngineConfig(device="cpu", kv_budget=128 * 2**20)
    engines = [AsyncEngine(config) for _ in range(1 if case == "one" else 2)]
    for engine in engines:
        await engine.start()
    try:
        await decode_rate(engines[0], 8)  # warm up
        other = asyncio.create_task(decode_rate(engines[1], 1500)) if case == "busy" else None
        rates = [await decode_rate(engines[0], TOKENS) for _ in range(rounds)]
        if other is not None:
            assert not other.done(), "the second engine's request ended early"
            other.cancel()
        return rates
    finally:
        for engine in engines:
            await engine.stop()


def main() -> None:
    """Run every case in its own process and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(" ".join(f"{r:.1f}" for r in asyncio.run(run_case(args.case, args.rounds))))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    print(f"One request, {TOKENS} tokens, decode tokens/s ({args.rounds} rounds)\n")
    print("| case | tokens/s |\n| --- | ---: |")
    for case, label in CASES.items():
        command = [sys.executable, __file__, "--case", case, "--rounds", str(args.rounds)]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        rates = [float(x) for x in out.stdout.split()]
        print(f"| {label} | {min(rates):.1f}–{max(rates):.1f} |")


if __name__ == "__main__":
    main()
