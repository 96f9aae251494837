"""The home-workload benchmark: this engine against transformers and contiguous reservation.

Run through ``scripts/bench [--quick|--full]``. Writes results.json, report.md and PNG plots
to bench_results/<mode>/ and prints the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from home_workload import MODES, HomeRequest, build_workload  # noqa: E402

from paged_llm.engine.async_engine import AsyncEngine  # noqa: E402
from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig, KVLayout, SchedulerConfig  # noqa: E402
from paged_llm.engine.contiguous_kv_cache_manager import ContiguousKVCacheManager  # noqa: E402
from paged_llm.engine.kv_cache_manager import KVCacheManager  # noqa: E402
from paged_llm.engine.llm_engine import LLMEngine  # noqa: E402
from paged_llm.engine.loader import LoadedModel, load_model  # noqa: E402
from paged_llm.engine.model_runner import kv_bytes_per_block  # noqa: E402
from paged_llm.engine.scheduler import Scheduler  # noqa: E402
from paged_llm.engine.sequence import Priority, SamplingParams, Sequence  # noqa: E402

CLASSES = ("interactive", "automation", "background")


# Measurement helpers ------------------------------------------------------------------------


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine since boot."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _own_jiffies() -> int:
    """CPU jiffies this process (all its threads) has used."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def quiet_check(seconds: float = 2.0) -> dict[str, Any]:
    """Measure how much CPU other processes use; the machine is quiet when it is near none."""
    busy0, total0 = _busy_jiffies()
    own0 = _own_jiffies()
    time.sleep(seconds)
    busy1, total1 = _busy_jiffies()
    own1 = _own_jiffies()
    others = max(0, (busy1 - busy0) - (own1 - own0)) / max(1, total1 - total0)
    return {
        "other_cpu_share": round(others, 3),
        "loadavg_1min": round(os.getloadavg()[0], 2),
        "cores": os.cpu_count(),
        "quiet": others < 0.05,
    }


def cpu_name() -> str:
    """The processor's model name from /proc/cpuinfo."""
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


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

    def per_class(self) -> dict[str, dict[str, float | None]]:
        """p50/p95 of TTFT, end-to-end latency and queue wait per class."""
        out: dict[str, dict[str, float | None]] = {}
        for cls in CLASSES:
            rows = [r for r in self.results if r.priority == cls]
            out[cls] = {
                f"{m}_{q}": pct([getattr(r, m) for r in rows], p)
                for m in ("ttft", "e2e", "queue")
                for q, p in (("p50", 0.5), ("p95", 0.95))
            }
        return out


# Systems --------------------------------------------------------------------------------------


def engine_config(args: argparse.Namespace, layout: KVLayout, prefix: bool = True) -> EngineConfig:
    """The engine settings every engine run shares; only the layout differs."""
    return EngineConfig(
        model=DEFAULT_MODEL,
        device="cpu",
        dtype=args.dtype,
        block_size=16,
        kv_budget=args.kv_mib * 2**20,
        max_num_seqs=64,
        max_num_batched_tokens=args.token_budget,
        max_model_len=args.max_model_len,
        kv_layout=layout,
        enable_prefix_caching=prefix,
        cache_dir=ROOT / ".cache" / "converted",
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
    """This engine (paged or contiguous) on the workload, driven through AsyncEngine."""

    async def main() -> SystemRun:
        engine = AsyncEngine(config, loaded=loaded)
        await engine.start()
        engine.engine.trace = []
        with PeakMemory() as mem:
            started = time.monotonic()
            results = await _drive_engine(engine, workload)
            makespan = time.monotonic() - started - workload[0].arrival
        trace = engine.engine.trace
        run = SystemRun(name, results, makespan, mem.peak)
        run.preemptions = engine.engine.scheduler.num_preemptions
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
    """transformers' own continuous batching manager, fed at the same arrival times."""
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


# Focused experiments ----------------------------------------------------------------------------


def capacity_experiment(
    loaded: LoadedModel, workload: list[HomeRequest], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Most sequences running at once under one KV budget: paged against contiguous.

    The real scheduler and managers run the home mix (all requests queued at once) with a
    stand-in for the model, so memory is the only limit.
    """
    per_block = kv_bytes_per_block(loaded.model.config, 16, loaded.dtype)
    num_blocks = args.kv_mib * 2**20 // per_block
    rows = []
    managers = {
        "paged (prefix sharing)": lambda: KVCacheManager(num_blocks, 16),
        "paged (no sharing)": lambda: KVCacheManager(num_blocks, 16, enable_prefix_caching=False),
        "contiguous, prompt + max_tokens": lambda: ContiguousKVCacheManager(
            num_blocks, 16, args.max_model_len
        ),
        "contiguous, max_model_len": lambda: ContiguousKVCacheManager(
            num_blocks, 16, args.max_model_len, reserve="max_model_len"
        ),
    }
    for name, make in managers.items():
        kv = make()
        sched = Scheduler(
            SchedulerConfig(
                max_num_seqs=1024,
                max_num_batched_tokens=1 << 20,
                max_model_len=args.max_model_len,
                max_waiting=4096,
            ),
            kv,
        )
        for req in workload:
            sched.add(
                Sequence(
                    req.request_id,
                    req.prompt_ids,
                    SamplingParams(max_tokens=req.max_tokens, ignore_eos=True),
                    Priority.parse(req.priority),
                    0.0,
                )
            )
        peak, running, util = 0, [], []
        while sched.has_unfinished():
            out = sched.schedule()
            sampled = {c.seq.request_id: 7 for c in out.chunks if c.samples}
            sched.update(out, sampled)
            peak = max(peak, sched.num_running)
            running.append(sched.num_running)
            if kv.num_allocated_slots:
                util.append(kv.num_live_tokens / kv.num_allocated_slots)
        rows.append(
            {
                "manager": name,
                "blocks": num_blocks,
                "peak_running": peak,
                "mean_running": statistics.mean(running),
                "kv_utilization": statistics.mean(util),
                "preemptions": sched.num_preemptions,
            }
        )
    return rows


def prefix_experiment(
    loaded: LoadedModel, workload: list[HomeRequest], args: argparse.Namespace
) -> dict[str, Any]:
    """Time to first token of voice queries with the system prompt cached and uncached."""
    voice = [r for r in workload if r.priority == "interactive"][:4]
    out: dict[str, Any] = {}
    for label, prefix in (("cached", True), ("uncached", False)):
        engine = LLMEngine(loaded, engine_config(args, KVLayout.PAGED, prefix))
        times = []
        for i, req in enumerate(voice):
            engine.add_request(
                req.prompt_ids, SamplingParams(temperature=0, max_tokens=1), request_id=f"v{i}"
            )
            began = time.perf_counter()
            while engine.has_unfinished():
                engine.step()
            if i:  # the first query fills the cache
                times.append(time.perf_counter() - began)
        engine.close()
        out[label] = statistics.median(times)
    out["prompt_tokens"] = statistics.median(len(r.prompt_ids) for r in voice)
    out["ratio"] = out["uncached"] / out["cached"]
    return out


def overhead_experiment(
    loaded: LoadedModel, args: argparse.Namespace, sizes: list[int]
) -> list[dict[str, Any]]:
    """Share of decode step time spent outside the model forward, by batch size."""
    rows = []
    for n in sizes:
        config = engine_config(args, KVLayout.PAGED)
        config.max_num_seqs = max(n, config.max_num_seqs)
        # Long enough that the first sequences still decode when the last prefill ends,
        # so there are steps where all n decode together; and room for all of them.
        prompt, new_tokens = 64, 24 + (n * 64) // config.max_num_batched_tokens + 8
        per_block = kv_bytes_per_block(loaded.model.config, config.block_size, loaded.dtype)
        blocks = -(-(prompt + new_tokens) // config.block_size)
        config.kv_budget = max(config.kv_budget, (blocks * n + 8) * per_block)
        engine = LLMEngine(loaded, config)
        for i in range(n):
            engine.add_request(
                list(range(1000 + i, 1000 + prompt + i)),
                SamplingParams(temperature=0.7, max_tokens=new_tokens, ignore_eos=True),
                request_id=f"o{i}",
            )
        while engine.scheduler.num_waiting or any(
            s.num_output_tokens == 0 for s in engine.scheduler.running
        ):
            engine.step()
        engine.trace = []
        while engine.has_unfinished():
            engine.step()
        steps = [t for t in engine.trace if t.num_chunks == n]
        total = sum(t.duration for t in steps)
        forward = sum(t.forward for t in steps)
        rows.append(
            {
                "sequences": n,
                "steps": len(steps),
                "step_ms": 1000 * total / max(1, len(steps)),
                "forward_ms": 1000 * forward / max(1, len(steps)),
                "outside_share": 1 - forward / total if total else None,
                "tokens_per_s": n * len(steps) / total if total else None,
            }
        )
        engine.close()
    return rows


def batch32_experiment(
    loaded: LoadedModel, workload: list[HomeRequest], args: argparse.Namespace
) -> dict[str, Any]:
    """32 chat requests at once: this engine against transformers' generate_batch."""
    from transformers import GenerationConfig

    chats = [r for r in workload if r.priority != "background"]
    prompts = [chats[i % len(chats)].prompt_ids for i in range(32)]
    new_tokens = 64
    engine = LLMEngine(loaded, engine_config(args, KVLayout.PAGED))
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    began = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=f"b{i}")
    produced = 0
    while engine.has_unfinished():
        produced += len(engine.step())
    ours = time.perf_counter() - began
    engine.close()

    model = loaded.model
    model.set_attn_implementation("sdpa")
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    began = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=config, progress_bar=False)
    theirs = time.perf_counter() - began
    theirs_tokens = sum(len(o.generated_tokens) for o in outputs.values())
    return {
        "requests": 32,
        "new_tokens": new_tokens,
        "engine_tokens_per_s": produced / ours,
        "generate_batch_tokens_per_s": theirs_tokens / theirs,
        "ratio": (produced / ours) / (theirs_tokens / theirs),
    }


def machine_limits(loaded: LoadedModel) -> dict[str, float]:
    """Measured matmul rate and memory bandwidth, and the decode rates they allow."""
    dtype = loaded.dtype
    a = torch.randn(2048, 2048, dtype=dtype)
    b = torch.randn(2048, 2048, dtype=dtype)
    torch.mm(a, b)
    reps, began = 10, time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    flops = 2 * 2048**3 * reps / (time.perf_counter() - began)
    src = torch.empty(256 * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    began = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    bandwidth = 2 * src.numel() * 5 / (time.perf_counter() - began)
    params = sum(p.numel() for p in loaded.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    return {
        "matmul_gflops": flops / 1e9,
        "copy_gbps": bandwidth / 1e9,
        "params": params,
        "weight_bytes": weight_bytes,
        "batch1_tokens_per_s_limit": bandwidth / weight_bytes,
        "compute_tokens_per_s_limit": flops / (2 * params),
    }


# Report -----------------------------------------------------------------------------------------


def fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    """A number for a table cell; '–' when missing."""
    return "–" if value is None else f"{value * scale:.{digits}f}"


def span(m: dict[str, float | None], metric: str) -> str:
    """'p50 / p95' of one metric for a table cell."""
    return f"{fmt(m[f'{metric}_p50'])} / {fmt(m[f'{metric}_p95'])}"


def write_plots(runs: list[SystemRun], out: Path) -> list[str]:
    """PNG plots: running sequences and KV blocks over time, TTFT by class, throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    engine_runs = [r for r in runs if r.trace]
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for run in engine_runs:
        ts = [p["t"] for p in run.trace]
        axes[0].plot(ts, [p["running"] for p in run.trace], label=run.name)
        axes[1].plot(ts, [p["blocks"] for p in run.trace], label=run.name)
    axes[0].set_ylabel("running sequences")
    axes[1].set_ylabel("KV blocks in use")
    axes[1].set_xlabel("seconds")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "running_and_blocks.png", dpi=110)
    plt.close(fig)
    names.append("running_and_blocks.png")

    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, cls in zip(axes, CLASSES, strict=True):
        data = [[r.ttft for r in run.results if r.priority == cls] or [0.0] for run in runs]
        ax.boxplot(data)
        ax.set_xticks(
            range(1, len(runs) + 1),
            [run.name.split(" (")[0][:18] for run in runs],
            rotation=30,
            ha="right",
            fontsize=7,
        )
        ax.set_title(f"{cls}: time to first token (s)")
        ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(out / "ttft_by_class.png", dpi=110)
    plt.close(fig)
    names.append("ttft_by_class.png")

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh([r.name for r in runs], [r.tokens_per_s for r in runs])
    ax.set_xlabel("generated tokens / s (home mix)")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    names.append("throughput.png")
    return names


def report(data: dict[str, Any], runs: list[SystemRun]) -> str:
    """The markdown report of one benchmark run."""
    lines = [f"# Home workload benchmark ({data['mode']})", ""]
    q = data["quiet"]
    lines += [
        f"Machine: {data['machine']}; torch {data['torch']}; "
        f"model {data['model']} ({data['dtype']}); "
        f"KV budget {data['kv_mib']} MiB; quiet check: {'quiet' if q['quiet'] else 'BUSY'} "
        f"(other processes used {100 * q['other_cpu_share']:.0f}% of the CPU before the run, "
        f"{100 * data['quiet_after']['other_cpu_share']:.0f}% after).",
        f"Workload: {data['workload']}.",
        "",
        "| system | tokens/s | vs sequential | preemptions | KV utilization | peak RSS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    seq = next((r for r in runs if "sequential" in r.name), None)
    for r in runs:
        ratio = r.tokens_per_s / seq.tokens_per_s if seq and seq.tokens_per_s else None
        lines.append(
            f"| {r.name} | {r.tokens_per_s:.1f} | {fmt(ratio)}x | {r.preemptions} | "
            f"{fmt(r.kv_utilization, 100, 1)}{'%' if r.kv_utilization is not None else ''} | "
            f"{r.peak_rss / 2**20:.0f} |"
        )
    lines += [
        "",
        "Latency per class, seconds (p50 / p95):",
        "",
        "| system | class | time to first token | end-to-end | queue wait |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        for cls, m in r.per_class().items():
            lines.append(
                f"| {r.name} | {cls} | {span(m, 'ttft')} | {span(m, 'e2e')} | {span(m, 'queue')} |"
            )
    lines += [
        "",
        "## Concurrent sequences under one KV budget (home mix, all queued at once)",
        "",
        "| manager | blocks | peak running | mean running | KV utilization | preemptions |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in data["capacity"]:
        lines.append(
            f"| {row['manager']} | {row['blocks']} | {row['peak_running']} | "
            f"{row['mean_running']:.1f} | "
            f"{100 * row['kv_utilization']:.1f}% | {row['preemptions']} |"
        )
    p = data["prefix"]
    lines += [
        "",
        "## Voice time to first token, system prompt cached against uncached",
        "",
        f"Prompt {p['prompt_tokens']} tokens: cached {1000 * p['cached']:.0f} ms, "
        f"uncached {1000 * p['uncached']:.0f} ms, ratio {p['ratio']:.1f}x.",
    ]
    lines += [
        "",
        "## Engine cost outside the model forward (decode steps)",
        "",
        "| sequences | step ms | forward ms | outside forward | tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in data["overhead"]:
        lines.append(
            f"| {row['sequences']} | {row['step_ms']:.1f} | {row['forward_ms']:.1f} | "
            f"{fmt(row['outside_share'], 100, 1)}% | {fmt(row['tokens_per_s'], 1, 1)} |"
        )
    if "batch32" in data:
        b = data["batch32"]
        lines += [
            "",
            "## 32 chat requests at once: this engine against generate_batch",
            "",
            f"{b['requests']} requests x {b['new_tokens']} new tokens: this engine "
            f"{b['engine_tokens_per_s']:.1f} tokens/s, transformers generate_batch "
            f"{b['generate_batch_tokens_per_s']:.1f} tokens/s, ratio {b['ratio']:.2f}x.",
        ]
    m = data["limits"]
    lines += [
        "",
        "## The machine's limit",
        "",
        f"Matrix multiply {m['matmul_gflops']:.0f} GFLOP/s ({data['dtype']}, 2048³); "
        "copy bandwidth "
        f"{m['copy_gbps']:.1f} GB/s. For {m['params'] / 1e6:.0f}M parameters "
        f"({m['weight_bytes'] / 2**20:.0f} MiB of weights): batch-1 decode limit "
        f"{m['batch1_tokens_per_s_limit']:.0f} tokens/s (weights read once per token), "
        f"compute limit {m['compute_tokens_per_s_limit']:.0f} tokens/s "
        "(2 FLOPs per parameter per token).",
        "",
    ]
    for row in data["overhead"]:
        # One step reads the weights once for all its sequences; compute grows with them.
        memory_limit = m["batch1_tokens_per_s_limit"] * row["sequences"]
        limit = min(memory_limit, m["compute_tokens_per_s_limit"])
        bound = "memory" if memory_limit < m["compute_tokens_per_s_limit"] else "compute"
        if row["tokens_per_s"] is None:
            continue
        lines.append(
            f"- {row['sequences']} sequences: {row['tokens_per_s']:.0f} tokens/s = "
            f"{100 * row['tokens_per_s'] / limit:.0f}% of the {bound} limit "
            f"({limit:.0f} tokens/s)"
        )
    if "bursty" in data:
        b = data["bursty"]
        lines += [
            "",
            "## Bursty variant (voice arrives in bursts), this engine",
            "",
            "| system | class | TTFT p50 / p95 | queue p50 / p95 |",
            "| --- | --- | --- | --- |",
        ]
        for name, per in b.items():
            for cls, mm in per.items():
                lines.append(f"| {name} | {cls} | {span(mm, 'ttft')} | {span(mm, 'queue')} |")
    return "\n".join(lines) + "\n"


def runs_from_json(data: dict[str, Any]) -> list[SystemRun]:
    """Rebuild the systems' runs from a results.json, for --report-only."""
    runs = []
    for sysdata in data["systems"]:
        run = SystemRun(
            sysdata["name"],
            [RequestResult(**r) for r in sysdata["requests"]],
            sysdata["makespan"],
            sysdata["peak_rss"],
            sysdata["preemptions"],
            sysdata["kv_utilization"],
        )
        runs.append(run)
    return runs


def main() -> None:
    """Parse arguments, run every system and experiment, write the results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="the long run (default: --quick)")
    parser.add_argument("--quick", action="store_true", help="under 5 minutes on 2 cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-mib", type=int, default=96)
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=3584)
    parser.add_argument(
        "--skip", default="", help="comma-separated: sequential,hf-cb,contiguous,batch32"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite report.md from results.json"
    )
    args = parser.parse_args()
    mode = "full" if args.full else "quick"
    out = args.out or ROOT / "bench_results" / mode
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    if args.report_only:
        saved = json.loads((out / "results.json").read_text())
        text = report(saved, runs_from_json(saved))
        (out / "report.md").write_text(text)
        print(text)
        return

    quiet = quiet_check()
    print(
        "bench: machine "
        + ("quiet" if quiet["quiet"] else "BUSY: other processes want the CPU; figures skewed")
        + f" {quiet}",
        flush=True,
    )
    loaded = load_model(engine_config(args, KVLayout.PAGED))
    args.dtype = str(loaded.dtype).removeprefix("torch.")
    workload = build_workload(loaded.tokenizer, mode, args.seed)
    counts = {c: sum(r.priority == c for r in workload) for c in CLASSES}
    lengths = [len(r.prompt_ids) for r in workload]
    described = (
        f"{mode}, seed {args.seed}, {MODES[mode]['duration']:.0f} s of Poisson arrivals: "
        + ", ".join(f"{n} {c}" for c, n in counts.items())
        + f"; prompts {min(lengths)}–{max(lengths)} tokens"
    )
    print(f"bench: {described}", flush=True)
    runs: list[SystemRun] = []

    def timed(label: str, fn: Any, *a: Any) -> Any:
        began = time.monotonic()
        print(f"bench: {label} ...", flush=True)
        result = fn(*a)
        print(f"bench: {label} done in {time.monotonic() - began:.0f} s", flush=True)
        return result

    runs.append(
        timed(
            "paged engine",
            run_engine,
            loaded,
            engine_config(args, KVLayout.PAGED),
            workload,
            "paged engine (this project)",
        )
    )
    if "contiguous" not in skip:
        runs.append(
            timed(
                "contiguous engine",
                run_engine,
                loaded,
                engine_config(args, KVLayout.CONTIGUOUS),
                workload,
                "same engine, contiguous reservation",
            )
        )
    if "hf-cb" not in skip:
        try:
            runs.append(
                timed("transformers continuous batching", run_hf_continuous, loaded, workload)
            )
        except Exception as err:  # a baseline that cannot run here is reported, not fatal
            print(f"bench: transformers continuous batching failed: {err!r}", flush=True)
    if "sequential" not in skip:
        runs.append(timed("sequential generate", run_sequential, loaded, workload))

    data: dict[str, Any] = {
        "mode": mode,
        "quiet": quiet,
        "torch": torch.__version__,
        "model": DEFAULT_MODEL,
        "dtype": args.dtype,
        "kv_mib": args.kv_mib,
        "workload": described,
        "machine": f"{cpu_name()}, {os.cpu_count()} cores ({platform.machine()})",
    }
    # The capacity experiment needs more requests than fit at once: the full mix's 90-odd.
    crowd = workload if mode == "full" else build_workload(loaded.tokenizer, "full", args.seed)
    data["capacity"] = timed("capacity experiment", capacity_experiment, loaded, crowd, args)
    data["prefix"] = timed("prefix experiment", prefix_experiment, loaded, workload, args)
    data["overhead"] = timed(
        "overhead experiment",
        overhead_experiment,
        loaded,
        args,
        [1, 8, 32] if mode == "quick" else [1, 8, 32, 128],
    )
    data["limits"] = machine_limits(loaded)
    # generate_batch alone takes minutes on 2 cores: the quick run leaves it out.
    if "batch32" not in skip and mode == "full":
        data["batch32"] = timed(
            "32 requests vs generate_batch", batch32_experiment, loaded, workload, args
        )
    if mode == "full":
        bursty = build_workload(loaded.tokenizer, mode, args.seed, bursty=True)
        brun = timed(
            "bursty paged engine",
            run_engine,
            loaded,
            engine_config(args, KVLayout.PAGED),
            bursty,
            "paged engine, bursty",
        )
        data["bursty"] = {brun.name: brun.per_class()}
    data["systems"] = [
        {
            "name": r.name,
            "tokens_per_s": r.tokens_per_s,
            "makespan": r.makespan,
            "peak_rss": r.peak_rss,
            "preemptions": r.preemptions,
            "kv_utilization": r.kv_utilization,
            "per_class": r.per_class(),
            "requests": [asdict(x) for x in r.results],
        }
        for r in runs
    ]
    # Other work that started mid-run skews figures as much as work before it.
    data["quiet_after"] = quiet_check()
    data["plots"] = write_plots(runs, out)
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str))
    text = report(data, runs)
    (out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
