"""The benchmark's focused experiments: capacity, prefix caching, engine overhead, batch 32."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from paged_llm.engine.async_engine import AsyncEngine
from paged_llm.engine.config import KVLayout, SchedulerConfig
from paged_llm.engine.core.kv.block_pool import cdiv
from paged_llm.engine.core.kv.contiguous import ContiguousKVCacheManager
from paged_llm.engine.core.kv.paged import KVCacheManager
from paged_llm.engine.core.scheduler import Scheduler
from paged_llm.engine.core.sequence import SamplingParams, Sequence
from paged_llm.engine.llm_engine import LLMEngine
from paged_llm.engine.model.loader import LoadedModel
from paged_llm.engine.model.runner import config_kv_dtype, kv_bytes_per_block
from paged_llm.protocol.priority import parse_priority

from .machine import step_until_decoding
from .runners import engine_config, pct
from .workload import WORDS, HomeRequest

# Seconds between voice queries while the summary runs (a conversation's pace).
VOICE_GAP = 1.0
# Second run: each voice query comes this long after the latency policy's hold lapsed, and
# every other one is announced this long before it arrives, as an Assist satellite does
# when it hears its wake word (the lead is the time the user speaks a short command).
QUIET_MARGIN = 0.5
SATELLITE_LEAD = 1.5
# A voice query's time to first token, queue wait, preemptions, whole answer and time
# per output token after the first.
_Asked = tuple[float, float, int, float, float | None]


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
                    parse_priority(req.priority),
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


async def _ask(engine: AsyncEngine, req: HomeRequest, max_tokens: int | None = None) -> _Asked:
    """Stream one voice query to its end (``max_tokens``: its own unless given)."""
    began = time.monotonic()
    first = None
    last = None
    params = SamplingParams(temperature=0, max_tokens=max_tokens or req.max_tokens, ignore_eos=True)
    async for out in engine.generate(req.prompt_ids, params, req.priority):
        first = first or time.monotonic()
        last = out
    ended = time.monotonic()
    if first is None or last is None or last.timing is None:
        raise RuntimeError(f"{req.request_id} ended without output")
    tokens = last.completion_tokens
    tpot = (ended - first) / (tokens - 1) if tokens > 1 else None
    timing = last.timing
    return first - began, timing.queue_time or 0.0, timing.num_preemptions, ended - began, tpot


def idle_voice_experiment(
    loaded: LoadedModel, workload: list[HomeRequest], args: argparse.Namespace
) -> dict[str, Any]:
    """Time to first token of the mix's voice queries, each alone on a warm engine.

    The reference the mix's interactive p95 is held against: the same queries through the
    same AsyncEngine path and the same streaming as in the mix, the system prompt cached
    (a first query, not counted, fills the cache and warms the cost model).
    """
    voice = [r for r in workload if r.priority == "interactive"]

    async def main() -> list[float]:
        engine = AsyncEngine(engine_config(args, KVLayout.PAGED), loaded=loaded)
        await engine.start()
        await _ask(engine, voice[0], max_tokens=1)
        times = [(await _ask(engine, req, max_tokens=1))[0] for req in voice]
        await engine.stop()
        return times

    times = asyncio.run(main())
    return {"queries": len(times), "ttft_p50": pct(times, 0.5), "ttft_p95": pct(times, 0.95)}


def overhead_experiment(
    loaded: LoadedModel, args: argparse.Namespace, sizes: list[int], prompt: int = 64
) -> list[dict[str, Any]]:
    """Share of decode step time spent outside the model forward, by batch size.

    Each size runs ``args.decode_rounds`` times and keeps its fastest round: one round is
    about 30 steps, and on a shared 2-core machine single rounds varied by 40%.
    """
    rows = []
    for n in (n for n in sizes for _ in range(args.decode_rounds)):
        config = engine_config(args, KVLayout.PAGED)
        config.max_num_seqs = max(n, config.max_num_seqs)
        # Long enough that the first sequences still decode when the last prefill ends,
        # so there are steps where all n decode together; and room for all of them.
        new_tokens = 24 + (n * prompt) // config.max_num_batched_tokens + 8
        kv_dtype = config_kv_dtype(config, loaded)
        per_block = kv_bytes_per_block(loaded.model.config, config.block_size, kv_dtype)
        blocks = cdiv(prompt + new_tokens, config.block_size)
        config.kv_budget = max(config.kv_budget, (blocks * n + 8) * per_block)
        engine = LLMEngine(loaded, config)
        for i in range(n):
            engine.add_request(
                list(range(1000 + i, 1000 + prompt + i)),
                SamplingParams(temperature=0.7, max_tokens=new_tokens, ignore_eos=True),
                request_id=f"o{i}",
            )
        step_until_decoding(engine)
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
    fastest: dict[int, dict[str, Any]] = {}
    for row in rows:
        best = fastest.get(row["sequences"])
        if best is None or (row["tokens_per_s"] or 0) > (best["tokens_per_s"] or 0):
            fastest[row["sequences"]] = row
    return list(fastest.values())


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


class _ExecutorHost:
    """What the integration's Summarizer needs of Home Assistant: an executor, an event bus."""

    def __init__(self) -> None:
        """The bus keeps the progress events the summary fires."""
        self.events: list[dict[str, Any]] = []
        self.bus = SimpleNamespace(async_fire=lambda _kind, data, **_: self.events.append(data))

    async def async_add_executor_job(self, fn: Any, *args: Any) -> Any:
        """Run a blocking call off the event loop, as Home Assistant does."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def summary_experiment(
    loaded: LoadedModel, workload: list[HomeRequest], args: argparse.Namespace, words: int
) -> dict[str, Any]:
    """The integration's real summarizer on a document larger than the pool, voice arriving.

    Voice queries (the workload's, system prompt cached) first run alone, then one every
    ``VOICE_GAP`` seconds while ``paged_llm.summarize``'s Summarizer runs with its own
    chunking; their time to first token and queue wait are compared. A second summary of
    the same document then takes voice queries that each come after the latency policy's
    hold has lapsed (a home's usual pace), every other one announced ``SATELLITE_LEAD``
    seconds early through ``AsyncEngine.expect_interactive``.
    """
    from custom_components.paged_llm.backend import Sampling
    from custom_components.paged_llm.embedded import EmbeddedBackend
    from custom_components.paged_llm.summarize import Summarizer

    voice = [r for r in workload if r.priority == "interactive"]
    config = engine_config(args, KVLayout.PAGED)
    rng = random.Random(args.seed)
    document = ". ".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize()
        for _ in range(words // 14)
    )

    def figures(asked: list[_Asked], idle: list[_Asked], label: str) -> dict[str, Any]:
        """One group of voice queries' figures, each against the idle ones.

        TTFT, whole answer and time per output token (p50, p95, p95 against idle), the
        longest queue wait, and how often voice was preempted.
        """
        out: dict[str, Any] = {f"{label}_queries": len(asked)}
        for name, at in (("ttft", 0), ("e2e", 3), ("tpot", 4)):
            values = [a[at] for a in asked if a[at] is not None]
            p95, base = pct(values, 0.95), pct([a[at] for a in idle if a[at] is not None], 0.95)
            ratio = p95 / base if p95 and base else None
            out |= {f"{label}_{name}_p50": pct(values, 0.5), f"{label}_{name}_p95": p95}
            out[f"{label}_ratio_p95" if name == "ttft" else f"{label}_{name}_ratio_p95"] = ratio
        out[f"{label}_queue_max"] = max((a[1] for a in asked), default=None)
        out[f"{label}_preempted"] = sum(a[2] for a in asked)
        return out

    async def main() -> dict[str, Any]:
        engine = AsyncEngine(config, loaded=loaded)
        await engine.start()
        pool_tokens = engine.info.pool_tokens
        # Every step's figures from here on: the preemptions come from the latest one.
        trace = engine.start_trace()

        def preemptions() -> int:
            """Preemptions so far, as of the last step."""
            return trace[-1].num_preemptions if trace else 0

        doc_tokens = len(loaded.tokenizer.encode(document))
        await _ask(engine, voice[0])  # caches the system prompt
        idle = [await _ask(engine, req) for req in voice[1:9]]
        # The integration's config entry, as far as the Summarizer reads it: the backend.
        entry = SimpleNamespace(
            entry_id="bench", runtime_data=SimpleNamespace(backend=EmbeddedBackend(engine))
        )

        async def summarize_while(
            voices: Callable[[asyncio.Future[Any]], Awaitable[None]],
        ) -> tuple[Summarizer, float, int]:
            """Summarize while ``voices`` asks; returns the summarizer, seconds, preemptions."""
            summarizer = Summarizer(
                _ExecutorHost(),  # type: ignore[arg-type]
                entry,  # type: ignore[arg-type]
                Sampling(max_tokens=64, temperature=0.0),
            )
            began = time.monotonic()
            before = preemptions()
            summary = asyncio.ensure_future(summarizer.async_summarize(document))
            await voices(summary)
            await summary
            preempted = preemptions() - before
            return summarizer, time.monotonic() - began, preempted

        busy: list[_Asked] = []
        quiet: dict[bool, list[_Asked]] = {False: [], True: []}

        async def conversation(summary: asyncio.Future[Any]) -> None:
            for req in itertools.cycle(voice):
                if summary.done():
                    return
                await asyncio.sleep(VOICE_GAP)
                busy.append(await _ask(engine, req))

        async def after_quiet(summary: asyncio.Future[Any]) -> None:
            for i, req in enumerate(itertools.cycle(voice)):
                announced = i % 2 == 1
                lead = SATELLITE_LEAD if announced else 0.0
                await asyncio.sleep(args.hold_seconds + QUIET_MARGIN - lead)
                if announced:
                    engine.expect_interactive()
                    await asyncio.sleep(lead)
                if summary.done():
                    return
                quiet[announced].append(await _ask(engine, req))

        summarizer, took, summary_preemptions = await summarize_while(conversation)
        _, quiet_took, _ = await summarize_while(after_quiet)
        await engine.stop()
        return {
            "policy": str(config.step_policy),
            "pool_tokens": pool_tokens,
            "document_tokens": doc_tokens,
            "parts": summarizer.chunks,
            "requests": summarizer.requests,
            "summary_s": took,
            **figures(idle, idle, "idle"),
            **figures(busy, idle, "busy"),
            "preemptions": summary_preemptions,
            "quiet_summary_s": quiet_took,
            "hold_s": args.hold_seconds,
            "satellite_lead_s": SATELLITE_LEAD,
            **figures(quiet[False], idle, "unannounced"),
            **figures(quiet[True], idle, "announced"),
        }

    return asyncio.run(main())
