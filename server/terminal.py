"""``paged-llm chat`` and ``paged-llm generate``: the engine in a terminal, no server needed."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paged_llm.engine.api import AsyncEngine, EngineConfig

PROMPTS = (
    "Turn on the kitchen light and tell me when it is done.",
    "What is a good name for a grey cat?",
    "Summarise in one sentence why the sky is blue.",
    "Write a haiku about a quiet house at night.",
    "List three things to check before leaving home for a week.",
    "Explain what a thermostat does, for a child.",
    "Suggest a dinner made from rice, eggs and spinach.",
    "How do I save energy with my washing machine?",
)


def _status(text: str) -> None:
    """A progress line on stderr, rewritten in place on a terminal."""
    if sys.stderr.isatty():
        print(f"\r\033[K{text}", end="", file=sys.stderr, flush=True)
    else:
        print(text, file=sys.stderr, flush=True)


async def _start(config: EngineConfig) -> AsyncEngine:
    """Load the model, showing the seconds it takes."""
    from paged_llm.engine.api import start_engine

    started = time.monotonic()
    task = asyncio.create_task(start_engine(config))
    while not task.done():
        _status(f"loading {config.model} … {time.monotonic() - started:.0f} s")
        await asyncio.wait({task}, timeout=1.0)
    engine = task.result()
    _status(f"loaded {config.model} in {time.monotonic() - started:.1f} s")
    print(file=sys.stderr) if sys.stderr.isatty() else None
    return engine


async def _answer(engine: AsyncEngine, messages: list[dict[str, Any]], args: Any) -> str:
    """Stream one answer to stdout and return it."""
    from paged_llm.engine.api import sampling_params

    params = sampling_params(
        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed
    )
    parts = []
    async for out in engine.generate(messages, params):
        print(out.text, end="", flush=True)
        parts.append(out.text)
    print()
    return "".join(parts)


async def chat(config: EngineConfig, args: argparse.Namespace) -> int:
    """Answer ``args.prompt``, or hold a small chat on stdin until EOF or ``/exit``."""
    engine = await _start(config)
    messages: list[dict[str, Any]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    try:
        if args.prompt:
            await _answer(engine, [*messages, {"role": "user", "content": args.prompt}], args)
            return 0
        interactive = sys.stdin.isatty()
        if interactive:
            print("Chat with the model; /exit or Ctrl-D ends.", file=sys.stderr)
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line or line.strip() == "/exit":
                return 0
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line.strip()})
            messages.append({"role": "assistant", "content": await _answer(engine, messages, args)})
    finally:
        await engine.stop()


def _fmt(value: float | None) -> str:
    """Seconds as milliseconds, or a dash."""
    return "-" if value is None else f"{value * 1000:.0f} ms"


async def generate(config: EngineConfig, args: argparse.Namespace) -> int:
    """Run ``--concurrency`` prompts at once; print each answer's first line and the metrics."""
    from paged_llm.engine.api import sampling_params

    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    engine = await _start(config)
    params = sampling_params(temperature=args.temperature, max_tokens=args.max_tokens)
    answers: list[str] = [""] * args.concurrency
    done = 0
    peak_running = peak_blocks = 0

    async def one(i: int) -> None:
        nonlocal done
        prompt = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
        parts = [out.text async for out in engine.generate(prompt, params, args.priority)]
        answers[i] = "".join(parts)
        done += 1

    started = time.monotonic()
    try:
        tasks = [asyncio.create_task(one(i)) for i in range(args.concurrency)]
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.25)
            snap = engine.metrics()
            peak_running = max(peak_running, snap.num_requests_running)
            peak_blocks = max(peak_blocks, snap.kv_blocks_used)
            _status(
                f"{done}/{args.concurrency} done, {snap.num_requests_running} running, "
                f"{snap.num_requests_waiting} waiting, KV {snap.kv_cache_usage_perc:.0%}"
            )
        for task in tasks:
            task.result()
        elapsed = time.monotonic() - started
        if sys.stderr.isatty():
            print(file=sys.stderr)
        for i, text in enumerate(answers):
            first = text.strip().splitlines()[0] if text.strip() else ""
            print(f"[{i}] {first[:100]}")
        await asyncio.sleep(0.3)  # let the engine publish its idle snapshot
        snap = engine.metrics()
        ttft = snap.time_to_first_token_seconds.get(args.priority)
        print(
            f"\n{args.concurrency} requests in {elapsed:.2f} s: "
            f"{snap.generation_tokens_total} tokens generated "
            f"({snap.generation_tokens_total / elapsed:.1f} tokens/s), "
            f"{snap.prompt_tokens_total} prompt tokens"
        )
        print(
            f"time to first token p50 {_fmt(ttft.p50 if ttft else None)}, "
            f"p95 {_fmt(ttft.p95 if ttft else None)}; "
            f"peak {peak_running} running, peak {peak_blocks}/{snap.kv_blocks_total} KV blocks; "
            f"preemptions {snap.num_preemptions}; "
            f"prefix cache hits {snap.prefix_cache_hits}/{snap.prefix_cache_queries} tokens"
        )
    finally:
        await engine.stop()
    return 0
