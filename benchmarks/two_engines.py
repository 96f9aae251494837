"""Two embedded engines in one process: decode speed, and voice beside the other's summaries.

Home Assistant runs one engine per entry. The first table checks that a second engine does
not slow one request beyond sharing the cores; the second, that voice queries on one
engine stay fast while the other reads long documents. Each case runs in a fresh process
(torch's OpenMP pools are process state).
Usage: ``scripts/bench two_engines [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time

from . import ROOT, argument_parser

CASES = {
    "one": "one engine",
    "idle": "a second engine, idle",
    "busy": "a second engine, decoding too",
}
TOKENS = 64
VOICE_QUERIES = 12
# A case's process runs this module again; from the checkout, where ``benchmarks`` imports.
ITSELF = [sys.executable, "-m", "benchmarks.two_engines"]


async def decode_rate(engine: object, tokens: int) -> float:
    """Tokens per second after the first token of one request."""
    from paged_llm.engine.async_engine import AsyncEngine
    from paged_llm.engine.core.sequence import SamplingParams

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


async def voice_beside_summaries(rounds: int) -> list[float]:
    """Voice TTFT on one engine: idle p50 and p95, then p50 and p95 while the other reads."""
    from paged_llm.engine.async_engine import AsyncEngine
    from paged_llm.engine.config import EngineConfig
    from paged_llm.engine.core.sequence import SamplingParams

    config = EngineConfig(device="cpu", kv_budget=256 * 2**20)
    voice, reader = AsyncEngine(config), AsyncEngine(config)
    await voice.start()
    await reader.start()
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, 20000) for _ in range(n)]

    async def ask(engine: AsyncEngine, ids: list[int], priority: str, tokens: int) -> float:
        """Run a request to its end; its time to first token."""
        start, first = time.perf_counter(), None
        params = SamplingParams(max_tokens=tokens, ignore_eos=True)
        async for _ in engine.generate(ids, params, priority):
            first = first or time.perf_counter() - start
        assert first is not None
        return first

    def p50_p95(times: list[float]) -> list[float]:
        return [statistics.median(times), sorted(times)[round(0.95 * (len(times) - 1))]]

    try:
        idle = [await ask(voice, prompt(30), "interactive", 24) for _ in range(rounds * 3)]
        documents = [
            asyncio.create_task(ask(reader, prompt(1500), "background", 300)) for _ in range(8)
        ]
        await asyncio.sleep(2)
        busy = []
        for _ in range(VOICE_QUERIES):
            busy.append(await ask(voice, prompt(30), "interactive", 24))
            await asyncio.sleep(0.7 + 0.3 * rng.random())
        assert not all(task.done() for task in documents), "the documents ended too soon"
        for task in documents:
            task.cancel()
        await asyncio.gather(*documents, return_exceptions=True)
        return p50_p95(idle) + p50_p95(busy)
    finally:
        await voice.stop()
        await reader.stop()


def main(argv: list[str] | None = None) -> None:
    """Run every case in its own process and print a table."""
    parser = argument_parser("two_engines", __doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case", choices=[*CASES, "voice"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case == "voice":
        print(" ".join(f"{t:.3f}" for t in asyncio.run(voice_beside_summaries(args.rounds))))
        return
    if args.case:
        print(" ".join(f"{r:.1f}" for r in asyncio.run(run_case(args.case, args.rounds))))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    print(f"One request, {TOKENS} tokens, decode tokens/s ({args.rounds} rounds)\n")
    print("| case | tokens/s |\n| --- | ---: |")
    for case, label in CASES.items():
        command = [*ITSELF, "--case", case, "--rounds", str(args.rounds)]
        out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        rates = [float(x) for x in out.stdout.split()]
        print(f"| {label} | {min(rates):.1f}–{max(rates):.1f} |")
    print(
        f"\nVoice time to first token on one engine ({VOICE_QUERIES} queries of 24 tokens) "
        "while the other reads 8 documents of 1,500 tokens\n"
    )
    print("| | p50 s | p95 s | p95 vs idle |\n| --- | ---: | ---: | ---: |")
    command = [*ITSELF, "--case", "voice", "--rounds", str(args.rounds)]
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    idle50, idle95, busy50, busy95 = (float(x) for x in out.stdout.split())
    print(f"| idle | {idle50:.3f} | {idle95:.3f} | 1.00x |")
    print(f"| beside the documents | {busy50:.3f} | {busy95:.3f} | {busy95 / idle95:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
