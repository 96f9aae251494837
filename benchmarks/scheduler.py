"""Measure the scheduler and KV manager cost per step, without a model.

Each step is ``schedule()`` plus ``update()`` with fake sampled tokens: the pure-Python
bookkeeping the engine adds to every forward pass. Prints a markdown table of the mean
and 95th percentile per step. Run: ``scripts/bench scheduler [--steps 300]``.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
from dataclasses import dataclass

from paged_llm.engine.config import SchedulerConfig
from paged_llm.engine.core.kv.block_pool import cdiv
from paged_llm.engine.core.kv.contiguous import ContiguousKVCacheManager
from paged_llm.engine.core.kv.manager import KVManager
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.scheduler import Scheduler
from paged_llm.engine.core.sequence import Priority, SamplingParams, Sequence

from . import argument_parser

BLOCK = 16
PROMPT = 128
SYSTEM = 64  # leading prompt tokens shared by every request, like Assist's system prompt
MAX_TOKENS = 3000
LONG_PROMPT = 3000


@dataclass(slots=True)
class Case:
    """One measured situation: how many sequences decode, and what else runs beside them."""

    name: str
    decoders: int
    long_prefill: bool
    contiguous: bool = False


@dataclass(slots=True)
class Result:
    """One case's timed steps (milliseconds), mean tokens per step and preemptions."""

    case: Case
    times_ms: list[float]
    tokens_per_step: float
    preemptions: int


def build(case: Case, steps: int) -> Scheduler:
    """A scheduler with room for every sequence over the whole run."""
    per_seq = cdiv(PROMPT + steps + 64, BLOCK)
    num_blocks = case.decoders * per_seq + (2 * LONG_PROMPT // BLOCK) + 64
    max_len = PROMPT + MAX_TOKENS + LONG_PROMPT
    kv: KVManager
    if case.contiguous:
        num_blocks = (case.decoders + 2) * cdiv(PROMPT + MAX_TOKENS, BLOCK) + LONG_PROMPT
        kv = ContiguousKVCacheManager(num_blocks, BLOCK, max_len)
    else:
        kv = KVCacheManager(num_blocks, BLOCK)
    config = SchedulerConfig(
        max_num_seqs=case.decoders + 2,
        max_num_batched_tokens=max(512, case.decoders + 64),
        max_model_len=max_len,
        max_waiting=1024,
    )
    return Scheduler(config, kv)


def add_long(sched: Scheduler, rng: random.Random, n: int) -> None:
    """Queue a long background document that will be prefilled in chunks."""
    prompt = [rng.randrange(100, 30000) for _ in range(LONG_PROMPT)]
    params = SamplingParams(max_tokens=8)
    sched.add(Sequence(f"doc{n}", prompt, params, Priority.BACKGROUND, time.monotonic()))


def run(case: Case, steps: int, seed: int) -> Result:
    """Reach steady decoding, then time ``steps`` steps."""
    rng = random.Random(seed)
    sched = build(case, steps)
    system = [rng.randrange(100, 30000) for _ in range(SYSTEM)]
    for n in range(case.decoders):
        prompt = system + [rng.randrange(100, 30000) for _ in range(PROMPT - SYSTEM)]
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        sched.add(Sequence(f"r{n}", prompt, params, Priority.INTERACTIVE, time.monotonic()))

    def sample() -> int:
        return rng.randrange(100, 30000)

    while sched.num_waiting:  # prefill everyone first: the timed steps are steady state
        out = sched.schedule()
        sched.update(out, {c.seq.request_id: sample() for c in out.chunks if c.samples})
    docs = 0
    if case.long_prefill:
        add_long(sched, rng, docs)
    times: list[float] = []
    tokens = 0
    gc.collect()
    for _ in range(steps):
        # Draw the fake tokens outside the timed region: only scheduler work is measured.
        pending = [sample() for _ in range(case.decoders + 1)]
        t0 = time.perf_counter_ns()
        out = sched.schedule()
        sampled = {
            c.seq.request_id: pending[i % len(pending)]
            for i, c in enumerate(out.chunks)
            if c.samples
        }
        finished = sched.update(out, sampled)
        times.append((time.perf_counter_ns() - t0) / 1e6)
        tokens += out.num_batched_tokens
        if case.long_prefill and any(s.request_id.startswith("doc") for s in finished):
            docs += 1
            add_long(sched, rng, docs)
    return Result(case, times, tokens / steps, sched.num_preemptions)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> None:
    """Run every case and print the table."""
    parser = argument_parser("scheduler", __doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed steps per case")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cases = [
        Case("decode", 32, False),
        Case("decode", 128, False),
        Case("decode", 512, False),
        Case("decode + 3000-token chunked prefill", 128, True),
        Case("decode + 3000-token chunked prefill", 512, True),
        Case("decode, contiguous allocator", 512, False, contiguous=True),
    ]
    print(f"block size {BLOCK}, prompt {PROMPT} ({SYSTEM} shared), {args.steps} timed steps\n")
    print("| case | running | tokens/step | mean ms/step | p95 ms/step | µs/seq (mean) |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in cases:
        result = run(case, args.steps, args.seed)
        mean = statistics.fmean(result.times_ms)
        p95 = percentile(result.times_ms, 0.95)
        per_seq = mean * 1000 / case.decoders
        print(
            f"| {case.name} | {case.decoders} | {result.tokens_per_step:.0f} | "
            f"{mean:.3f} | {p95:.3f} | {per_seq:.2f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
