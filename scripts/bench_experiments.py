"""The benchmark's focused experiments: capacity, prefix caching, engine overhead, batch 32."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench_runners import engine_config
from home_workload import HomeRequest

from paged_llm.engine.config import KVLayout, SchedulerConfig
from paged_llm.engine.contiguous_kv_cache_manager import ContiguousKVCacheManager
from paged_llm.engine.kv_cache_manager import KVCacheManager
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.loader import LoadedModel
from paged_llm.engine.model_runner import kv_bytes_per_block
from paged_llm.engine.scheduler import Scheduler
from paged_llm.engine.sequence import Priority, SamplingParams, Sequence


def capacity_experiment(
    loaded: LoadedModel, workload: list[HomeRequest], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Most sequences running at once under one KV budget: paged against contiguous.

    The real scheduler and managers run the home mix (all requests queued at once) with a
    stand-in for the model, so memory is the only limit.
    """
    num_blocks = args.kv_blocks
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
