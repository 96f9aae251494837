"""The benchmark's runners: each system runs the workload and returns per-request figures.

A runner takes the loaded model and a workload and returns a :class:`SystemRun`. Add a new
system (another server, another library) as one more ``run_*`` function here.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from paged_llm.engine.async_engine import AsyncEngine
from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig, KVLayout
from paged_llm.engine.core.sequence import SamplingParams
from paged_llm.engine.model.loader import LoadedModel

from . import ROOT
from .workload import HomeRequest

CLASSES = ("interactive", "automation", "background")
# Tokens before a voice answer in Home Assistant: the Assist system prompt with a home's
# exposed entities and the question. One request decodes slower there than after the
# 64-token prompts of the other decode figures (attention reads the whole context).
VOICE_CONTEXT = 1024


# Measurement ------------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident memory of this process."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakMemory:
    """Samples this process's RSS in a thread and keeps the peak."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, None for an empty list."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class RequestResult:
    """One request's figures in one system's run (seconds from its arrival)."""

    request_id: str
    priority: str
    arrival: float
    ttft: float
    e2e: float
    queue: float
    tokens: int

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (None for a one-token answer)."""
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


@dataclass
class SystemRun:
    """Everything one system produced on the workload."""

    name: str
    results: list[RequestResult] = field(default_factory=list)
    makespan: float = 0.0
    peak_rss: int = 0
    preemptions: int = 0
    kv_utilization: float | None = None
    trace: list[dict[str, float]] = field(default_factory=list)
    note: str = ""

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the time from first arrival to last completion."""
        return sum(r.tokens for r in self.results) / self.makespan if self.makespan else 0.0

    def class_tokens_per_s(self, cls: str) -> float:
        """One class's generated tokens over the run's makespan."""
        tokens = sum(r.tokens for r in self.results if r.priority == cls)
        return tokens / self.makespan if self.makespan else 0.0

    @property
    def service_tokens_per_s(self) -> float:
        """Tokens over the summed service times: a one-at-a-time system's rate, queue left out.

        For sequential generate this is what it would reach with every request queued at
        once (the saturated mix), since it serves one request at a time either way.
        """
        busy = sum(r.e2e - r.queue for r in self.results)
        return sum(r.tokens for r in self.results) / busy if busy else 0.0

    def per_class(self) -> dict[str, dict[str, float | None]]:
        """p50/p95 of TTFT, end-to-end latency, time per output token and queue wait."""
        out: dict[str, dict[str, float | None]] = {}
        for cls in CLASSES:
            rows = [r for r in self.results if r.priority == cls]
            out[cls] = {
                f"{m}_{q}": pct([v for r in rows if (v := getattr(r, m)) is not None], p)
                for m in ("ttft", "e2e", "tpot", "queue")
                for q, p in (("p50", 0.5), ("p95", 0.95))
            }
        return out


# Systems --------------------------------------------------------------------------------------


def engine_config(
    args: argparse.Namespace, layout: KVLayout, prefix: bool = True, policy: str | None = None
) -> EngineConfig:
    """The engine settings every engine run shares; layout, caching and policy may differ."""
    return EngineConfig(
        model=DEFAULT_MODEL,
        device="cpu",
        dtype=args.dtype,
        block_size=16,
        kv_budget=args.kv_bytes,
        max_num_seqs=64,
        max_num_batched_tokens=args.token_budget,
        max_model_len=args.max_model_len,
        kv_layout=layout,
        enable_prefix_caching=prefix,
        cache_dir=ROOT / ".cache" / "converted",
        step_policy=policy or args.policy,
        interactive_step_seconds=args.step_seconds,
        interactive_slowdown=args.slowdown,
        interactive_hold_seconds=args.hold_seconds,
    )


async def _drive_engine(engine: AsyncEngine, workload: list[HomeRequest]) -> list[RequestResult]:
    """Submit each request at its arrival offset and stream it to the end."""
    start = time.monotonic()

    async def one(req: HomeRequest) -> RequestResult:
        await asyncio.sleep(max(0.0, start + req.arrival - time.monotonic()))
        arrived = time.monotonic()
        params = SamplingParams(temperature=0, max_tokens=req.max_tokens, ignore_eos=True)
        first = None
        last = None
        async for out in engine.generate(req.prompt_ids, params, req.priority):
            if first is None:
                first = time.monotonic()
            last = out
        if last is None or last.timing is None or first is None:
            raise RuntimeError(f"{req.request_id} ended without output")
        queue = last.timing.queue_time or 0.0
        return RequestResult(
            req.request_id,
            req.priority,
            req.arrival,
            first - arrived,
            time.monotonic() - arrived,
            queue,
            last.completion_tokens,
        )

    return list(await asyncio.gather(*(one(r) for r in workload)))


def run_engine(
    loaded: LoadedModel, config: EngineConfig, workload: list[HomeRequest], name: str
) -> SystemRun:
    """Run this engine (paged or contiguous) on the workload, driven through AsyncEngine."""

    async def main() -> SystemRun:
        engine = AsyncEngine(config, loaded=loaded)
        await engine.start()
        trace = engine.start_trace()
        with PeakMemory() as mem:
            started = time.monotonic()
            results = await _drive_engine(engine, workload)
            makespan = time.monotonic() - started - workload[0].arrival
        run = SystemRun(name, results, makespan, mem.peak)
        run.preemptions = trace[-1].num_preemptions if trace else 0
        busy = [t for t in trace if t.kv_allocated_slots]
        if busy:
            run.kv_utilization = statistics.mean(
                t.kv_live_tokens / t.kv_allocated_slots for t in busy
            )
        run.trace = [
            {
                "t": t.time - trace[0].time,
                "running": t.num_running,
                "waiting": t.num_waiting,
                "blocks": t.kv_blocks_used,
                "duration": t.duration,
                "forward": t.forward,
            }
            for t in trace
        ]
        await engine.stop()
        return run

    return asyncio.run(main())


class _FirstToken:
    """A transformers streamer that notes when the first generated token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # the first put is the prompt
            self.first = time.monotonic()

    def end(self) -> None:
        pass


def run_sequential(loaded: LoadedModel, workload: list[HomeRequest]) -> SystemRun:
    """Plain transformers generate, one request at a time in arrival order."""
    model = loaded.model
    model.set_attn_implementation("sdpa")
    results = []
    with PeakMemory() as mem, torch.inference_mode():
        start = time.monotonic()
        for req in workload:
            time.sleep(max(0.0, start + req.arrival - time.monotonic()))
            began = time.monotonic()
            timer = _FirstToken()
            out = model.generate(
                torch.tensor([req.prompt_ids]),
                max_new_tokens=req.max_tokens,
                min_new_tokens=req.max_tokens,
                do_sample=False,
                streamer=timer,
                pad_token_id=loaded.tokenizer.pad_token_id or 0,
            )
            done = time.monotonic()
            arrived = start + req.arrival
            results.append(
                RequestResult(
                    req.request_id,
                    req.priority,
                    req.arrival,
                    (timer.first or done) - arrived,
                    done - arrived,
                    began - arrived,
                    out.shape[1] - len(req.prompt_ids),
                )
            )
        makespan = time.monotonic() - start - workload[0].arrival
    return SystemRun("transformers generate (sequential)", results, makespan, mem.peak)


def run_hf_continuous(loaded: LoadedModel, workload: list[HomeRequest]) -> SystemRun:
    """Run transformers' own continuous batching manager, fed at the same arrival times."""
    from transformers import GenerationConfig

    model = loaded.model
    model.set_attn_implementation("sdpa")
    config = GenerationConfig(
        max_new_tokens=max(r.max_tokens for r in workload),
        do_sample=False,
        eos_token_id=-1,
    )
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    arrived: dict[str, float] = {}
    results = []
    try:
        with PeakMemory() as mem:
            start = time.monotonic()
            perf_offset = time.perf_counter() - time.monotonic()

            def feed() -> None:
                for req in workload:
                    time.sleep(max(0.0, start + req.arrival - time.monotonic()))
                    arrived[req.request_id] = time.monotonic()
                    manager.add_request(
                        req.prompt_ids,
                        request_id=req.request_id,
                        max_new_tokens=req.max_tokens,
                        record_timestamps=True,
                        eos_token_id=-1,
                    )

            feeder = threading.Thread(target=feed)
            feeder.start()
            by_id = {r.request_id: r for r in workload}
            while len(results) < len(workload):
                out = manager.get_result(timeout=600)
                if out is None or not out.is_finished():
                    continue
                if out.error:
                    raise RuntimeError(out.error)
                req = by_id[out.request_id]
                t0 = arrived[req.request_id]
                first = (out.timestamps[0] - perf_offset) if out.timestamps else time.monotonic()
                results.append(
                    RequestResult(
                        req.request_id,
                        req.priority,
                        req.arrival,
                        first - t0,
                        out.lifespan[1] - perf_offset - t0,
                        out.lifespan[0] - perf_offset - t0,
                        len(out.generated_tokens),
                    )
                )
            feeder.join()
            makespan = time.monotonic() - start - workload[0].arrival
    finally:
        manager.stop(block=True)
        model.destroy_cached_continuous_batching_manager()
    return SystemRun("transformers continuous batching", results, makespan, mem.peak)
